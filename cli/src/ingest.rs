//! Feeds lines to the pipeline and hands what it publishes to the store and the metrics.
//! Shared by `topk run` (lines from a file or stdin) and `topk demo` (generated lines).

use std::sync::Arc;

use tokio::sync::mpsc;
use topk_engine::pipeline::Published;
use topk_engine::{Event, IngestOutcome, Pipeline, RejectReason};
use topk_query::{PointRequest, answer_with_pipeline, point_channel};

use crate::metrics::WindowLabel;
use crate::server::AppState;

pub use topk_runtime::now_ms;

pub struct Ingestor {
    pipeline: Pipeline,
    state: Arc<AppState>,
    published: Vec<Published>,
    /// Point-count requests from the query API, answered from the pipeline; `None` once taken.
    points: Option<mpsc::Receiver<PointRequest>>,
}

impl Ingestor {
    /// Also answers the query API's point counts (`/v1/frequency`) from `pipeline`.
    pub fn new(pipeline: Pipeline, state: Arc<AppState>) -> Self {
        let windows = pipeline
            .config()
            .windows
            .iter()
            .map(|w| w.name.clone())
            .collect();
        // Nothing to wake: requests are taken between lines or awaited.
        let (counts, points) = point_channel(windows, Arc::new(|| {}));
        state.served.set_point_counts(Arc::new(counts));
        Self {
            pipeline,
            state,
            published: Vec::new(),
            points: Some(points),
        }
    }

    /// The point-count requests, for a caller that awaits them (see [`Self::answer`]).
    pub fn take_points(&mut self) -> Option<mpsc::Receiver<PointRequest>> {
        self.points.take()
    }

    /// Answers the point-count requests waiting, if any.
    pub fn answer_waiting(&mut self) {
        while let Some(request) = self.points.as_mut().and_then(|p| p.try_recv().ok()) {
            self.answer(request);
        }
    }

    /// Answers one point-count request: every shard is in this process.
    pub fn answer(&self, request: PointRequest) {
        answer_with_pipeline(&self.pipeline, request, now_ms());
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
        self.counted(outcome)
    }

    /// Counts an event made in this process rather than read.
    pub fn event(&mut self, event: &Event<'_>, now_ms: i64) -> IngestOutcome {
        let outcome = self
            .pipeline
            .ingest_event(event, now_ms, &mut self.published);
        self.counted(outcome)
    }

    fn counted(&mut self, outcome: IngestOutcome) -> IngestOutcome {
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
