//! Validated, unit-free engine configuration (milliseconds and counts).
//!
//! The user-facing manifest (durations as strings, YAML) lives in `topk-api`, which turns it
//! into an [`EngineConfig`]. The checks here are the ones the engine itself relies on.

use serde::{Deserialize, Serialize};

use crate::dedupe::DedupeConfig;
use crate::error::EngineError;
use crate::trend::{TRENDING, Trend, TrendScore, TrendingConfig};
use crate::window::Span;

/// Parameters of the approximate mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SketchParams {
    /// Over-count bound relative to the window's total over all shards.
    pub epsilon: f64,
    /// Probability that a key exceeds the bound.
    pub delta: f64,
    /// Candidate keys each shard keeps per scope and bucket, and publishes per scope.
    pub candidates: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "name")]
pub enum Mode {
    Exact,
    Approximate(SketchParams),
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Exact => "exact",
            Mode::Approximate(_) => "approximate",
        }
    }
}

/// Appended to a window's name to name its head window ([`WindowConfig::head`]).
pub const HEAD_SUFFIX: &str = "+head";

/// One ranking window. `length_ms == None` is the all-time window, whose `bucket_ms` is only
/// its publish cadence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WindowConfig {
    pub name: String,
    pub length_ms: Option<i64>,
    pub bucket_ms: i64,
    /// Buckets leave all at once when their period of `length_ms` ends ([`Span::Tumbling`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tumbling: bool,
    /// Set on a head window: the window (whole-hour buckets) whose open bucket this one counts,
    /// so that the reducer can publish that window's lists at every end of this one's buckets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_of: Option<String>,
}

impl WindowConfig {
    pub fn sliding(name: &str, length_ms: i64, bucket_ms: i64) -> Self {
        Self {
            name: name.to_owned(),
            length_ms: Some(length_ms),
            bucket_ms,
            tumbling: false,
            head_of: None,
        }
    }

    pub fn all_time(name: &str, publish_every_ms: i64) -> Self {
        Self {
            name: name.to_owned(),
            length_ms: None,
            bucket_ms: publish_every_ms,
            tumbling: false,
            head_of: None,
        }
    }

    /// The head window that refreshes this one every `refresh_ms`: it counts this window's
    /// open bucket so far (tumbling by this window's bucket), in buckets of `refresh_ms`.
    pub fn head(&self, refresh_ms: i64) -> Self {
        Self {
            name: format!("{}{HEAD_SUFFIX}", self.name),
            length_ms: Some(self.bucket_ms),
            bucket_ms: refresh_ms,
            tumbling: true,
            head_of: Some(self.name.clone()),
        }
    }

    /// Number of buckets a sliding window spans; `None` for all-time.
    pub fn buckets(&self) -> Option<i64> {
        self.length_ms.map(|len| len / self.bucket_ms)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EngineConfig {
    pub metric: String,
    pub shards: u32,
    pub k: usize,
    pub mode: Mode,
    pub allowed_lateness_ms: i64,
    /// Events whose time is further than this ahead of the caller's clock are rejected, so that
    /// one bad timestamp cannot push the watermark past every honest event.
    pub max_future_skew_ms: i64,
    pub max_key_bytes: usize,
    /// Longest accepted scope, in UTF-8 bytes.
    #[serde(default = "default_max_scope_bytes")]
    pub max_scope_bytes: usize,
    /// Distinct scopes one shard counts; events of further scopes are rejected, so that a
    /// stream of made-up scopes cannot grow a shard without bound.
    #[serde(default = "default_max_scopes")]
    pub max_scopes: usize,
    pub windows: Vec<WindowConfig>,
    /// Duplicate `event_id`s counted once (off when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe: Option<DedupeConfig>,
    /// The trending list (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trending: Option<TrendingConfig>,
}

pub const DEFAULT_MAX_SCOPE_BYTES: usize = 256;
/// One clock hour: the unit exact recounts and composed lists are made of.
pub const HOUR_MS: i64 = 3_600_000;
/// Largest estimated sketch memory of one shard in approximate mode.
pub const MAX_SKETCH_BYTES_PER_SHARD: u128 = 1 << 30;
pub const DEFAULT_MAX_SCOPES: usize = 10_000;

fn default_max_scope_bytes() -> usize {
    DEFAULT_MAX_SCOPE_BYTES
}

fn default_max_scopes() -> usize {
    DEFAULT_MAX_SCOPES
}

impl EngineConfig {
    /// The position of the window named `name` among the configured ones.
    pub fn window_position(&self, name: &str) -> Option<usize> {
        self.windows.iter().position(|w| w.name == name)
    }

    /// The trending list's windows and score; `None` without one (or before validation).
    pub fn trend(&self) -> Option<Trend> {
        let t = self.trending.as_ref()?;
        let (window, baseline) = (
            self.window_position(&t.window)?,
            self.window_position(&t.baseline)?,
        );
        let (short, long) = (
            self.windows[window].length_ms?,
            self.windows[baseline].length_ms?,
        );
        Some(Trend {
            window,
            baseline,
            min_count: t.min_count,
            score: TrendScore {
                smoothing: t.smoothing,
                length_ratio: short as f64 / long as f64,
            },
        })
    }

    /// The windows a metric publishes lists of: the configured ones (head windows too, which
    /// the reducer publishes as their parents' lists), then the trending list (made at its
    /// short window's boundaries, so with its length and bucket).
    pub fn lists(&self) -> Vec<WindowConfig> {
        let trending = self.trend().map(|t| WindowConfig {
            name: TRENDING.to_owned(),
            ..self.windows[t.window].clone()
        });
        self.windows.iter().cloned().chain(trending).collect()
    }

    /// Window positions in the order their lists are made at a boundary: a trending list's
    /// baseline before its short window, so that the score reads the baseline as of the same
    /// boundary.
    pub fn publish_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.windows.len()).collect();
        if let Some(t) = self.trend() {
            order.retain(|w| *w != t.baseline);
            order.insert(0, t.baseline);
        }
        order
    }

