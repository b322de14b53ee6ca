//! The query API: the latest list of every (window, scope), rendered once when published and
//! served from memory. The reducer pods and `topk run` serve their lists through these routes;
//! neither depends on the other for it. A server with a [`History`] (the reducer's ranking
//! store) also answers for earlier versions: `?version=N`, `?asOf=T`, and the list of stored
//! versions at `/v1/rankings/{metric}/history`. A server with [`PointCounts`] answers any key's
//! count at `/v1/frequency/{metric}`.

pub mod frequency;

pub use frequency::{
    BlockingPointCounts, ChannelPointCounts, Frequency, Lookup, PointCounts, PointRequest,
    Unanswered, answer_with_pipeline, frequency_router, point_channel,
};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock, RwLock};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::json;
use topk_api::{RankingIndexEntry, RankingRecord};
use topk_runtime::probes::CodeLabel;

/// The stored, immutable versions of every list, for `?version=` and `?asOf=`.
pub trait History: Send + Sync {
    /// Stored versions of one list, oldest first.
    fn versions(&self, window: &str, scope: &str) -> Result<Vec<u64>, String>;
    /// One stored version; `None` when it is not stored (never published, or deleted by
    /// retention).
    fn version(
        &self,
        window: &str,
        scope: &str,
        version: u64,
    ) -> Result<Option<RankingRecord>, String>;
}

/// The newest of `versions` (oldest first) published at or before `as_of_ms`, found by
/// bisection: publication times grow with versions. `published(v)` reads a version's `asOf`.
pub fn version_as_of(
    versions: &[u64],
    as_of_ms: i64,
    mut published: impl FnMut(u64) -> Result<Option<i64>, String>,
) -> Result<Option<u64>, String> {
    let (mut lo, mut hi) = (0, versions.len());
    // Invariant: versions[..lo] were published at or before as_of_ms, versions[hi..] after
    // (or are gone).
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match published(versions[mid])? {
            Some(at) if at <= as_of_ms => lo = mid + 1,
            _ => hi = mid,
        }
    }
    Ok(lo.checked_sub(1).map(|i| versions[i]))
}

/// A published list with its JSON, rendered once.
pub struct Entry {
    pub record: RankingRecord,
    body: Bytes,
}

impl Entry {
    fn new(record: RankingRecord) -> Self {
        let body = Bytes::from(serde_json::to_vec(&record).unwrap_or_default());
        Self { record, body }
    }
}

/// The lists a server answers with, keyed by (window position in the spec, scope) so that
/// listings follow the spec's order.
pub struct Served {
    metric: String,
    windows: Vec<String>,
    k: usize,
    lists: RwLock<BTreeMap<(usize, String), Arc<Entry>>>,
    stale: RwLock<Vec<bool>>,
    history: Option<Arc<dyn History>>,
    frequency: OnceLock<Arc<Frequency>>,
    requests: Family<CodeLabel, Counter>,
}

impl Served {
    /// Answers count into `requests` by status code: the family the caller's `/metrics`
    /// exports, so an embedder cannot serve answers that no metric shows.
    pub fn new(
        metric: &str,
        windows: Vec<String>,
        k: usize,
        requests: Family<CodeLabel, Counter>,
    ) -> Self {
        Self {
            metric: metric.to_owned(),
            stale: RwLock::new(vec![false; windows.len()]),
            windows,
            k,
            lists: RwLock::default(),
            history: None,
            frequency: OnceLock::new(),
            requests,
        }
    }

    /// Answers for earlier versions from `history` too.
    pub fn with_history(mut self, history: Arc<dyn History>) -> Self {
        self.history = Some(history);
        self
    }

    /// Answers point counts (`/v1/frequency/{metric}`) with `counts` from now on; only the first
    /// call counts.
    pub fn set_point_counts(&self, counts: Arc<dyn PointCounts>) {
        let _ = self.frequency.set(Arc::new(Frequency {
            metric: self.metric.clone(),
            windows: self.windows.clone(),
            counts,
            requests: self.requests.clone(),
        }));
    }

    pub fn metric(&self) -> &str {
        &self.metric
    }

    pub fn windows(&self) -> &[String] {
        &self.windows
    }

    fn position(&self, window: &str) -> Option<usize> {
        self.windows.iter().position(|w| w == window)
    }

