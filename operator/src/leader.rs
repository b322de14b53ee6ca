//! Leader election over a coordination.k8s.io Lease, so that several operator replicas can run
//! and only one acts. The lease only elects the operator; shard ownership is fenced by epochs
//! in the assignment table, never by this lease.

use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// The lease record as last seen: who holds it and when they last renewed it, as they wrote it.
/// Another replica's clock is never compared with ours; only whether this record changes.
type Record = (Option<String>, Option<MicroTime>);

fn record(spec: &LeaseSpec) -> Record {
    (spec.holder_identity.clone(), spec.renew_time.clone())
}

/// Pure: the decision for `identity` given the lease's current spec and how long this replica
/// has seen that same record unchanged (on its own monotonic clock). A holder's renewals
/// change the record; a lease is expired when it stayed unchanged for its whole duration,
/// whatever the clocks of the replicas say. A released lease (no holder) is free at once.
pub fn next_step(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Decision {
    let Some(spec) = spec else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
    if holder == Some(identity) {
        return Decision::Renew;
    }
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(0) as u64);
    if holder.is_some() && unchanged_for < duration {
        Decision::Follow
    } else {
        Decision::TakeOver
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// The record last seen and when it was first seen so.
    seen: Mutex<Option<(Record, Instant)>>,
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
            seen: Mutex::new(None),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// How long a leader may go without a successful renewal before it stops acting: two
    /// thirds of the lease, so that it has stopped before any follower can take over.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// How long the record in `spec` has been seen unchanged by this replica.
    fn unchanged_for(&self, spec: Option<&LeaseSpec>) -> Duration {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let current = spec.map(record);
        match (&*seen, current) {
            (Some((last, since)), Some(current)) if *last == current => now - *since,
            (_, Some(current)) => {
                *seen = Some((current, now));
                Duration::ZERO
            }
            (_, None) => {
                *seen = None;
                Duration::ZERO
            }
        }
    }

    /// One election round: true when this replica holds the lease afterwards. Conflicting
    /// writes (another replica was faster) count as not holding it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let decision = next_step(spec, &self.identity, self.unchanged_for(spec));
        let transitions = spec.and_then(|s| s.lease_transitions).unwrap_or(0);
        let acquired = spec
            .and_then(|s| s.acquire_time.clone())
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

    /// Gives the lease up if this replica holds it, so that a follower takes over at its next
    /// round instead of after the lease expires (a rollout replaces the leader this way).
    pub async fn release(&self) -> Result<(), Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            // Someone else wrote it since: it is not ours to release any more.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            other => other.map(|_| ()).map_err(Error::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed: Timestamp, secs: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: Some(MicroTime(renewed)),
            lease_duration_seconds: Some(secs),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decisions_depend_on_how_long_the_record_stood_still_not_on_its_clock() {
        let secs = Duration::from_secs;
        // A holder whose clock runs an hour ahead, or a day behind, of ours.
        let ahead = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(1);
        let behind = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(24);
        assert_eq!(next_step(None, "a", secs(0)), Decision::Create);
        for renewed in [ahead, behind] {
            let held = spec(Some("b"), renewed, 15);
            assert_eq!(next_step(Some(&held), "a", secs(0)), Decision::Follow);
            assert_eq!(next_step(Some(&held), "a", secs(14)), Decision::Follow);
            assert_eq!(next_step(Some(&held), "a", secs(15)), Decision::TakeOver);
            let ours = spec(Some("a"), renewed, 15);
            assert_eq!(next_step(Some(&ours), "a", secs(60)), Decision::Renew);
            // Released: free at once.
            for holder in [None, Some("")] {
                let released = spec(holder, renewed, 15);
                assert_eq!(next_step(Some(&released), "a", secs(0)), Decision::TakeOver);
            }
        }
        assert_eq!(
            next_step(Some(&LeaseSpec::default()), "a", secs(0)),
            Decision::TakeOver
        );
    }
}
