//! Rollback requests from the `topk.io/rollback` annotation of the reducer's TopKMetric
//! (see `topk_api::rollback`). Replica 0 acts on a request once: the handled request is
//! recorded in its ranking store with the pointer it moved, which the other replicas take from
//! the ranking log (see [`crate::log`]). It reports the result in `status.lastRollback` and as
//! an Event.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use topk_api::TopKMetric;
use topk_api::rollback::{ROLLBACK_ANNOTATION, RollbackRequest, RollbackResult, RollbackStatus};
use topk_engine::event::format_rfc3339_ms;

use crate::error::Error;
use crate::reducer::{Shared, now_ms};

/// Field manager of `status.lastRollback`: not the ranking summary's, whose applies would
/// otherwise remove it.
pub const ROLLBACK_MANAGER: &str = "topk-reducer-rollback";

/// Acts on the request in `text` unless this store handled it already. Returns what became
/// of it, or `None` when it was handled before (a restart, or another change of the object).
pub fn handle(shared: &Shared, text: &str, now_ms: i64) -> Result<Option<RollbackStatus>, Error> {
    if shared.store.handled_rollback()?.as_deref() == Some(text) {
        return Ok(None);
    }
    let handled_at = format_rfc3339_ms(now_ms);
    let (result, message) = match RollbackRequest::judge(text, shared.served.windows(), now_ms) {
        Err(refusal) => {
            shared.store.mark_rollback_handled(text)?;
            refusal
        }
        Ok(request) => {
            let (window, scope, version) = (&request.window, &request.scope, request.version);
            // The followers take the move from the ranking log, before this replica makes it.
            let roll = |_| shared.store.rollback(window, scope, version, text);
            let rolled = match shared.log.get() {
                Some(log) if shared.store.get(window, scope, version)?.is_some() => {
                    log.append_then(&[shared.store.pointer_change(window, scope, version)], roll)
                }
                _ => roll(0),
            };
            match rolled {
                Ok(record) => {
                    shared.served.put([record]);
                    let message = format!(
                        "the {window} list of scope {scope:?} points at version {version} until its next publication"
                    );
                    (RollbackResult::Applied, message)
                }
                Err(err @ Error::NoSuchVersion { .. }) => {
                    shared.store.mark_rollback_handled(text)?;
                    (RollbackResult::NoSuchVersion, err.to_string())
                }
                Err(err) => return Err(err),
            }
        }
    };
    shared.metrics.rollback(result);
    if result == RollbackResult::Applied {
        tracing::warn!(message, "list rolled back");
    } else {
        tracing::warn!(result = result.as_str(), message, "rollback refused");
    }
    Ok(Some(RollbackStatus::new(text, result, message, handled_at)))
}

/// Where a reducer reads rollback requests, and whether it reports them.
pub struct RollbackTarget {
    pub client: Client,
    pub namespace: String,
    pub name: String,
    /// Write `status.lastRollback` and an Event (one replica does).
    pub report: bool,
}

/// Watches the TopKMetric and handles each new rollback request, until the process stops.
pub async fn watch_requests(shared: Arc<Shared>, target: RollbackTarget) {
    let api: Api<TopKMetric> = Api::namespaced(target.client.clone(), &target.namespace);
    let recorder = Recorder::new(
        target.client.clone(),
        Reporter {
            controller: "topk-reducer".to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let config = watcher::Config::default().fields(&format!("metadata.name={}", target.name));
    let mut events = watcher::watcher(api.clone(), config).boxed();
    while let Some(event) = events.next().await {
        let metric = match event {
            Ok(watcher::Event::Apply(metric) | watcher::Event::InitApply(metric)) => metric,
            Ok(_) => continue,
            Err(err) => {
                tracing::warn!(%err, "TopKMetric watch interrupted; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(text) = metric.annotations().get(ROLLBACK_ANNOTATION) else {
            continue;
        };
        match handle(&shared, text, now_ms()) {
            Ok(Some(status)) if target.report => report(&api, &recorder, &metric, status).await,
            Ok(_) => {}
            // The store could not record it; the next change of the object tries again.
            Err(err) => tracing::error!(%err, "cannot act on the rollback request"),
        }
    }
}

async fn report(
    api: &Api<TopKMetric>,
    recorder: &Recorder,
    metric: &TopKMetric,
    status: RollbackStatus,
) {
    let applied = status.result == RollbackResult::Applied;
    let event = Event {
        type_: if applied {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: if applied {
            "RolledBack"
        } else {
            "RollbackRefused"
        }
        .to_owned(),
        note: Some(status.message.clone()),
        action: "Rollback".to_owned(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&event, &metric.object_ref(&())).await {
        tracing::warn!(%err, "cannot publish the rollback event");
    }
    let patch = json!({
        "apiVersion": "topk.io/v1alpha1",
        "kind": "TopKMetric",
        "metadata": {"name": metric.name_any()},
        "status": {"lastRollback": status},
    });
    let params = PatchParams::apply(ROLLBACK_MANAGER).force();
    if let Err(err) = api
        .patch_status(&metric.name_any(), &params, &Patch::Apply(&patch))
        .await
    {
        tracing::warn!(%err, "cannot write status.lastRollback");
    }
}
