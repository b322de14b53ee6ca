//! The spec checked and turned into the engine's configuration: the same checks for the
//! apiserver's objects (through the operator) and `topk run`'s files.

use topk_engine::config::{HEAD_SUFFIX, HOUR_MS};
use topk_engine::dedupe::DedupeConfig;
use topk_engine::trend::TrendingConfig;
use topk_engine::{EngineConfig, Mode, SketchParams, WindowConfig};

use crate::duration::Duration;
use crate::error::ApiError;
use crate::record::{MIN_SUMMARY_RECORD_BYTES, summary_item_fits};

use super::*;

impl TopKMetricSpec {
    /// What a global metric may not have: everything that counts events itself.
    fn global_problems(&self, regions: &RegionsSpec) -> Vec<String> {
        let mut problems = Vec::new();
        let counting = [
            ("shards", self.shards.is_some()),
            ("workers", self.workers.is_some()),
            ("combiners", self.combiners.is_some()),
            ("ingest", self.ingest.is_some()),
            ("dedupe", self.dedupe.is_some()),
            ("trending", self.trending.is_some()),
            ("recount", self.recount.is_some()),
            ("region", self.region.is_some()),
        ];
        let present: Vec<&str> = counting
            .iter()
            .filter(|(_, set)| *set)
            .map(|(field, _)| *field)
            .collect();
        if !present.is_empty() {
            problems.push(format!(
                "a global metric (spec.regions) counts no events itself: remove spec.{}",
                present.join(", spec.")
            ));
        }
        if let Some(w) = self.windows.iter().find(|w| w.refresh.is_some()) {
            problems.push(format!(
                "spec.windows ({:?}): a global metric's windows have no refresh (its regions' lists are merged as they come); remove refresh",
                w.name
            ));
        }
        if self.internal_kafka.is_none() {
            problems.push("a global metric (spec.regions) needs spec.internalKafka: the cluster its regions send their lists to".to_owned());
        }
        if regions.names.is_empty() || regions.names.len() > MAX_REGIONS {
            problems.push(format!(
                "spec.regions.names must list between 1 and {MAX_REGIONS} regions, got {}",
                regions.names.len()
            ));
        }
        for (i, name) in regions.names.iter().enumerate() {
            if name.trim().is_empty() || name.len() > 63 {
                problems.push(format!(
                    "spec.regions.names[{i}] must be 1 to 63 bytes, got {:?}",
                    name
                ));
            }
            if regions.names[..i].contains(name) {
                problems.push(format!(
                    "spec.regions.names[{i}] ({name:?}) is listed twice"
                ));
            }
        }
        if regions.wait.is_some_and(|w| w.as_millis() <= 0) {
            problems.push("spec.regions.wait must be positive".to_owned());
        }
        problems
    }

    /// What is wrong with `refresh` on window `w`, if anything.
    fn refresh_problem(&self, w: &WindowSpec, refresh: Duration) -> Option<String> {
        let bucket = if w.all_time {
            w.bucket.unwrap_or(DEFAULT_ALL_TIME_PUBLISH)
        } else {
            w.bucket?
        };
        let (refresh_ms, bucket_ms) = (refresh.as_millis(), bucket.as_millis());
        if bucket_ms <= 0 || bucket_ms % HOUR_MS != 0 {
            return Some(format!(
                "refresh needs a bucket of whole hours (the window is made of clock hours), got {bucket}"
            ));
        }
        if refresh_ms <= 0 || refresh_ms >= bucket_ms || bucket_ms % refresh_ms != 0 {
            return Some(format!(
                "refresh {refresh} must be shorter than the bucket {bucket} and divide it, e.g. 1m"
            ));
        }
        if !self.recount_settings().enabled {
            return Some(
                "refresh composes recounted hours with the open one; enable recount or remove refresh"
                    .to_owned(),
            );
        }
        None
    }

