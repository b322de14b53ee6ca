//! The query API of `topk run` and `topk demo`: the reducer's routes and JSON, over the
//! lists counted in this process.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use topk_query::{Served, query_router};

use crate::error::CliError;
use crate::metrics::Metrics;

pub struct AppState {
    pub served: Arc<Served>,
    pub metrics: Metrics,
}

/// The reducer's query routes over the in-process lists, plus `/metrics` and `/healthz`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state.clone())
        .merge(query_router(state.served.clone()))
}

/// Binds before anything else runs, so a bad address fails fast and `:0` resolves.
pub async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), CliError> {
    let bind_err = |source| CliError::Bind {
        addr: addr.to_owned(),
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
    let local = listener.local_addr().map_err(bind_err)?;
    Ok((listener, local))
}

pub async fn serve(listener: TcpListener, state: Arc<AppState>) -> Result<(), CliError> {
    axum::serve(listener, router(state))
        .await
        .map_err(CliError::Serve)
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}
