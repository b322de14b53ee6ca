//! `GET /v1/frequency/{metric}?window=W&scope=S&key=K[&key=K2...]`: any key's count in a window,
//! from whatever holds the counts (a worker's shards, the reducer asking the workers, `topk
//! run`'s engine), behind [`PointCounts`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::FutureExt;
use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use topk_api::frequency::{FrequencyAnswer, MAX_KEYS, answer_from};
use topk_engine::Pipeline;

use topk_runtime::probes::CodeLabel;

/// Longest key a request may name: longer ones are never counted (the spec caps keys lower).
pub const MAX_KEY_BYTES: usize = 4096;

/// Why a point-count request got no answer: the HTTP status and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered(pub StatusCode, pub String);

impl Unanswered {
    /// A 503: the counts exist but cannot be read now (a retry may succeed).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self(StatusCode::SERVICE_UNAVAILABLE, message.into())
    }
}

/// What answers point counts.
pub trait PointCounts: Send + Sync {
    /// The counts of `keys` (at least one, each asked once) in `window` and `scope`.
    fn counts(
        &self,
        window: String,
        scope: String,
        keys: Vec<String>,
    ) -> BoxFuture<'static, Result<FrequencyAnswer, Unanswered>>;
}

/// One request for the thread that owns the counts (see [`point_channel`]).
pub struct PointRequest {
    /// The window's position in the config.
    pub window: usize,
    pub scope: String,
    pub keys: Vec<String>,
    pub reply: oneshot::Sender<FrequencyAnswer>,
}

/// Requests waiting for the counting thread; more are refused (503) rather than queued.
pub const POINT_QUEUE: usize = 256;

/// How long a request waits for the counts: longer only while the counting thread
/// checkpoints (with [`ChannelPointCounts`]) or publishes a large summary or takes over a
/// shard.
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// [`PointCounts`] answered by a thread that owns the counts and takes [`PointRequest`]s
/// between its batches of input; `wake` ends its wait for input, so that an idle thread
/// answers at once.
pub struct ChannelPointCounts {
    windows: Vec<String>,
    requests: mpsc::Sender<PointRequest>,
    wake: Arc<dyn Fn() + Send + Sync>,
}

/// The asking side and the receiving end the counting thread polls.
pub fn point_channel(
    windows: Vec<String>,
    wake: Arc<dyn Fn() + Send + Sync>,
) -> (ChannelPointCounts, mpsc::Receiver<PointRequest>) {
    let (requests, receiver) = mpsc::channel(POINT_QUEUE);
    let counts = ChannelPointCounts {
        windows,
        requests,
        wake,
    };
    (counts, receiver)
}

fn refused(
    code: StatusCode,
    message: String,
) -> BoxFuture<'static, Result<FrequencyAnswer, Unanswered>> {
    futures::future::ready(Err(Unanswered(code, message))).boxed()
}

/// The position of `window` among `windows`, or the refusal of an unknown one.
fn window_index(
    windows: &[String],
    window: &str,
) -> Result<usize, BoxFuture<'static, Result<FrequencyAnswer, Unanswered>>> {
    windows.iter().position(|w| *w == window).ok_or_else(|| {
        refused(
            StatusCode::BAD_REQUEST,
            format!("unknown window {window:?}"),
        )
    })
}

/// What [`BlockingPointCounts`] looks keys up with: window position, scope, keys.
pub type Lookup = dyn Fn(usize, &str, &[String]) -> FrequencyAnswer + Send + Sync;

/// [`PointCounts`] answered by a lookup on a blocking thread, for counts that the counting
/// thread shares behind a lock it holds a batch at a time (a worker's shards): answers go on
/// while that thread checkpoints, which only reads them.
pub struct BlockingPointCounts {
    windows: Vec<String>,
    lookup: Arc<Lookup>,
}

impl BlockingPointCounts {
    pub fn new(windows: Vec<String>, lookup: Arc<Lookup>) -> Self {
        Self { windows, lookup }
    }
}

impl PointCounts for BlockingPointCounts {
    fn counts(
        &self,
        window: String,
        scope: String,
        keys: Vec<String>,
    ) -> BoxFuture<'static, Result<FrequencyAnswer, Unanswered>> {
        let window = match window_index(&self.windows, &window) {
            Ok(window) => window,
            Err(refusal) => return refusal,
        };
        let lookup = self.lookup.clone();
        async move {
            let task = tokio::task::spawn_blocking(move || lookup(window, &scope, &keys));
            match tokio::time::timeout(ANSWER_WAIT, task).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(err)) => Err(Unanswered::unavailable(format!(
                    "the point-count lookup failed: {err}"
                ))),
                Err(_) => Err(Unanswered::unavailable(
                    "the shards were not readable in time (the counting thread is closing a bucket of a large state); retry",
                )),
            }
        }
        .boxed()
    }
}

