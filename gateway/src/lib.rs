//! The HTTP ingest gateway (`topk ingest`): services without a Kafka client send events with
//! `POST /v1/events`, as JSON lines or a JSON array. Each event is parsed and checked as the
//! workers check it (the same parser and reject reasons; lateness is left to the workers,
//! which know the watermark) and produced to the metric's input topic keyed
//! `metric|scope|key` with Kafka's murmur2 partitioner and stamped with its event time, by an
//! idempotent producer with `acks=all`. A request is answered once every event in it is
//! acknowledged by the brokers or has failed, with a result per event that was not
//! accepted: `accepted` means durable.
//!
//! Backpressure: when the producer's queue is full, the events not yet queued come back as
//! `retry` with `429 Too Many Requests` and `Retry-After`; events the brokers did not take in
//! time come back as `failed` with `503`. Bad events are the client's to fix, so they are
//! answered, counted by reason, and not written anywhere else.

mod body;
mod error;
mod metrics;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde::Serialize;
use topk_api::DataPlaneConfig;
use topk_api::kafka::KafkaProperties;
use topk_engine::event::parse_event;
use topk_engine::partition::message_key;
use topk_engine::pipeline::check_event;
use topk_engine::{EngineConfig, RejectReason};
use topk_runtime::now_ms;
use topk_runtime::probes::{self, CodeLabel, OutcomeLabel, Probes, ReasonLabel};

pub use body::{BodyError, BodyFormat, events};
pub use error::Error;
use metrics::Metrics;

/// What the gateway runs by.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub topic: String,
    /// The metric's counting contract: its name, key and scope bounds, clock skew.
    pub engine: EngineConfig,
    pub kafka: KafkaProperties,
    /// Largest request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// Most events in one request; more get 413.
    pub max_events: usize,
    /// Records the producer may hold unacknowledged; beyond it requests get 429.
    pub queue_capacity: usize,
    /// How long the producer keeps trying to deliver a record before it is `failed`.
    pub delivery_timeout: Duration,
}

impl GatewaySettings {
    /// The settings for the metric of `config`, producing with `kafka` (the input cluster's
    /// client properties).
    pub fn new(config: &DataPlaneConfig, kafka: KafkaProperties) -> Self {
        Self {
            topic: config.kafka.input_topic.clone(),
            engine: config.engine.clone(),
            kafka,
            max_body_bytes: config.ingest.max_request_bytes,
            max_events: config.ingest.max_events_per_request,
            queue_capacity: 100_000,
            delivery_timeout: Duration::from_secs(30),
        }
    }
}

/// What happened to one event of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged by the brokers.
    Accepted,
    /// Bad, for this reason (as the workers name it); sending it again will not help.
    Rejected(&'static str),
    /// Not queued: the producer's queue was full. Send it again after `Retry-After`.
    Retry,
    /// Queued but not delivered (brokers unreachable, timed out). Send it again.
    Failed,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Rejected(_) => "rejected",
            Outcome::Retry => "retry",
            Outcome::Failed => "failed",
        }
    }
}

