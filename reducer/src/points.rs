//! Point counts through the reducer: it holds only each shard's top, so it asks the workers
//! owning the keys' shards (per the assignment table), all at once, and merges their answers.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::Uri;
use futures::FutureExt;
use futures::future::{BoxFuture, try_join_all};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use topk_api::assignment::AssignmentTable;
use topk_api::frequency::{FrequencyAnswer, merge_answers, plan_by_owner};
use topk_api::names::{HTTP_PORT, Names};
use topk_engine::EngineConfig;
use topk_engine::event::format_rfc3339_ms;
use topk_engine::partition::shard_for;
use topk_query::{PointCounts, Unanswered};
use topk_runtime::now_ms;

/// How a worker's answer is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerUrls {
    /// In a cluster: each worker pod's name under the workers' headless Service.
    Pods { service: String },
    /// Base URLs by ordinal (outside a cluster).
    Listed(Vec<String>),
}

impl WorkerUrls {
    /// The pods of metric `name`'s worker StatefulSet.
    pub fn pods(name: &str) -> Self {
        Self::Pods {
            service: Names::of(name).worker,
        }
    }

    pub fn of(&self, ordinal: u32) -> Option<String> {
        match self {
            Self::Pods { service } => {
                Some(format!("http://{service}-{ordinal}.{service}:{HTTP_PORT}"))
            }
            Self::Listed(urls) => urls
                .get(ordinal as usize)
                .map(|u| u.trim_end_matches('/').to_owned()),
        }
    }
}

/// A worker's answer is a few hundred bytes per key; more is refused.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// How long the reducer waits for the workers.
const WORKER_WAIT: Duration = Duration::from_secs(3);

/// Asks the owning workers.
pub struct WorkerPointCounts {
    cfg: EngineConfig,
    tables: watch::Receiver<Option<AssignmentTable>>,
    urls: WorkerUrls,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl WorkerPointCounts {
    pub fn new(
        cfg: EngineConfig,
        tables: watch::Receiver<Option<AssignmentTable>>,
        urls: WorkerUrls,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        Self {
            cfg,
            tables,
            urls,
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .build(connector),
        }
    }
}

impl PointCounts for WorkerPointCounts {
    fn counts(
        &self,
        window: String,
        scope: String,
        keys: Vec<String>,
    ) -> BoxFuture<'static, Result<FrequencyAnswer, Unanswered>> {
        let asks = self.plan(&window, &scope, &keys);
        let head = FrequencyAnswer {
            metric: self.cfg.metric.clone(),
            window,
            scope,
            mode: self.cfg.mode.name().to_owned(),
            watermark: None,
            as_of: String::new(),
            items: Vec::new(),
            not_owned: Vec::new(),
        };
        let client = self.client.clone();
        async move {
            let asks = asks?;
            let answers = try_join_all(asks.into_iter().map(|(ordinal, uri)| {
                let client = client.clone();
                async move { ask(&client, ordinal, uri).await }
            }))
            .await?;
            let mut merged = merge_answers(&keys, head, answers).map_err(|shards| {
                Unanswered::unavailable(format!(
                    "shards {shards:?} are moving between workers; retry"
                ))
            })?;
            merged.as_of = format_rfc3339_ms(now_ms());
            Ok(merged)
        }
        .boxed()
    }
}

impl WorkerPointCounts {
    /// The request to each worker that owns some of `keys`' shards.
    fn plan(
        &self,
        window: &str,
        scope: &str,
        keys: &[String],
    ) -> Result<Vec<(u32, Uri)>, Unanswered> {
        let table = self.tables.borrow().clone().ok_or_else(|| {
            Unanswered::unavailable("no shard assignment known yet; retry".to_owned())
        })?;
        let (metric, shards) = (&self.cfg.metric, self.cfg.shards);
        let plan = plan_by_owner(keys, &table, |key| shard_for(metric, scope, key, shards))
            .map_err(|shard| {
                Unanswered::unavailable(format!("shard {shard} has no owner yet; retry"))
            })?;
        plan.into_iter()
            .map(|(ordinal, keys)| {
                let base = self.urls.of(ordinal).ok_or_else(|| {
                    Unanswered::unavailable(format!(
                        "this reducer knows no address of worker {ordinal} (it has --worker-urls for fewer workers)"
                    ))
                })?;
                let mut query: Vec<(&str, &str)> = vec![("window", window), ("scope", scope)];
                query.extend(keys.iter().map(|k| ("key", k.as_str())));
                let query = serde_urlencoded::to_string(&query)
                    .map_err(|e| Unanswered::unavailable(format!("cannot encode the request: {e}")))?;
                let path: String =
                    url_path_segment(metric);
                let uri: Uri = format!("{base}/v1/frequency/{path}?{query}")
                    .parse()
                    .map_err(|e| Unanswered::unavailable(format!("bad address of worker {ordinal}: {e}")))?;
                Ok((ordinal, uri))
            })
            .collect()
    }
}

/// `segment` percent-encoded for a URL path.
fn url_path_segment(segment: &str) -> String {
    // Everything but unreserved characters is encoded (form encoding's `+` for space excepted).
    serde_urlencoded::to_string([("", segment)])
        .map(|s| s.trim_start_matches('=').replace('+', "%20"))
        .unwrap_or_default()
}

async fn ask(
    client: &Client<HttpConnector, Empty<Bytes>>,
    ordinal: u32,
    uri: Uri,
) -> Result<FrequencyAnswer, Unanswered> {
    let failed =
        |why: String| Unanswered::unavailable(format!("worker {ordinal} did not answer: {why}"));
    // The whole answer, body included, within the wait: a worker that stalls mid-body must
    // not hold the request.
    let answer = async {
        let response = client.get(uri).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body) = tokio::time::timeout(WORKER_WAIT, answer)
        .await
        .map_err(|_| failed(format!("no answer within {WORKER_WAIT:?}")))?
        .map_err(failed)?;
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        return Err(failed(format!("{status}: {message}")));
    }
    serde_json::from_slice(&body).map_err(|e| failed(format!("unreadable answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_pods_are_named_under_their_headless_service() {
        assert_eq!(
            WorkerUrls::pods("hot-tenants").of(2).as_deref(),
            Some("http://hot-tenants-worker-2.hot-tenants-worker:8080")
        );
        let listed = WorkerUrls::Listed(vec!["http://127.0.0.1:1/".into()]);
        assert_eq!(listed.of(0).as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!(listed.of(1), None);
    }

    #[tokio::test]
    async fn a_worker_that_stalls_mid_answer_is_given_up_on_in_time() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let address = listener.local_addr().expect("address");
        // Headers at once, then a tenth of the body, then nothing (the connection stays open
        // until the test ends).
        std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().expect("accept");
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request);
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"counts\"")
                .expect("write");
            std::thread::sleep(WORKER_WAIT * 4);
        });
        let client = Client::builder(TokioExecutor::new()).build_http();
        let uri: Uri = format!("http://{address}/v1/frequency/plays?key=a")
            .parse()
            .expect("uri");
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(WORKER_WAIT * 3, ask(&client, 0, uri)).await;
        let took = started.elapsed();
        let refused = answer
            .expect("ask gave up by itself")
            .expect_err("no answer");
        assert!(
            format!("{refused:?}").contains("no answer within"),
            "{refused:?}"
        );
        assert!(took < WORKER_WAIT * 2, "{took:?}");
    }

    #[test]
    fn metric_names_are_encoded_for_the_path() {
        assert_eq!(url_path_segment("a b/c"), "a%20b%2Fc");
        assert_eq!(url_path_segment("plays"), "plays");
    }
}
