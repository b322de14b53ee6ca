//! `/metrics`, `/healthz` and `/readyz`, the same on every long-running process: metrics in the
//! OpenMetrics text format, liveness always `ok`, readiness from the process's own flag.

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;

/// What the endpoints read.
#[derive(Clone)]
pub struct Probes {
    /// The metrics page.
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
    /// Whether the process serves (`/readyz` 200), else 503 with `waiting`.
    pub ready: Arc<dyn Fn() -> bool + Send + Sync>,
    /// What a 503 says the process is waiting for.
    pub waiting: &'static str,
}

/// The label of counters of what became of something (an event, a flush, a summary).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// The label of counters of things refused, by why (an event's `RejectReason`, say).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// The label of HTTP response counters: the status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: u16,
}

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics page of `registry`, in the OpenMetrics text format.
pub fn page(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

pub fn router(probes: Probes) -> Router {
    let metrics = probes.metrics.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let page = metrics();
                async move { ([(header::CONTENT_TYPE, OPENMETRICS)], page) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                if (probes.ready)() {
                    (StatusCode::OK, "ready\n".to_owned()).into_response()
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("{}\n", probes.waiting),
                    )
                        .into_response()
                }
            }),
        )
}
