//! `topk ingest`: the HTTP ingest gateway (see `topk_gateway`) for the metric of a config.

use clap::Args;

use crate::dataplane::ConfigArgs;
use crate::error::CliError;

#[derive(Args)]
pub struct IngestArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Address of `POST /v1/events` and the probe and metrics endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// Largest request body, in bytes (larger: 413). Default: the config's
    /// `ingest.maxRequestBytes`.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Most events in one request (more: 413). Default: the config's
    /// `ingest.maxEventsPerRequest`.
    #[arg(long)]
    pub max_events: Option<usize>,
    /// Records the producer may hold unacknowledged (beyond: 429 with Retry-After).
    #[arg(long, default_value_t = 100_000)]
    pub queue_capacity: usize,
    /// How long a record may wait for the brokers before its event is `failed` (503).
    #[arg(long, default_value = "30s", value_parser = crate::parse_duration)]
    pub delivery_timeout: topk_api::Duration,
}

pub async fn ingest(args: IngestArgs) -> Result<(), CliError> {
    let mut config = topk_runtime::load_config(&args.config.config)?;
    config.needs_input("ingest")?;
    // It only produces to the input topic: the internal cluster's credentials are not mounted.
    config.kafka = config.kafka.input_only();
    let kafka = topk_runtime::kafka_properties(&config, &args.config.kafka_secrets)?;
    let mut settings = topk_gateway::GatewaySettings::new(&config, kafka.input);
    if let Some(bytes) = args.max_body_bytes {
        settings.max_body_bytes = bytes;
    }
    if let Some(events) = args.max_events {
        settings.max_events = events;
    }
    settings.queue_capacity = args.queue_capacity;
    settings.delivery_timeout =
        std::time::Duration::from_millis(args.delivery_timeout.as_millis().max(1) as u64);
    let (listener, addr) = crate::server::bind(&args.listen).await?;
    tracing::info!(
        "ingest gateway of {} on http://{addr}/v1/events, producing to {}",
        config.name,
        settings.topic
    );
    topk_gateway::run(settings, listener).await?;
    Ok(())
}
