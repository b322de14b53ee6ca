//! What workers report to the operator besides the assignment version they applied: a shard
//! whose counts miss input. Each is a key of the worker-reports ConfigMap, one per shard
//! (`shard-N-loss`), replaced by the shard's next loss whichever worker owns it then.

use serde::{Deserialize, Serialize};

/// The metric stays `Degraded` (reason [`LOSS_REASON`]) this long after a shard's newest loss;
/// the workers' counters are the lasting record.
pub const LOSS_DEGRADED_MS: i64 = 3_600_000;
/// The `Degraded` reason of a recent loss.
pub const LOSS_REASON: &str = "InputLost";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// Retention deleted input before it was read.
    Expired,
    /// The partition ends below the saved offset and the broker gives no topic id to tell a
    /// truncation from a re-created topic: the shard reads on from the partition's end, so
    /// what a re-created partition held there is not counted. (A truncation of a topic whose
    /// id is known misses nothing and is not reported.)
    BeyondEnd,
    /// The input topic has another id than the one the state counted (deleted and created
    /// again, restored from a backup, a mirror): the shard reads it as `source.onNewTopic`
    /// says, or not at all (`refuse`, the default).
    Recreated,
    /// A saved state (checkpoint or handoff snapshot) could not be used: the shard was
    /// counted again from the oldest retained input.
    StateUnusable,
}

/// One loss of a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardLoss {
    pub shard: u32,
    pub kind: LossKind,
    /// Input offsets skipped (0 when unknown or for an unusable state).
    pub offsets_lost: u64,
    /// When the worker found it (Unix ms).
    pub at_ms: i64,
    /// What the worker saw, for the condition's message.
    pub detail: String,
}

impl ShardLoss {
    /// The worker-reports ConfigMap key this loss is written under.
    pub fn key(&self) -> String {
        loss_key(self.shard)
    }

    pub fn message(&self) -> String {
        let what = match self.kind {
            LossKind::Expired => format!(
                "{} offsets of its input expired by retention before they were read",
                self.offsets_lost
            ),
            LossKind::BeyondEnd => {
                "its input partition ends below the saved offset and has no topic id to tell a truncation from a re-created topic; read on from its end"
                    .to_owned()
            }
            LossKind::Recreated => {
                "its input topic has a new id (deleted and created again, restored, or a mirror)"
                    .to_owned()
            }
            LossKind::StateUnusable => {
                "its saved state could not be used; it was counted again from the oldest retained input"
                    .to_owned()
            }
        };
        format!("shard {}: {what} ({})", self.shard, self.detail)
    }

    /// Whether the loss still makes the metric `Degraded` at `now_ms`.
    pub fn recent(&self, now_ms: i64) -> bool {
        now_ms.saturating_sub(self.at_ms) < LOSS_DEGRADED_MS
    }
}

pub fn loss_key(shard: u32) -> String {
    format!("shard-{shard}-loss")
}

/// The losses among a worker-reports ConfigMap's entries (other keys, and values that do not
/// parse, are not losses).
pub fn losses<'a>(data: impl IntoIterator<Item = (&'a String, &'a String)>) -> Vec<ShardLoss> {
    let mut out: Vec<ShardLoss> = data
        .into_iter()
        .filter(|(key, _)| key.starts_with("shard-") && key.ends_with("-loss"))
        .filter_map(|(_, value)| serde_json::from_str(value).ok())
        .collect();
    out.sort_by_key(|l: &ShardLoss| l.shard);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_are_read_back_by_shard_and_age_out() {
        let loss = ShardLoss {
            shard: 3,
            kind: LossKind::Expired,
            offsets_lost: 12,
            at_ms: 1_000,
            detail: "resumed at 40".into(),
        };
        let data = [
            (loss.key(), serde_json::to_string(&loss).unwrap()),
            (
                "worker-0".to_owned(),
                r#"{"assignmentVersion": 2}"#.to_owned(),
            ),
            ("shard-1-loss".to_owned(), "not json".to_owned()),
        ];
        let read = losses(data.iter().map(|(k, v)| (k, v)));
        assert_eq!(read, vec![loss.clone()]);
        assert!(
            loss.message().contains("shard 3: 12 offsets"),
            "{}",
            loss.message()
        );
        assert!(loss.recent(1_000 + LOSS_DEGRADED_MS - 1));
        assert!(!loss.recent(1_000 + LOSS_DEGRADED_MS));
    }
}
