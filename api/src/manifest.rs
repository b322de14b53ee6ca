//! The `TopKMetric` manifest: the same YAML a platform team applies to a cluster.

use serde::{Deserialize, Serialize};
use topk_engine::{EngineConfig, Mode, SketchParams, WindowConfig};

use crate::duration::Duration;
use crate::error::ApiError;

pub const API_VERSION: &str = "topk.io/v1alpha1";
pub const KIND: &str = "TopKMetric";

/// The default manifest compiled into the binary.
pub const DEFAULT_MANIFEST: &str = include_str!("default-metric.yaml");

const DEFAULT_MAX_KEY_BYTES: usize = 1024;
const DEFAULT_LATENESS: Duration = Duration::from_millis(120_000);
const DEFAULT_FUTURE_SKEW: Duration = Duration::from_millis(300_000);
/// All-time lists have no buckets; they are republished at this cadence.
const DEFAULT_ALL_TIME_PUBLISH: Duration = Duration::from_millis(60_000);
const DEFAULT_EPSILON: f64 = 0.0001;
const DEFAULT_DELTA: f64 = 0.01;
const DEFAULT_CANDIDATES: u32 = 1000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopKMetric {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: TopKMetricSpec,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopKMetricSpec {
    /// Events whose `metric` field equals this are counted; others are skipped.
    pub metric: String,
    pub source: Source,
    /// Logical shards: the partitions of the input topic.
    pub shards: u32,
    pub k: u32,
    #[serde(default)]
    pub mode: ModeName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<SketchSpec>,
    /// How far behind the newest event time an event may arrive and still count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_lateness: Option<Duration>,
    /// How far ahead of the wall clock an event time may be before it is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_future_skew: Option<Duration>,
    /// Longest accepted key, in UTF-8 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_key_bytes: Option<u32>,
    pub windows: Vec<WindowSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Source {
    pub kafka: KafkaSource,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSource {
    pub bootstrap_servers: String,
    pub topic: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ModeName {
    #[default]
    Exact,
    Approximate,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SketchSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WindowSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<Duration>,
    /// Bucket width of a sliding window; for an all-time window, its publish interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<Duration>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_time: bool,
}

/// Parses a YAML manifest and checks its header. Call [`TopKMetricSpec::engine_config`] to
/// validate the spec.
pub fn load_manifest(yaml: &str) -> Result<TopKMetric, ApiError> {
    let metric: TopKMetric =
        serde_saphyr::from_str(yaml).map_err(|e| ApiError::Parse(e.to_string()))?;
    let mut problems = Vec::new();
    if metric.api_version != API_VERSION {
        problems.push(format!(
            "apiVersion must be {API_VERSION}, got {:?}",
            metric.api_version
        ));
    }
    if metric.kind != KIND {
        problems.push(format!("kind must be {KIND}, got {:?}", metric.kind));
    }
    if metric.metadata.name.is_empty() {
        problems.push("metadata.name must not be empty".into());
    }
    if !problems.is_empty() {
        return Err(ApiError::Invalid(problems));
    }
    Ok(metric)
}

impl TopKMetricSpec {
    /// Validates the spec and turns it into the engine's configuration. Every problem found is
    /// reported at once, each naming the field and what to change.
    pub fn engine_config(&self) -> Result<EngineConfig, ApiError> {
        let mut problems = Vec::new();
        if self.metric.trim().is_empty() {
            problems.push("spec.metric must not be empty".to_owned());
        }
        if self.source.kafka.topic.trim().is_empty() {
            problems.push("spec.source.kafka.topic must not be empty".to_owned());
        }
        if self.shards == 0 {
            problems.push("spec.shards must be at least 1".to_owned());
        }
        if self.k == 0 {
            problems.push("spec.k must be at least 1".to_owned());
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
        if self.windows.is_empty() {
            problems.push("spec.windows needs at least one window".to_owned());
        }
        let mut windows = Vec::new();
        for (i, w) in self.windows.iter().enumerate() {
            let at = format!("spec.windows[{i}] ({:?})", w.name);
            if w.name.is_empty() {
                problems.push(format!("spec.windows[{i}].name must not be empty"));
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
        if !problems.is_empty() {
            return Err(ApiError::Invalid(problems));
        }
        let config = EngineConfig {
            metric: self.metric.clone(),
            shards: self.shards,
            k: self.k as usize,
            mode,
            allowed_lateness_ms: lateness.as_millis(),
            max_future_skew_ms: self
                .max_future_skew
                .unwrap_or(DEFAULT_FUTURE_SKEW)
                .as_millis(),
            max_key_bytes: self
                .max_key_bytes
                .map_or(DEFAULT_MAX_KEY_BYTES, |b| b as usize),
            windows,
        };
        config
            .validate()
            .map_err(|e| ApiError::Invalid(vec![e.to_string()]))?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_EXAMPLE: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: api-requests}
spec:
  metric: api_requests          # events whose "metric" equals this are counted
  source: {kafka: {bootstrapServers: "kafka:9092", topic: api-events}}
  shards: 64
  k: 100
  mode: approximate
  sketch: {epsilon: 0.0001, delta: 0.01, candidates: 1000}
  allowedLateness: 2m
  windows:
    - {name: 1m, length: 1m, bucket: 10s}
    - {name: 1h, length: 1h, bucket: 1m}
    - {name: all, allTime: true}
"#;

    #[test]
    fn the_documented_manifest_loads() {
        let m = load_manifest(ISSUE_EXAMPLE).unwrap();
        let cfg = m.spec.engine_config().unwrap();
        assert_eq!(cfg.shards, 64);
        assert_eq!(cfg.allowed_lateness_ms, 120_000);
        assert_eq!(
            cfg.windows[1],
            WindowConfig::sliding("1h", 3_600_000, 60_000)
        );
        assert_eq!(cfg.windows[2].length_ms, None);
        assert!(matches!(cfg.mode, Mode::Approximate(p) if p.candidates == 1000));
    }

    #[test]
    fn the_embedded_default_is_valid() {
        load_manifest(DEFAULT_MANIFEST)
            .unwrap()
            .spec
            .engine_config()
            .unwrap();
    }

    #[test]
    fn invalid_specs_list_every_problem_with_its_field() {
        let bad = ISSUE_EXAMPLE
            .replace("k: 100", "k: 2000")
            .replace("bucket: 10s", "bucket: 7s")
            .replace("epsilon: 0.0001", "epsilon: 1.5");
        let err = load_manifest(&bad)
            .unwrap()
            .spec
            .engine_config()
            .unwrap_err()
            .to_string();
        for want in [
            "spec.sketch.epsilon must be in (0, 1)",
            "spec.sketch.candidates (1000) must be at least k (2000)",
            "spec.windows[0] (\"1m\"): bucket 7s must divide length 1m",
        ] {
            assert!(err.contains(want), "missing {want:?} in {err}");
        }
    }

    #[test]
    fn sketch_without_approximate_and_unknown_fields_are_rejected() {
        let exact = ISSUE_EXAMPLE.replace("mode: approximate", "mode: exact");
        let err = load_manifest(&exact)
            .unwrap()
            .spec
            .engine_config()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("spec.sketch is only allowed with mode: approximate"),
            "{err}"
        );
        let typo = ISSUE_EXAMPLE.replace("allowedLateness", "allowedLatenes");
        let err = load_manifest(&typo).unwrap_err().to_string();
        assert!(err.contains("allowedLatenes"), "{err}");
        let header = ISSUE_EXAMPLE.replace("kind: TopKMetric", "kind: Deployment");
        assert!(
            load_manifest(&header)
                .unwrap_err()
                .to_string()
                .contains("kind must be TopKMetric")
        );
    }
}
