//! The query API: the latest list of every (window, scope), rendered once when published and
//! served from memory. The reducer pods and `topk run` serve their lists through these routes;
//! neither depends on the other for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

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

use prometheus_client::encoding::EncodeLabelSet;

/// The label of the responses counter: the HTTP status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: u16,
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
    /// Responses by status code; registered by whoever exports metrics.
    pub requests: Family<CodeLabel, Counter>,
}

impl Served {
    pub fn new(metric: &str, windows: Vec<String>, k: usize) -> Self {
        Self {
            metric: metric.to_owned(),
            stale: RwLock::new(vec![false; windows.len()]),
            windows,
            k,
            lists: RwLock::default(),
            requests: Family::default(),
        }
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

/// `GET /v1/rankings` and `GET /v1/rankings/{metric}?window=&scope=&k=`.
pub fn query_router(served: Arc<Served>) -> Router {
    Router::new()
        .route("/v1/rankings", get(index))
        .route("/v1/rankings/{metric}", get(ranking))
        .with_state(served)
}

fn error(served: &Served, status: StatusCode, message: String) -> Response {
    served.count(status);
    (status, axum::Json(json!({ "error": message }))).into_response()
}

async fn index(State(served): State<Arc<Served>>) -> Response {
    served.count(StatusCode::OK);
    axum::Json(json!({ "rankings": served.index() })).into_response()
}

async fn ranking(
    State(served): State<Arc<Served>>,
    Path(metric): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let served = &*served;
    if metric != served.metric {
        return error(
            served,
            StatusCode::NOT_FOUND,
            format!(
                "unknown metric {metric:?}; this server ranks {:?}",
                served.metric
            ),
        );
    }
    let window = match params.get("window") {
        Some(w) if served.windows.contains(w) => w.as_str(),
        Some(w) => {
            return error(
                served,
                StatusCode::BAD_REQUEST,
                format!("unknown window {w:?}; choose one of {:?}", served.windows),
            );
        }
        None => served.windows.first().map_or("", String::as_str),
    };
    let scope = params.get("scope").map_or("", String::as_str);
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
    let Some(entry) = served.get(window, scope) else {
        return error(
            served,
            StatusCode::NOT_FOUND,
            format!("no ranking published yet for window {window:?} and scope {scope:?}"),
        );
    };
    let record = &entry.record;
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
        (header::CACHE_CONTROL, "public, max-age=1".to_owned()),
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
    let body = if shown == record.items.len() {
        Body::from(entry.body.clone())
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