    /// Serves a window's new lists, which are fresh: its staleness flag is cleared first, so
    /// nothing is rendered twice.
    pub fn publish(&self, window: &str, records: impl IntoIterator<Item = RankingRecord>) {
        if let Some(pos) = self.position(window) {
            self.stale.write().unwrap_or_else(|e| e.into_inner())[pos] = false;
        }
        self.put(records);
    }

    /// Serves these records from now on (each replaces its list's previous one).
    pub fn put(&self, records: impl IntoIterator<Item = RankingRecord>) {
        let stale = self.stale.read().unwrap_or_else(|e| e.into_inner()).clone();
        let mut lists = self.lists.write().unwrap_or_else(|e| e.into_inner());
        for mut record in records {
            let Some(pos) = self.position(&record.window) else {
                continue;
            };
            record.stale = stale[pos];
            lists.insert((pos, record.scope.clone()), Arc::new(Entry::new(record)));
        }
    }

    /// Stops serving a list (its scope expired).
    pub fn remove(&self, window: &str, scope: &str) {
        if let Some(pos) = self.position(window) {
            let mut lists = self.lists.write().unwrap_or_else(|e| e.into_inner());
            lists.remove(&(pos, scope.to_owned()));
        }
    }

    /// Marks a window's lists stale (or fresh again); returns whether that changed anything.
    pub fn set_stale(&self, window: &str, stale: bool) -> bool {
        let Some(pos) = self.position(window) else {
            return false;
        };
        {
            let mut flags = self.stale.write().unwrap_or_else(|e| e.into_inner());
            if flags[pos] == stale {
                return false;
            }
            flags[pos] = stale;
        }
        let current: Vec<RankingRecord> = {
            let lists = self.lists.read().unwrap_or_else(|e| e.into_inner());
            lists
                .iter()
                .filter(|((p, _), _)| *p == pos)
                .map(|(_, e)| e.record.clone())
                .collect()
        };
        self.put(current);
        true
    }

    pub fn get(&self, window: &str, scope: &str) -> Option<Arc<Entry>> {
        let pos = self.position(window)?;
        let lists = self.lists.read().unwrap_or_else(|e| e.into_inner());
        lists.get(&(pos, scope.to_owned())).cloned()
    }

    /// Every list served, in the spec's window order then by scope.
    pub fn all(&self) -> Vec<Arc<Entry>> {
        let lists = self.lists.read().unwrap_or_else(|e| e.into_inner());
        lists.values().cloned().collect()
    }

    pub fn index(&self) -> Vec<RankingIndexEntry> {
        self.all()
            .iter()
            .map(|e| {
                let r = &e.record;
                RankingIndexEntry {
                    metric: r.metric.clone(),
                    scope: r.scope.clone(),
                    window: r.window.clone(),
                    version: r.version,
                    window_end: r.window_end.clone(),
                    as_of: r.as_of.clone(),
                    items: r.items.len(),
                }
            })
            .collect()
    }

    fn count(&self, status: StatusCode) {
        self.requests
            .get_or_create(&CodeLabel {
                code: status.as_u16(),
            })
            .inc();
    }
}

/// `GET /v1/rankings`, `GET /v1/rankings/{metric}?window=&scope=&k=` (with `&version=N` or
/// `&asOf=T` for an earlier version), `GET /v1/rankings/{metric}/history?window=&scope=` and
/// `GET /v1/frequency/{metric}?window=&scope=&key=`.
pub fn query_router(served: Arc<Served>) -> Router {
    Router::new()
        .route("/v1/rankings", get(index))
        .route("/v1/rankings/{metric}", get(ranking))
        .route("/v1/rankings/{metric}/history", get(history))
        .route("/v1/frequency/{metric}", get(point_counts))
        .with_state(served)
}

async fn point_counts(
    State(served): State<Arc<Served>>,
    Path(metric): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let answered = match served.frequency.get() {
        Some(frequency) => frequency::answer(frequency, &metric, params).await,
        None => Err(Unanswered(
            StatusCode::NOT_FOUND,
            "this server answers no point counts".to_owned(),
        )),
    };
    frequency::respond(&served.requests, answered)
}

fn error(served: &Served, status: StatusCode, message: String) -> Response {
    served.count(status);
    (status, axum::Json(json!({ "error": message }))).into_response()
}

