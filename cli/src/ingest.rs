//! Feeds lines to the pipeline and hands what it publishes to the store and the metrics.
//! Shared by `topk run` (lines from a file or stdin) and `topk demo` (generated lines).

use std::sync::Arc;

use topk_engine::pipeline::Published;
use topk_engine::{IngestOutcome, Pipeline, RejectReason};

use crate::metrics::WindowLabel;
use crate::server::AppState;

pub use topk_runtime::now_ms;

pub struct Ingestor {
    pipeline: Pipeline,
    state: Arc<AppState>,
    published: Vec<Published>,
}

impl Ingestor {
    pub fn new(pipeline: Pipeline, state: Arc<AppState>) -> Self {
        Self {
            pipeline,
            state,
            published: Vec::new(),
        }
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Keys left out of the lists published from now on.
    pub fn set_deny(&mut self, keys: topk_api::DenyList) {
        self.pipeline.set_deny(keys);
    }

    pub fn line(&mut self, line: &str, now_ms: i64) -> IngestOutcome {
        let outcome = self.pipeline.ingest_line(line, now_ms, &mut self.published);
        self.state.metrics.record(outcome);
        if !self.published.is_empty() {
            self.flush();
        }
        outcome
    }

    /// Input that is not counted before it is parsed: not text, or too long to read.
    pub fn refuse(&mut self, reason: RejectReason) {
        self.pipeline.record_rejection(reason);
        self.state.metrics.record(IngestOutcome::Rejected(reason));
    }

    pub fn finish(&mut self, now_ms: i64) {
        self.pipeline.finish(now_ms, &mut self.published);
        self.flush();
    }

    fn flush(&mut self) {
        let metrics = &self.state.metrics;
        for p in &self.published {
            metrics
                .rankings_published
                .get_or_create(&WindowLabel {
                    window: p.ranking.window.clone(),
                })
                .inc();
        }
        if let Some(last) = self.published.last() {
            metrics
                .watermark_seconds
                .set(last.ranking.watermark_ms as f64 / 1000.0);
        }
        metrics.state_bytes.set(self.pipeline.state_bytes() as i64);
        self.state.served.put(
            self.published
                .iter()
                .map(topk_api::RankingRecord::from_published),
        );
        self.published.clear();
    }
}