/// A request's answer: how many events had each outcome, and one entry per event that was
/// not accepted (`index`: its position among the request's events, from 0; blank lines do
/// not count).
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Answer {
    pub accepted: usize,
    pub rejected: usize,
    pub retry: usize,
    pub failed: usize,
    pub errors: Vec<EventError>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct EventError {
    pub index: usize,
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

impl Answer {
    pub fn of(outcomes: &[Outcome]) -> Self {
        let count = |name: &str| outcomes.iter().filter(|o| o.name() == name).count();
        Self {
            accepted: count("accepted"),
            rejected: count("rejected"),
            retry: count("retry"),
            failed: count("failed"),
            errors: outcomes
                .iter()
                .enumerate()
                .filter(|(_, o)| **o != Outcome::Accepted)
                .map(|(index, o)| EventError {
                    index,
                    outcome: o.name(),
                    reason: match o {
                        Outcome::Rejected(reason) => Some(reason),
                        _ => None,
                    },
                })
                .collect(),
        }
    }

    /// 429 when some events must be sent again for backpressure, else 503 when some were
    /// not delivered, else 200 (bad events are answered per event, not by the status).
    pub fn status(&self) -> StatusCode {
        if self.retry > 0 {
            StatusCode::TOO_MANY_REQUESTS
        } else if self.failed > 0 {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        }
    }
}

/// Seconds a client should wait before sending `retry` or `failed` events again.
const RETRY_AFTER_SECONDS: &str = "1";

struct Gateway {
    settings: GatewaySettings,
    producer: FutureProducer,
    metrics: Metrics,
    ready: AtomicBool,
}

impl Gateway {
    fn new(settings: GatewaySettings) -> Result<Self, Error> {
        let mut config = topk_runtime::clients::keyed_producer(&settings.kafka, 5);
        config
            .set("acks", "all")
            .set(
                "queue.buffering.max.messages",
                settings.queue_capacity.to_string(),
            )
            .set(
                "message.timeout.ms",
                settings.delivery_timeout.as_millis().to_string(),
            );
        let producer: FutureProducer = config
            .create()
            .map_err(|e| Error::Kafka(settings.kafka.redact(&e.to_string())))?;
        Ok(Self {
            settings,
            producer,
            metrics: Metrics::default(),
            ready: AtomicBool::new(false),
        })
    }

    /// The outcome of each event: bad ones rejected at once, the rest queued until the queue
    /// is full (those after it come back as `retry`), then awaited.
    async fn ingest(&self, events: &[&str]) -> Vec<Outcome> {
        let now = now_ms();
        let engine = &self.settings.engine;
        let mut outcomes = vec![Outcome::Retry; events.len()];
        let mut queued = Vec::with_capacity(events.len());
        let mut queue_full = false;
        for (index, text) in events.iter().enumerate() {
            let event = match parse_event(text, engine.max_key_bytes)
                .and_then(|e| check_event(engine, &e, now, None).map(|()| e))
            {
                Ok(event) => event,
                Err(reason) => {
                    outcomes[index] = Outcome::Rejected(reason.as_str());
                    continue;
                }
            };
            if queue_full {
                continue;
            }
            let key = message_key(&event.metric, &event.scope, &event.key);
            let record = FutureRecord::to(&self.settings.topic)
                .key(&key)
                .payload(*text)
                .timestamp(event.time_ms);
            match self.producer.send_result(record) {
                Ok(delivery) => queued.push((index, delivery)),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    queue_full = true;
                }
                // Within the parser's 1 MiB but over the producer's `message.max.bytes`.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
                    outcomes[index] = Outcome::Rejected(RejectReason::OversizeEvent.as_str());
                }
                Err((err, _)) => {
                    tracing::warn!(%err, "event not queued");
                    outcomes[index] = Outcome::Failed;
                }
            }
        }
        for (index, delivery) in queued {
            outcomes[index] = match delivery.await {
                Ok(Ok(_)) => Outcome::Accepted,
                Ok(Err((
                    KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
                    _,
                ))) => Outcome::Rejected(RejectReason::OversizeEvent.as_str()),
                Ok(Err((err, _))) => {
                    tracing::warn!(%err, "event not delivered");
                    Outcome::Failed
                }
                Err(_) => Outcome::Failed,
            };
        }
        outcomes
    }

    fn record(&self, status: StatusCode, outcomes: &[Outcome], started: Instant) {
        let m = &self.metrics;
        m.requests
            .get_or_create(&CodeLabel {
                code: status.as_u16(),
            })
            .inc();
        for outcome in outcomes {
            m.events
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.name(),
                })
                .inc();
            if let Outcome::Rejected(reason) = outcome {
                m.events_rejected
                    .get_or_create(&ReasonLabel { reason })
                    .inc();
            }
        }
        m.request_seconds.observe(started.elapsed().as_secs_f64());
    }
}

