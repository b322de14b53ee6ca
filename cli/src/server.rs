//! The query API of `topk run` and `topk demo`: the reducer's routes and JSON, over the
//! lists counted in this process.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use topk_query::{Served, query_router};
use topk_runtime::probes::{self, Probes};

use crate::error::CliError;
use crate::metrics::Metrics;

pub struct AppState {
    pub served: Arc<Served>,
    pub metrics: Metrics,
}

/// The reducer's query routes over the in-process lists, plus `/metrics`, `/healthz` and
/// `/readyz` (always ready: the lists are in memory).
pub fn router(state: Arc<AppState>) -> Router {
    let metrics = state.clone();
    query_router(state.served.clone()).merge(probes::router(Probes {
        metrics: Arc::new(move || metrics.metrics.encode()),
        ready: Arc::new(|| true),
        waiting: "",
    }))
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