async fn index(State(served): State<Arc<Served>>) -> Response {
    served.count(StatusCode::OK);
    axum::Json(json!({ "rankings": served.index() })).into_response()
}

/// A request refused: the status and why.
struct Refusal(StatusCode, String);

impl Refusal {
    fn answer(self, served: &Served) -> Response {
        error(served, self.0, self.1)
    }
}

/// The (window, scope) a request names, or why not.
fn list_of<'a>(
    served: &'a Served,
    metric: &str,
    params: &'a HashMap<String, String>,
) -> Result<(&'a str, &'a str), Refusal> {
    if metric != served.metric {
        return Err(Refusal(
            StatusCode::NOT_FOUND,
            format!(
                "unknown metric {metric:?}; this server ranks {:?}",
                served.metric
            ),
        ));
    }
    let window = match params.get("window") {
        Some(w) if served.windows.contains(w) => w.as_str(),
        Some(w) => {
            return Err(Refusal(
                StatusCode::BAD_REQUEST,
                format!("unknown window {w:?}; choose one of {:?}", served.windows),
            ));
        }
        None => served.windows.first().map_or("", String::as_str),
    };
    Ok((window, params.get("scope").map_or("", String::as_str)))
}

/// The server's history, or why there is none.
fn history_of(served: &Served) -> Result<&dyn History, Refusal> {
    served.history.as_deref().ok_or_else(|| {
        Refusal(
            StatusCode::NOT_FOUND,
            "this server keeps no earlier versions (topk run serves the latest lists only; the reducers keep them)".to_owned(),
        )
    })
}

/// The stored version `?version=` or `?asOf=` names, or why not.
fn pinned(
    served: &Served,
    window: &str,
    scope: &str,
    params: &HashMap<String, String>,
) -> Result<RankingRecord, Refusal> {
    let bad = |message: String| Refusal(StatusCode::BAD_REQUEST, message);
    let failed = |e: String| {
        Refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read the stored versions: {e}"),
        )
    };
    let history = history_of(served)?;
    let version = match (params.get("version"), params.get("asOf")) {
        (Some(_), Some(_)) => return Err(bad("give version or asOf, not both".to_owned())),
        (Some(v), None) => v
            .parse::<u64>()
            .map_err(|_| bad(format!("version must be a positive integer, got {v:?}")))?,
        (None, Some(t)) => {
            let as_of = topk_engine::event::parse_rfc3339_ms(t).ok_or_else(|| {
                bad(format!(
                    "asOf must be an RFC 3339 time such as 2026-12-04T10:00:00Z, got {t:?}"
                ))
            })?;
            let versions = history.versions(window, scope).map_err(failed)?;
            let published = |v: u64| {
                Ok(history
                    .version(window, scope, v)?
                    .and_then(|r| topk_engine::event::parse_rfc3339_ms(&r.as_of)))
            };
            version_as_of(&versions, as_of, published)
                .map_err(failed)?
                .ok_or_else(|| {
                    Refusal(
                        StatusCode::NOT_FOUND,
                        format!("no stored version of window {window:?} and scope {scope:?} was published at or before {t}"),
                    )
                })?
        }
        (None, None) => return Err(bad("neither version nor asOf".to_owned())),
    };
    history
        .version(window, scope, version)
        .map_err(failed)?
        .ok_or_else(|| {
            Refusal(
                StatusCode::NOT_FOUND,
                format!("version {version} of window {window:?} and scope {scope:?} is not stored (never published, or older than the retention); see /v1/rankings/{}/history", served.metric),
            )
        })
}

