//! The observed state, written by the operator and the reducers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state, written by the operator and the reducer.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopKMetricStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkersStatus>,
    /// Version of the shard assignment table in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment_version: Option<u64>,
    /// End of the last contiguous exactly recounted hour (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_until: Option<String>,
    /// Top key of the first window's global list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// How far the first window's watermark trails the wall clock, e.g. `4s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_lag: Option<String>,
    /// A bounded summary of the global lists (top few per window), never the full lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rankings: Vec<RankingSummary>,
    /// Progress of the hourly recount beyond `exactUntil`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recount: Option<RecountStatus>,
    /// The newest recounted hour's streaming 1h list graded against its exact counts
    /// (written by the reducer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grading: Option<GradingStatus>,
    /// The rescale step in progress and when it began, recorded before it acts so that a
    /// restarted operator keeps its deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale: Option<RescaleStatus>,
    /// The newest `topk.io/rollback` request the first reducer replica handled, and what
    /// became of it (written by the reducer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback: Option<crate::rollback::RollbackStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecountStatus {
    /// Start of the contiguous run of recounted hours that ends at `exactUntil` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_from: Option<String>,
    /// Recount Jobs running now.
    #[serde(default)]
    pub running: u32,
    /// Hours after `exactUntil` already recounted, waiting for an earlier hour (RFC 3339).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub succeeded: Vec<String>,
    /// Hours whose recount failed and is retried with backoff.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<RecountFailure>,
    /// What the newest finished recount reported (its Job's termination message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recount: Option<crate::record::ExactHourManifest>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecountFailure {
    /// Start of the hour (RFC 3339).
    pub hour: String,
    /// Failed Jobs for this hour so far.
    pub attempts: u32,
    /// When the last attempt failed (RFC 3339).
    pub last_failure: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GradingStatus {
    /// Start of the graded hour (RFC 3339).
    pub hour: String,
    /// Share of the exact top k the streaming top k held (lowest over scopes).
    pub recall_at_k: f64,
    /// Largest amount a streaming count exceeded its exact count by.
    pub max_overcount: u64,
    /// The over-count bound the streaming list claimed.
    pub overcount_bound: u64,
    /// Largest difference between a key's streaming and exact rank in the top k.
    pub max_rank_displacement: u32,
}

impl GradingStatus {
    /// Why the graded hour makes the metric Degraded under `min_recall`, if it does.
    pub fn problem(&self, min_recall: f64) -> Option<String> {
        let mut problems = Vec::new();
        if self.max_overcount > self.overcount_bound {
            problems.push(format!(
                "a count exceeded its exact value by {}, beyond the claimed bound {}",
                self.max_overcount, self.overcount_bound
            ));
        }
        if self.recall_at_k < min_recall {
            problems.push(format!(
                "recall@k {:.3} is below minRecall {min_recall}",
                self.recall_at_k
            ));
        }
        (!problems.is_empty()).then(|| {
            format!(
                "the streaming 1h list of hour {}: {}",
                self.hour,
                problems.join(" and ")
            )
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RescaleStatus {
    /// `WaitingForWorkers` or `Draining`.
    pub phase: String,
    /// Worker replicas the step leads to.
    pub target_workers: u32,
    /// When the step began (RFC 3339).
    pub since: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkersStatus {
    pub replicas: i32,
    pub ready: i32,
    /// Label selector of the worker pods (for the scale subresource).
    pub selector: String,
    /// `ready/desired`, for the printer column.
    pub summary: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RankingSummary {
    pub window: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<String>,
    /// Event time up to which the list's counts are exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_until: Option<String>,
    /// A global metric's list: the regions it had to leave out (their lists of its window end
    /// did not arrive in time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_regions: Vec<String>,
    pub items: Vec<RankingSummaryItem>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RankingSummaryItem {
    pub rank: u32,
    pub key: String,
    pub count: u64,
}
