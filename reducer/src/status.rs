//! The ranking summary in the `TopKMetric` status: the top few of each window's global list,
//! its `asOf` and watermark, the leader and the watermark lag, so that `kubectl get tkm`
//! shows who leads, and the newest grade of the streaming path. Written with server-side apply under the reducer's own field manager, so
//! the operator's fields are never touched (nor touch these).

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use topk_api::manifest::GradingStatus;
use topk_api::{RankingRecord, TopKMetric};
use topk_engine::event::{format_rfc3339_ms, parse_rfc3339_ms};

use crate::error::Error;
use crate::exact::Grade;

/// Field manager of the reducer's status fields.
pub const STATUS_MANAGER: &str = "topk-reducer";
/// Items per window in the status; the full lists are in the query API.
pub const STATUS_ITEMS: usize = 5;

/// The status fields for the global (`""` scope) lists, in window order, and the newest
/// grade. `None` before any list exists. Pure: `now_ms` is the clock.
pub fn status_fields(
    lists: &[&RankingRecord],
    grade: Option<&Grade>,
    now_ms: i64,
) -> Option<Value> {
    let global: Vec<&RankingRecord> = lists
        .iter()
        .copied()
        .filter(|r| r.scope.is_empty())
        .collect();
    let first = global.first()?;
    let rankings: Vec<Value> = global
        .iter()
        .map(|r| {
            let mut summary = json!({
                "window": r.window,
                "asOf": r.as_of,
                "watermark": r.watermark,
                "exactUntil": r.exact_until,
                "items": r.items.iter().take(STATUS_ITEMS).map(|i| json!({
                    "rank": i.rank, "key": i.key, "count": i.count,
                })).collect::<Vec<_>>(),
            });
            if let Some(coverage) = r.regions.as_ref().filter(|c| !c.complete()) {
                summary["missingRegions"] = json!(coverage.missing_regions);
            }
            summary
        })
        .collect();
    let lag = parse_rfc3339_ms(&first.watermark).map(|wm| {
        topk_api::Duration::from_millis(now_ms.saturating_sub(wm).max(0) / 1000 * 1000).to_string()
    });
    let grading = grade.map(|g| GradingStatus {
        hour: format_rfc3339_ms(g.hour_ms),
        recall_at_k: g.recall_at_k,
        max_overcount: g.max_overcount,
        overcount_bound: g.overcount_bound,
        max_rank_displacement: g.max_rank_displacement,
    });
    Some(json!({
        "rankings": rankings,
        "leader": first.items.first().map(|i| i.key.clone()),
        "watermarkLag": lag,
        "grading": grading,
    }))
}

/// Applies `fields` to the status of TopKMetric `name`.
pub async fn write(
    client: &Client,
    namespace: &str,
    name: &str,
    fields: Value,
) -> Result<(), Error> {
    let api: Api<TopKMetric> = Api::namespaced(client.clone(), namespace);
    let patch = json!({
        "apiVersion": "topk.io/v1alpha1",
        "kind": "TopKMetric",
        "metadata": {"name": name},
        "status": fields,
    });
    api.patch_status(
        name,
        &PatchParams::apply(STATUS_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// How often the status is written at most.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(5);