async fn ranking(
    State(served): State<Arc<Served>>,
    Path(metric): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let served = &*served;
    let (window, scope) = match list_of(served, &metric, &params) {
        Ok(list) => list,
        Err(refusal) => return refusal.answer(served),
    };
    let k = match params.get("k").map(|k| k.parse::<usize>()) {
        None => served.k,
        Some(Ok(k)) if (1..=served.k).contains(&k) => k,
        Some(_) => {
            return error(
                served,
                StatusCode::BAD_REQUEST,
                format!("k must be an integer between 1 and {}", served.k),
            );
        }
    };
    let historic;
    let (record, rendered, cache_control) =
        if params.contains_key("version") || params.contains_key("asOf") {
            historic = match pinned(served, window, scope, &params) {
                Ok(record) => record,
                Err(refusal) => return refusal.answer(served),
            };
            // A stored version never changes.
            (&historic, None, "public, max-age=31536000, immutable")
        } else {
            let Some(entry) = served.get(window, scope) else {
                return error(
                    served,
                    StatusCode::NOT_FOUND,
                    format!("no ranking published yet for window {window:?} and scope {scope:?}"),
                );
            };
            historic = entry.record.clone();
            (&historic, Some(entry.body.clone()), "public, max-age=1")
        };
    let shown = k.min(record.items.len());
    // The body depends on the version, the staleness flag and how many items are shown.
    let etag = format!(
        "\"{}-{}-{}\"",
        record.version,
        u8::from(record.stale),
        shown
    );
    let cache = [
        (header::ETAG, etag.clone()),
        (header::CACHE_CONTROL, cache_control.to_owned()),
    ];
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|tag| tag.trim() == etag || tag.trim() == "*")
        })
    {
        served.count(StatusCode::NOT_MODIFIED);
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    let body = if let (Some(body), true) = (rendered, shown == record.items.len()) {
        Body::from(body)
    } else if shown == record.items.len() {
        Body::from(serde_json::to_vec(record).unwrap_or_default())
    } else {
        let mut short = record.clone();
        short.items.truncate(shown);
        Body::from(serde_json::to_vec(&short).unwrap_or_default())
    };
    served.count(StatusCode::OK);
    let mut response = (StatusCode::OK, cache, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `GET /v1/rankings/{metric}/history?window=&scope=&limit=`: the stored versions of one list,
/// newest first (at most `limit`, default 100), each with when it was published and what it
/// covered.
async fn history(
    State(served): State<Arc<Served>>,
    Path(metric): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let served = &*served;
    let (window, scope) = match list_of(served, &metric, &params) {
        Ok(list) => list,
        Err(refusal) => return refusal.answer(served),
    };
    let history = match history_of(served) {
        Ok(history) => history,
        Err(refusal) => return refusal.answer(served),
    };
    let limit = match params.get("limit").map(|l| l.parse::<usize>()) {
        None => 100,
        Some(Ok(l)) if (1..=MAX_HISTORY).contains(&l) => l,
        Some(_) => {
            return error(
                served,
                StatusCode::BAD_REQUEST,
                format!("limit must be an integer between 1 and {MAX_HISTORY}"),
            );
        }
    };
    let read = || -> Result<Vec<serde_json::Value>, String> {
        let mut out = Vec::new();
        for version in history
            .versions(window, scope)?
            .into_iter()
            .rev()
            .take(limit)
        {
            if let Some(r) = history.version(window, scope, version)? {
                out.push(json!({
                    "version": r.version,
                    "asOf": r.as_of,
                    "windowStart": r.window_start,
                    "windowEnd": r.window_end,
                    "watermark": r.watermark,
                    "exactUntil": r.exact_until,
                    "items": r.items.len(),
                    "inputRange": r.input_range,
                }));
            }
        }
        Ok(out)
    };
    match read() {
        Ok(versions) => {
            served.count(StatusCode::OK);
            let served_version = served.get(window, scope).map(|e| e.record.version);
            axum::Json(json!({
                "metric": served.metric,
                "window": window,
                "scope": scope,
                "served": served_version,
                "versions": versions,
            }))
            .into_response()
        }
        Err(e) => error(
            served,
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read the stored versions: {e}"),
        ),
    }
}

/// Most versions one history answer lists.
pub const MAX_HISTORY: usize = 10_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_of_finds_the_newest_version_published_at_or_before_it() {
        // Versions 3..=7 published at 30, 40, ..., 70; version 5 was deleted by retention.
        let versions = [3, 4, 6, 7];
        let at = |v: u64| Ok(Some(v as i64 * 10));
        for (as_of, want) in [
            (29, None),
            (30, Some(3)),
            (45, Some(4)),
            (60, Some(6)),
            (99, Some(7)),
        ] {
            assert_eq!(
                version_as_of(&versions, as_of, at),
                Ok(want),
                "asOf {as_of}"
            );
        }
        assert_eq!(version_as_of(&[], 10, at), Ok(None));
    }
}