    /// Estimated sketch memory of one shard: per window, a sketch for every closed bucket in
    /// it, every bucket lateness keeps open, and the running window sum.
    pub fn sketch_bytes_per_shard(&self, p: SketchParams) -> u128 {
        let (width, depth) = crate::shard::shard_sketch_dimensions(p.epsilon, p.delta, self.shards);
        let sketch = u128::from(width) * u128::from(depth) * 8;
        self.windows
            .iter()
            .map(|w| {
                let bucket = w.bucket_ms.max(1);
                // Tumbling and all-time windows fold their closed buckets into the sum.
                let closed = match Span::of(w) {
                    Span::Sliding(n) => n,
                    Span::Tumbling(_) | Span::AllTime => 0,
                };
                let open = self.allowed_lateness_ms.max(0) / bucket + 1;
                sketch * (closed.max(0) as u128 + open as u128 + 1)
            })
            .sum()
    }

    pub fn validate(&self) -> Result<(), EngineError> {
        let fail = |msg: String| Err(EngineError::InvalidConfig(msg));
        if self.metric.is_empty() {
            return fail("metric must not be empty".into());
        }
        if self.shards == 0 {
            return fail("shards must be at least 1".into());
        }
        if self.k == 0 {
            return fail("k must be at least 1".into());
        }
        if self.allowed_lateness_ms < 0 {
            return fail("allowedLateness must not be negative".into());
        }
        if self.max_future_skew_ms < 0 {
            return fail("maxFutureSkew must not be negative".into());
        }
        if self.max_key_bytes == 0 {
            return fail("maxKeyBytes must be at least 1".into());
        }
        if self.max_scope_bytes == 0 {
            return fail("maxScopeBytes must be at least 1".into());
        }
        if self.max_scopes == 0 {
            return fail("maxScopes must be at least 1".into());
        }
        if let Some(dedupe) = self.dedupe {
            if dedupe.horizon_ms < 0 {
                return fail("dedupe.horizon must not be negative".into());
            }
            if dedupe.max_ids == 0 {
                return fail("dedupe.maxIdsPerShard must be at least 1".into());
            }
        }
        if let Mode::Approximate(p) = self.mode {
            if !(p.epsilon > 0.0 && p.epsilon < 1.0) {
                return fail(format!(
                    "sketch.epsilon must be in (0, 1), got {}",
                    p.epsilon
                ));
            }
            if !(p.delta > 0.0 && p.delta < 1.0) {
                return fail(format!("sketch.delta must be in (0, 1), got {}", p.delta));
            }
            if p.candidates < self.k {
                return fail(format!(
                    "sketch.candidates ({}) must be at least k ({})",
                    p.candidates, self.k
                ));
            }
            let bytes = self.sketch_bytes_per_shard(p);
            if bytes > MAX_SKETCH_BYTES_PER_SHARD {
                return fail(format!(
                    "the sketches of one shard would take about {} MiB (the limit is {} MiB): raise sketch.epsilon or shards, or use wider buckets",
                    bytes >> 20,
                    MAX_SKETCH_BYTES_PER_SHARD >> 20
                ));
            }
        }
        if self.windows.is_empty() {
            return fail("at least one window is required".into());
        }
        for (i, w) in self.windows.iter().enumerate() {
            if w.name.is_empty() {
                return fail(format!("windows[{i}].name must not be empty"));
            }
            if self.windows[..i].iter().any(|o| o.name == w.name) {
                return fail(format!("window name {:?} is used twice", w.name));
            }
            if w.bucket_ms <= 0 {
                return fail(format!("window {:?}: bucket must be positive", w.name));
            }
            if let Some(len) = w.length_ms {
                if len <= 0 {
                    return fail(format!("window {:?}: length must be positive", w.name));
                }
                if len % w.bucket_ms != 0 {
                    return fail(format!(
                        "window {:?}: bucket ({} ms) must divide length ({} ms)",
                        w.name, w.bucket_ms, len
                    ));
                }
            }
        }
        for w in &self.windows {
            if let Some(parent) = &w.head_of {
                self.validate_head(w, parent)?;
            }
        }
        if let Some(t) = &self.trending {
            self.validate_trending(t)?;
        }
        Ok(())
    }

