//! The query API: the same JSON the reducer will serve in a cluster.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tokio::net::TcpListener;

use crate::error::CliError;
use crate::metrics::Metrics;
use crate::store::RankingStore;

pub struct AppState {
    pub metric: String,
    pub windows: Vec<String>,
    pub k: usize,
    pub store: RankingStore,
    pub metrics: Metrics,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/rankings", get(index))
        .route("/v1/rankings/{metric}", get(ranking))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
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

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

async fn index(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({ "rankings": state.store.index() })).into_response()
}

async fn ranking(
    State(state): State<Arc<AppState>>,
    Path(metric): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    if metric != state.metric {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "unknown metric {metric:?}; this server ranks {:?}",
                state.metric
            ),
        );
    }
    let window = match params.get("window") {
        Some(w) if state.windows.contains(w) => w.clone(),
        Some(w) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("unknown window {w:?}; choose one of {:?}", state.windows),
            );
        }
        None => state.windows[0].clone(),
    };
    let scope = params.get("scope").cloned().unwrap_or_default();
    let k = match params.get("k").map(|k| k.parse::<usize>()) {
        None => state.k,
        Some(Ok(k)) if (1..=state.k).contains(&k) => k,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("k must be an integer between 1 and {}", state.k),
            );
        }
    };
    match state.store.get(&window, &scope) {
        Some(record) => Json(record.truncated(k)).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no ranking published yet for window {window:?} and scope {scope:?}"),
        ),
    }
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
