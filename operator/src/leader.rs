//! Leader election over a coordination.k8s.io Lease, so that several operator replicas can run
//! and only one acts. The lease only elects the operator; shard ownership is fenced by epochs
//! in the assignment table, never by this lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::error::Error;

/// What to do with the lease, decided from what it says now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No lease yet: create it as holder.
    Create,
    /// We hold it: renew.
    Renew,
    /// Its holder stopped renewing: take it over.
    TakeOver,
    /// Someone else holds a live lease.
    Follow,
}

/// Pure: the decision for `identity` at `now` given the lease's current spec.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::Create;
    };
    if spec.holder_identity.as_deref() == Some(identity) {
        return Decision::Renew;
    }
    let expires = spec.renew_time.as_ref().map(|t| {
        let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
        t.0 + k8s_openapi::jiff::SignedDuration::from_secs(secs)
    });
    match expires {
        Some(at) if at > now && spec.holder_identity.is_some() => Decision::Follow,
        _ => Decision::TakeOver,
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One election round: true when this replica holds the lease afterwards. Conflicting
    /// writes (another replica was faster) count as not holding it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let decision = decide(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.identity,
            now,
        );
        let transitions = current
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.lease_transitions)
            .unwrap_or(0);
        let acquired = current
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.acquire_time.clone())
            .filter(|_| decision == Decision::Renew);
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if decision == Decision::TakeOver {
                transitions + 1
            } else {
                transitions
            }),
            ..LeaseSpec::default()
        };
        let result = match (decision, current) {
            (Decision::Follow, _) => return Ok(false),
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            (_, Some(mut lease)) => {
                // `replace` carries the resourceVersion read above: a concurrent change fails it.
                lease.spec = Some(spec);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            (_, None) => return Ok(false),
        };
        match result {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(err) => Err(err.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: Timestamp, secs: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            renew_time: Some(MicroTime(renewed)),
            lease_duration_seconds: Some(secs),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::from_second(1_000).unwrap();
        let earlier = Timestamp::from_second(990).unwrap();
        assert_eq!(decide(None, "a", now), Decision::Create);
        assert_eq!(
            decide(Some(&spec("a", earlier, 15)), "a", now),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec("b", earlier, 15)), "a", now),
            Decision::Follow
        );
        assert_eq!(
            decide(Some(&spec("b", earlier, 5)), "a", now),
            Decision::TakeOver
        );
        assert_eq!(
            decide(Some(&LeaseSpec::default()), "a", now),
            Decision::TakeOver
        );
    }
}