    /// Validates the spec and turns it into the engine's configuration. Every problem found is
    /// reported at once, each naming the field and what to change.
    pub fn engine_config(&self) -> Result<EngineConfig, ApiError> {
        let mut problems = Vec::new();
        if self.metric.trim().is_empty() {
            problems.push("spec.metric must not be empty".to_owned());
        }
        match (&self.source, &self.regions) {
            (Some(source), None) => {
                if source.kafka.topic.trim().is_empty() {
                    problems.push("spec.source.kafka.topic must not be empty".to_owned());
                }
                if self.shards.is_none() {
                    problems.push(
                        "spec.shards is required: the partitions of the input topic".to_owned(),
                    );
                }
                problems.extend(source.kafka.security().problems("spec.source.kafka"));
            }
            (None, Some(regions)) => problems.extend(self.global_problems(regions)),
            _ => problems.push(
                "set exactly one of spec.source (a metric that counts events) and spec.regions (a global metric that adds up regional metrics' lists)".to_owned(),
            ),
        }
        let mut bounded = |field: &str, value: u64, min: u64, max: u64| {
            if !(min..=max).contains(&value) {
                problems.push(format!(
                    "spec.{field} must be between {min} and {max}, got {value}"
                ));
            }
        };
        bounded("shards", self.shards().into(), 1, MAX_SHARDS.into());
        bounded("k", self.k.into(), 1, MAX_K.into());
        if let Some(bytes) = self.max_key_bytes {
            bounded("maxKeyBytes", bytes.into(), 1, MAX_KEY_BYTES.into());
        }
        if let Some(bytes) = self.max_scope_bytes {
            bounded("maxScopeBytes", bytes.into(), 1, MAX_SCOPE_BYTES.into());
        }
        if let Some(scopes) = self.max_scopes {
            bounded("maxScopes", scopes.into(), 1, MAX_SCOPES.into());
        }
        if let Some(candidates) = self.sketch.as_ref().and_then(|s| s.candidates) {
            bounded(
                "sketch.candidates",
                candidates.into(),
                1,
                MAX_CANDIDATES.into(),
            );
        }
        if let Some(reducers) = &self.reducers {
            bounded(
                "reducers.replicas",
                reducers.replicas.into(),
                1,
                MAX_REDUCERS.into(),
            );
        }
        if let Some(workers) = &self.workers {
            bounded(
                "workers.replicas",
                workers.replicas.into(),
                1,
                self.shards().max(1).into(),
            );
            if let Some(bytes) = workers.max_summary_record_bytes {
                bounded(
                    "workers.maxSummaryRecordBytes",
                    bytes.into(),
                    MIN_SUMMARY_RECORD_BYTES.into(),
                    MAX_SUMMARY_RECORD_BYTES.into(),
                );
            }
        }
        if let Some(concurrent) = self.recount.as_ref().and_then(|r| r.max_concurrent) {
            bounded(
                "recount.maxConcurrent",
                concurrent.into(),
                1,
                MAX_RECOUNT_CONCURRENCY.into(),
            );
        }
        if self.metric.len() > MAX_METRIC_NAME {
            problems.push(format!(
                "spec.metric must be at most {MAX_METRIC_NAME} bytes, got {}",
                self.metric.len()
            ));
        }
        if self.windows.len() > MAX_WINDOWS {
            problems.push(format!(
                "spec.windows may hold at most {MAX_WINDOWS} windows, got {}",
                self.windows.len()
            ));
        }
        if self.deny_keys.len() > MAX_DENY_KEYS {
            problems.push(format!(
                "spec.denyKeys may hold at most {MAX_DENY_KEYS} keys, got {}; use denyKeysFrom for longer lists",
                self.deny_keys.len()
            ));
        }
        let (key_bytes, scope_bytes) = (self.max_key_bytes(), self.max_scope_bytes());
        if !summary_item_fits(key_bytes, scope_bytes, self.max_summary_record_bytes()) {
            problems.push(format!(
                "spec.workers.maxSummaryRecordBytes ({}) is too small for a key of maxKeyBytes ({key_bytes}) in a scope of maxScopeBytes ({scope_bytes}); raise it or lower those",
                self.max_summary_record_bytes()
            ));
        }
        let mode = match (self.mode, &self.sketch) {
            (ModeName::Exact, Some(_)) => {
                problems.push("spec.sketch is only allowed with mode: approximate; remove it or set mode: approximate".to_owned());
                Mode::Exact
            }
            (ModeName::Exact, None) => Mode::Exact,
            (ModeName::Approximate, sketch) => {
                let epsilon = sketch
                    .as_ref()
                    .and_then(|s| s.epsilon)
                    .unwrap_or(DEFAULT_EPSILON);
                let delta = sketch
                    .as_ref()
                    .and_then(|s| s.delta)
                    .unwrap_or(DEFAULT_DELTA);
                let candidates = sketch
                    .as_ref()
                    .and_then(|s| s.candidates)
                    .unwrap_or(DEFAULT_CANDIDATES.max(self.k));
                if !(epsilon > 0.0 && epsilon < 1.0) {
                    problems.push(format!(
                        "spec.sketch.epsilon must be in (0, 1), got {epsilon}"
                    ));
                }
                if !(delta > 0.0 && delta < 1.0) {
                    problems.push(format!("spec.sketch.delta must be in (0, 1), got {delta}"));
                }
                if candidates < self.k {
                    problems.push(format!(
                        "spec.sketch.candidates ({candidates}) must be at least k ({}); raise candidates or lower k",
                        self.k
                    ));
                }
                Mode::Approximate(SketchParams {
                    epsilon,
                    delta,
                    candidates: candidates as usize,
                })
            }
        };
        let lateness = self.allowed_lateness.unwrap_or(DEFAULT_LATENESS);
        let recount = self.recount_settings();
        if recount.grace_ms < lateness.as_millis() {
            problems.push(format!(
                "spec.recount.grace ({}) must be at least allowedLateness ({lateness}), or the recount misses late events that the streaming path counts",
                Duration::from_millis(recount.grace_ms)
            ));
        }
        let min_recall = self.min_recall();
        if !(0.0..=1.0).contains(&min_recall) {
            problems.push(format!(
                "spec.recount.minRecall must be between 0 and 1, got {min_recall}"
            ));
        }
        if recount.max_in_memory < 1_000 {
            problems.push(format!(
                "spec.recount.maxInMemory must be at least 1000, got {}",
                recount.max_in_memory
            ));
        }
        if recount.backfill_ms < 3_600_000 {
            problems.push("spec.recount.backfill must be at least 1h".to_owned());
        }
        if self.combiners.is_some() && self.source.is_some() && !self.combines() {
            problems.push("spec.combiners only run for spec.source.partitionedBy: any; remove combiners or set partitionedBy: any".to_owned());
        }
        let flush = self.combiners.as_ref().and_then(|c| c.flush_interval);
        if flush.is_some_and(|f| f.as_millis() <= 0 || f.as_millis() > MAX_FLUSH_INTERVAL_MS) {
            problems
                .push("spec.combiners.flushInterval must be positive and at most 1m".to_owned());
        }
        if let Some(workers) = &self.workers {
            let timing = [
                ("checkpointInterval", workers.checkpoint_interval),
                ("snapshotInterval", workers.snapshot_interval),
                ("idleTimeout", workers.idle_timeout),
                ("handoffWait", workers.handoff_wait),
            ];
            for (field, value) in timing {
                if value.is_some_and(|v| v.as_millis() <= 0) {
                    problems.push(format!("spec.workers.{field} must be positive"));
                }
            }
        }
        if let Some(reducers) = &self.reducers {
            for (field, value) in [
                ("keepFor", reducers.keep_for),
                ("staleAfter", reducers.stale_after),
            ] {
                if value.is_some_and(|v| v.as_millis() <= 0) {
                    problems.push(format!("spec.reducers.{field} must be positive"));
                }
            }
            if let Some(keep) = reducers.keep_versions
                && !(1..=MAX_KEEP_VERSIONS).contains(&keep)
            {
                problems.push(format!(
                    "spec.reducers.keepVersions must be between 1 and {MAX_KEEP_VERSIONS}, got {keep}"
                ));
            }
        }
        if let Some(from) = &self.deny_keys_from {
            let r = &from.config_map_key_ref;
            if r.name.trim().is_empty() || r.key.trim().is_empty() {
                problems
                    .push("spec.denyKeysFrom.configMapKeyRef needs both name and key".to_owned());
            }
        }
        if let Some(internal) = &self.internal_kafka {
            if internal.bootstrap_servers.trim().is_empty() {
                problems.push("spec.internalKafka.bootstrapServers must not be empty".to_owned());
            }
            problems.extend(internal.security().problems("spec.internalKafka"));
        }
        if let Some(region) = &self.region {
            if region.name.trim().is_empty() {
                problems.push("spec.region.name must not be empty".to_owned());
            }
            if region.global.name.trim().is_empty() {
                problems.push("spec.region.global.name must not be empty".to_owned());
            }
            if let Some(kafka) = &region.global.kafka {
                if kafka.bootstrap_servers.trim().is_empty() {
                    problems.push(
                        "spec.region.global.kafka.bootstrapServers must not be empty".to_owned(),
                    );
                }
                problems.extend(kafka.security().problems("spec.region.global.kafka"));
            }
        }
        if self.windows.is_empty() {
            problems.push("spec.windows needs at least one window".to_owned());
        }
        let mut windows = Vec::new();
        let mut heads = Vec::new();
        for (i, w) in self.windows.iter().enumerate() {
            let at = format!("spec.windows[{i}] ({:?})", w.name);
            if w.name.is_empty() {
                problems.push(format!("spec.windows[{i}].name must not be empty"));
            }
            if w.name.ends_with(HEAD_SUFFIX) {
                problems.push(format!(
                    "{at}: names ending in {HEAD_SUFFIX:?} are reserved for refreshed windows' heads"
                ));
            }
            if let Some(refresh) = w.refresh {
                match self.refresh_problem(w, refresh) {
                    Some(problem) => problems.push(format!("{at}: {problem}")),
                    None => heads.push((w.name.clone(), refresh.as_millis())),
                }
            }
            if w.name.len() > MAX_WINDOW_NAME {
                problems.push(format!(
                    "{at}: name must be at most {MAX_WINDOW_NAME} bytes"
                ));
            }
            if self.windows[..i].iter().any(|o| o.name == w.name) {
                problems.push(format!("{at}: window names must be unique"));
            }
            if w.all_time {
                if w.length.is_some() {
                    problems.push(format!(
                        "{at}: an allTime window has no length; remove length"
                    ));
                }
                let every = w.bucket.unwrap_or(DEFAULT_ALL_TIME_PUBLISH);
                if every.as_millis() <= 0 {
                    problems.push(format!("{at}: bucket must be positive"));
                }
                windows.push(WindowConfig::all_time(&w.name, every.as_millis()));
                continue;
            }
            let (Some(length), Some(bucket)) = (w.length, w.bucket) else {
                problems.push(format!(
                    "{at}: a sliding window needs both length and bucket (or set allTime: true)"
                ));
                continue;
            };
            if length.as_millis() <= 0 || bucket.as_millis() <= 0 {
                problems.push(format!("{at}: length and bucket must be positive"));
                continue;
            }
            if length.as_millis() % bucket.as_millis() != 0 {
                problems.push(format!(
                    "{at}: bucket {bucket} must divide length {length} evenly"
                ));
                continue;
            }
            if length.as_millis() / bucket.as_millis() > 10_000 {
                problems.push(format!(
                    "{at}: {length} / {bucket} is over 10000 buckets; use a wider bucket"
                ));
                continue;
            }
            windows.push(WindowConfig::sliding(
                &w.name,
                length.as_millis(),
                bucket.as_millis(),
            ));
        }
        // Heads after every configured window, so those keep their positions.
        for (parent, refresh) in heads {
            if let Some(w) = windows.iter().find(|w| w.name == parent) {
                windows.push(w.head(refresh));
            }
        }
        if !problems.is_empty() {
            return Err(ApiError::Invalid(problems));
        }
        let dedupe = self.dedupe.as_ref().map(|d| DedupeConfig {
            horizon_ms: d.horizon.map_or(0, Duration::as_millis),
            max_ids: d.max_ids_per_shard.unwrap_or(DEFAULT_DEDUPE_IDS_PER_SHARD) as usize,
        });
        if let Some(d) = dedupe {
            if d.horizon_ms > MAX_DEDUPE_HORIZON_MS {
                problems.push(format!(
                    "spec.dedupe.horizon must be at most 1h, got {}",
                    Duration::from_millis(d.horizon_ms)
                ));
            }
            if !(1..=MAX_DEDUPE_IDS_PER_SHARD as usize).contains(&d.max_ids) {
                problems.push(format!(
                    "spec.dedupe.maxIdsPerShard must be between 1 and {MAX_DEDUPE_IDS_PER_SHARD}, got {}",
                    d.max_ids
                ));
            }
            if self.combines() {
                problems.push("spec.dedupe needs source.partitionedBy: key (every retry of an event on its key's shard); with combiners a retry can reach another input partition".to_owned());
            }
        }
        if !problems.is_empty() {
            return Err(ApiError::Invalid(problems));
        }
        let config = EngineConfig {
            metric: self.metric.clone(),
            shards: self.shards(),
            k: self.k as usize,
            mode,
            allowed_lateness_ms: lateness.as_millis(),
            max_future_skew_ms: self
                .max_future_skew
                .unwrap_or(DEFAULT_FUTURE_SKEW)
                .as_millis(),
            max_key_bytes: key_bytes,
            max_scope_bytes: scope_bytes,
            max_scopes: self
                .max_scopes
                .map_or(topk_engine::config::DEFAULT_MAX_SCOPES, |n| n as usize),
            windows,
            dedupe,
            trending: self.trending.as_ref().map(|t| TrendingConfig {
                window: t.window.clone(),
                baseline: t.baseline.clone(),
                min_count: t.min_count.unwrap_or(DEFAULT_TRENDING_MIN_COUNT),
                smoothing: t.smoothing.unwrap_or(DEFAULT_TRENDING_SMOOTHING),
            }),
        };
        config
            .validate()
            .map_err(|e| ApiError::Invalid(vec![e.to_string()]))?;
        Ok(config)
    }
}
