//! The shard assignment table: which worker ordinal owns each logical shard, under which epoch.
//! The operator writes it (in the assignment ConfigMap, with a resourceVersion precondition);
//! workers and reducers read it. Epochs fence stale owners: a shard's epoch increases with
//! every move and never decreases.

pub mod planner;

use serde::{Deserialize, Serialize};

/// ConfigMap data key holding the table as JSON.
pub const ASSIGNMENT_KEY: &str = "assignment.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardOwner {
    pub shard: u32,
    pub worker: u32,
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignmentTable {
    /// Increases with every change of the table.
    pub version: u64,
    /// One entry per shard, ordered by shard.
    pub shards: Vec<ShardOwner>,
}

impl AssignmentTable {
    pub fn owner(&self, shard: u32) -> Option<&ShardOwner> {
        self.shards.get(shard as usize).filter(|o| o.shard == shard)
    }

    /// Shards owned by `worker`.
    pub fn shards_of(&self, worker: u32) -> Vec<u32> {
        self.shards
            .iter()
            .filter(|o| o.worker == worker)
            .map(|o| o.shard)
            .collect()
    }
}
