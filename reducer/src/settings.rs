//! What a reducer is told: the merge, its topics and cluster, retention, and a regional or
//! global metric's other side.

use std::path::PathBuf;
use std::time::Duration;

use topk_api::dataplane::RegionInputs;
use topk_api::topics::TopicNames;

use crate::exact::HOUR_MS;
use crate::points::WorkerUrls;
use crate::state::ReducerConfig;

#[derive(Debug, Clone)]
pub struct ReducerSettings {
    /// Name of the TopKMetric object.
    pub name: String,
    pub merge: ReducerConfig,
    /// Bucket width of each window (same order), for the staleness threshold.
    pub bucket_ms: Vec<i64>,
    /// The Kafka cluster and how to connect to it, credentials included.
    pub kafka: topk_api::kafka::KafkaProperties,
    pub topics: TopicNames,
    pub state_dir: PathBuf,
    /// A window's lists are stale when nothing newer was published for this long (or two
    /// buckets, if longer).
    pub stale_after: Duration,
    pub keep_versions: usize,
    pub keep_for: Duration,
    /// How point counts are asked of the workers; `None` refuses them.
    pub point_counts: Option<PointCountSettings>,
    /// A regional metric's: where every list it publishes also goes.
    pub region_output: Option<RegionOutputSettings>,
    /// A global metric's: the regions it merges (their summaries replace the shards').
    pub regions: Option<RegionInputs>,
    /// This replica's ordinal: 0 merges and writes, the others follow its ranking log.
    pub replica: u32,
    /// The metric's reducer replicas: above one, replica 0 keeps the ranking log.
    pub replicas: u32,
    /// The largest record topk writes to its topics (a list in the ranking log included).
    pub max_record_bytes: usize,
}

/// Where a regional reducer sends its lists: the global metric's summaries topic.
#[derive(Debug, Clone)]
pub struct RegionOutputSettings {
    pub region: String,
    pub epoch: u64,
    pub topic: String,
    /// The global metric's cluster, credentials included.
    pub kafka: topk_api::kafka::KafkaProperties,
    /// Largest record sent; longer lists are cut to fit.
    pub record_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct PointCountSettings {
    /// The engine the workers run: which shard owns a key, and the mode.
    pub engine: topk_engine::EngineConfig,
    pub workers: WorkerUrls,
}

impl ReducerSettings {
    /// Whether a window's lists are sums of clock hours (whole hours long, or all-time, and
    /// published on hour boundaries; not the trending list), so that recounted hours can replace their estimates.
    pub fn composable(&self, window: usize) -> bool {
        let whole_hours = |ms: i64| ms > 0 && ms % HOUR_MS == 0;
        let length = self.merge.window_lengths.get(window).copied().flatten();
        // The trending list ranks by a ratio, which hours do not add up to.
        self.merge.trending_list() != Some(window)
            && self.bucket_ms.get(window).is_some_and(|b| whole_hours(*b))
            && length.is_none_or(whole_hours)
    }

    /// How long a window may go without a new list before its lists are stale: `stale_after`,
    /// or two of its buckets if longer.
    pub fn stale_threshold(&self, window: usize) -> Duration {
        let bucket = self.bucket_ms.get(window).copied().unwrap_or(0).max(0) as u64;
        self.stale_after.max(Duration::from_millis(2 * bucket))
    }

    /// Whether this replica follows another's ranking log instead of merging.
    pub fn follows(&self) -> bool {
        self.replica > 0
    }

    /// Whether this replica writes the ranking log.
    pub fn writes_log(&self) -> bool {
        self.replica == 0 && self.replicas > 1
    }

    /// Keys kept per scope of an exact hour as candidates and for grading.
    pub fn tops_size(&self) -> usize {
        (4 * self.merge.k).max(100)
    }
}