impl PointCounts for ChannelPointCounts {
    fn counts(
        &self,
        window: String,
        scope: String,
        keys: Vec<String>,
    ) -> BoxFuture<'static, Result<FrequencyAnswer, Unanswered>> {
        let window = match window_index(&self.windows, &window) {
            Ok(window) => window,
            Err(refusal) => return refusal,
        };
        let (reply, answer) = oneshot::channel();
        let request = PointRequest {
            window,
            scope,
            keys,
            reply,
        };
        if self.requests.try_send(request).is_err() {
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many point-count requests are waiting; retry".to_owned(),
            );
        }
        (self.wake)();
        async move {
            match tokio::time::timeout(ANSWER_WAIT, answer).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(_)) => Err(Unanswered::unavailable("the counting thread is stopping")),
                Err(_) => Err(Unanswered::unavailable(
                    "the counting thread did not answer in time (checkpointing or taking over a shard); retry",
                )),
            }
        }
        .boxed()
    }
}

/// Answers `request` from a pipeline holding every shard (`topk run`, `topk demo`).
pub fn answer_with_pipeline(pipeline: &Pipeline, request: PointRequest, now_ms: i64) {
    let (window, scope) = (request.window, &request.scope);
    let answer = answer_from(
        pipeline.config(),
        window,
        scope,
        &request.keys,
        now_ms,
        |_, key| {
            Some((
                pipeline.point_count(window, scope, key),
                pipeline.watermark_ms(),
            ))
        },
    );
    // The asker may have given up (timed out).
    let _ = request.reply.send(answer);
}

/// The metric and windows requests are checked against, what answers them, and the responses
/// counter (by status code).
pub struct Frequency {
    pub metric: String,
    pub windows: Vec<String>,
    pub counts: Arc<dyn PointCounts>,
    pub requests: Family<CodeLabel, Counter>,
}

/// The route, for a server without [`crate::Served`] lists (a worker).
pub fn frequency_router(frequency: Arc<Frequency>) -> Router {
    Router::new()
        .route("/v1/frequency/{metric}", get(frequency_route))
        .with_state(frequency)
}

async fn frequency_route(
    State(frequency): State<Arc<Frequency>>,
    Path(metric): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let answered = answer(&frequency, &metric, params).await;
    respond(&frequency.requests, answered)
}

/// The response to a point-count request, counted by status code.
pub(crate) fn respond(
    requests: &Family<CodeLabel, Counter>,
    answered: Result<FrequencyAnswer, Unanswered>,
) -> Response {
    let code = match &answered {
        Ok(_) => StatusCode::OK,
        Err(Unanswered(code, _)) => *code,
    };
    requests
        .get_or_create(&CodeLabel {
            code: code.as_u16(),
        })
        .inc();
    match answered {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(Unanswered(code, message)) => {
            (code, axum::Json(json!({ "error": message }))).into_response()
        }
    }
}

/// Checks the request, then asks [`Frequency::counts`].
pub async fn answer(
    frequency: &Frequency,
    metric: &str,
    params: Vec<(String, String)>,
) -> Result<FrequencyAnswer, Unanswered> {
    let bad = |message: String| Unanswered(StatusCode::BAD_REQUEST, message);
    if metric != frequency.metric {
        return Err(Unanswered(
            StatusCode::NOT_FOUND,
            format!(
                "unknown metric {metric:?}; this server counts {:?}",
                frequency.metric
            ),
        ));
    }
    let (mut window, mut scope, mut keys) = (None, None, Vec::new());
    for (name, value) in params {
        match name.as_str() {
            "window" => window = Some(value),
            "scope" => scope = Some(value),
            "key" => keys.push(value),
            other => {
                return Err(bad(format!(
                    "unknown parameter {other:?}; give window, scope and one key= per key"
                )));
            }
        }
    }
    let window = match window {
        Some(w) if frequency.windows.contains(&w) => w,
        Some(w) => {
            return Err(bad(format!(
                "unknown window {w:?}; choose one of {:?}",
                frequency.windows
            )));
        }
        None => frequency.windows.first().cloned().unwrap_or_default(),
    };
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(bad(format!("give 1 to {MAX_KEYS} keys, as key=K&key=K2")));
    }
    if let Some(key) = keys
        .iter()
        .find(|k| k.is_empty() || k.len() > MAX_KEY_BYTES)
    {
        return Err(bad(format!(
            "a key must be 1 to {MAX_KEY_BYTES} bytes, got {} bytes",
            key.len()
        )));
    }
    frequency
        .counts
        .counts(window, scope.unwrap_or_default(), keys)
        .await
}