    /// A head window must be its parent's [`WindowConfig::head`], and the parent's buckets
    /// whole hours (the reducer composes the parent's closed hours with the head).
    fn validate_head(&self, head: &WindowConfig, parent: &str) -> Result<(), EngineError> {
        let fail = |msg: String| Err(EngineError::InvalidConfig(msg));
        let Some(p) = self.window_position(parent) else {
            return fail(format!(
                "window {:?} is the head of {parent:?}, which is not configured",
                head.name
            ));
        };
        let parent = &self.windows[p];
        if parent.head_of.is_some() || parent.tumbling {
            return fail(format!(
                "window {:?}: only a sliding or all-time window has a head",
                parent.name
            ));
        }
        if parent.bucket_ms % HOUR_MS != 0 {
            return fail(format!(
                "window {:?}: refresh needs a bucket of whole hours, got {} ms",
                parent.name, parent.bucket_ms
            ));
        }
        let refresh = head.bucket_ms;
        if refresh >= parent.bucket_ms || parent.bucket_ms % refresh != 0 {
            return fail(format!(
                "window {:?}: refresh ({refresh} ms) must divide its bucket ({} ms) and be shorter",
                parent.name, parent.bucket_ms
            ));
        }
        if *head != parent.head(refresh) {
            return fail(format!(
                "window {:?} is not the head of {:?} (a tumbling window of its bucket named {:?})",
                head.name,
                parent.name,
                parent.head(refresh).name
            ));
        }
        Ok(())
    }

    fn validate_trending(&self, t: &TrendingConfig) -> Result<(), EngineError> {
        let fail = |msg: String| Err(EngineError::InvalidConfig(msg));
        if self.windows.iter().any(|w| w.name == TRENDING) {
            return fail(format!(
                "a window is named {TRENDING:?}, the trending list's name; rename the window"
            ));
        }
        let sliding = |field: &str, name: &str| match self.window_position(name) {
            None => Err(format!(
                "trending.{field} names no window: {name:?} is not among spec.windows"
            )),
            Some(w) => self.windows[w].length_ms.ok_or_else(|| {
                format!("trending.{field}: {name:?} is all-time; name a sliding window")
            }),
        };
        let short = sliding("window", &t.window).map_err(EngineError::InvalidConfig)?;
        let long = sliding("baseline", &t.baseline).map_err(EngineError::InvalidConfig)?;
        if long <= short {
            return fail(format!(
                "trending.baseline ({:?}) must be longer than trending.window ({:?})",
                t.baseline, t.window
            ));
        }
        if t.min_count == 0 {
            return fail("trending.minCount must be at least 1".into());
        }
        if !(t.smoothing.is_finite() && t.smoothing > 0.0) {
            return fail(format!(
                "trending.smoothing must be a positive number, got {}",
                t.smoothing
            ));
        }
        Ok(())
    }
}