async fn post_events(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let parsed = BodyFormat::from_content_type(content_type)
        .and_then(|format| events(&body, format, gateway.settings.max_events));
    let events = match parsed {
        Ok(events) => events,
        Err(err) => {
            let status = match err {
                BodyError::UnsupportedType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                BodyError::TooManyEvents { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::NotAnArray(_) | BodyError::NotText => StatusCode::BAD_REQUEST,
            };
            gateway.record(status, &[], started);
            let body = serde_json::json!({"error": err.to_string()});
            return (status, axum::Json(body)).into_response();
        }
    };
    let outcomes = gateway.ingest(&events).await;
    let answer = Answer::of(&outcomes);
    let status = answer.status();
    gateway.record(status, &outcomes, started);
    let mut response = (status, axum::Json(answer)).into_response();
    if status != StatusCode::OK {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from_static(RETRY_AFTER_SECONDS),
        );
    }
    response
}

/// The gateway's routes: `POST /v1/events`, and `/metrics`, `/healthz` and `/readyz`.
fn router(gateway: Arc<Gateway>) -> Router {
    let metrics_view = gateway.clone();
    let ready_view = gateway.clone();
    let probes = Probes {
        metrics: Arc::new(move || {
            metrics_view
                .metrics
                .producer_queue
                .set(metrics_view.producer.in_flight_count().into());
            metrics_view.metrics.encode()
        }),
        ready: Arc::new(move || ready_view.ready.load(Ordering::Relaxed)),
        waiting: "waiting for the input topic's metadata",
    };
    Router::new()
        .route("/v1/events", post(post_events))
        .layer(DefaultBodyLimit::max(gateway.settings.max_body_bytes))
        .with_state(gateway)
        .merge(probes::router(probes))
}

/// Serves on `listener` until SIGTERM or Ctrl-C, then delivers what is queued.
pub async fn run(
    settings: GatewaySettings,
    listener: tokio::net::TcpListener,
) -> Result<(), Error> {
    let gateway = Arc::new(Gateway::new(settings)?);
    tokio::spawn(await_topic(gateway.clone()));
    axum::serve(listener, router(gateway.clone()))
        .with_graceful_shutdown(topk_runtime::shutdown_signal())
        .await
        .map_err(Error::Io)?;
    let producer = gateway.producer.clone();
    tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(30)))
        .await
        .map_err(|e| Error::Kafka(e.to_string()))?
        .map_err(|e| Error::Kafka(e.to_string()))?;
    Ok(())
}

/// Marks the gateway ready once the brokers describe the input topic: until then it still
/// takes events (they wait in the queue), but a Service should send them elsewhere.
async fn await_topic(gateway: Arc<Gateway>) {
    loop {
        let probe = gateway.clone();
        let found = tokio::task::spawn_blocking(move || {
            let metadata = probe
                .producer
                .client()
                .fetch_metadata(Some(&probe.settings.topic), Duration::from_secs(5));
            match metadata {
                Ok(m) => m
                    .topics()
                    .iter()
                    .any(|t| t.error().is_none() && !t.partitions().is_empty()),
                Err(err) => {
                    tracing::warn!(%err, "cannot describe the input topic yet");
                    false
                }
            }
        })
        .await
        .unwrap_or(false);
        if found {
            gateway.ready.store(true, Ordering::Relaxed);
            tracing::info!(topic = %gateway.settings.topic, "ready");
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_says_what_the_client_must_do() {
        let ok = Answer::of(&[Outcome::Accepted, Outcome::Rejected("oversize_key")]);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!((ok.accepted, ok.rejected), (1, 1));
        assert_eq!(
            ok.errors,
            [EventError {
                index: 1,
                outcome: "rejected",
                reason: Some("oversize_key")
            }]
        );
        let full = Answer::of(&[Outcome::Accepted, Outcome::Failed, Outcome::Retry]);
        assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
        let down = Answer::of(&[Outcome::Failed, Outcome::Accepted]);
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(Answer::of(&[]).status(), StatusCode::OK);
    }
}
