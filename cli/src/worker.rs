//! `topk worker`: the counting worker the operator's StatefulSet runs (see `topk_worker`).

use std::path::PathBuf;

use clap::Args;
use topk_worker::ControlPlane;

use crate::error::CliError;

#[derive(Args)]
pub struct WorkerArgs {
    /// The rendered config (`metric.json` from the operator) or a TopKMetric manifest.
    #[arg(long)]
    pub config: PathBuf,
    /// The TopKMetric's name (default: the one in the config).
    #[arg(long)]
    pub metric_name: Option<String>,
    /// Namespace of the TopKMetric (names the internal topics and ConfigMaps).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// This worker's ordinal (default: the suffix of POD_NAME, as in a StatefulSet).
    #[arg(long)]
    pub ordinal: Option<u32>,
    /// Read the assignment table from this file instead of the API (outside a cluster).
    #[arg(long)]
    pub assignment_file: Option<PathBuf>,
    /// With --assignment-file: where to write the applied assignment version.
    #[arg(long)]
    pub report_file: Option<PathBuf>,
    /// RocksDB checkpoints live here.
    #[arg(long, default_value = "/var/lib/topk")]
    pub state_dir: PathBuf,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// Overrides the config's Kafka bootstrap servers.
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// How often shard state and offsets are checkpointed.
    #[arg(long, default_value = "5s", value_parser = crate::parse_duration)]
    pub checkpoint_interval: topk_api::Duration,
    /// How often shard snapshots also go to the handoff topic.
    #[arg(long, default_value = "60s", value_parser = crate::parse_duration)]
    pub snapshot_interval: topk_api::Duration,
    /// A caught-up shard with no new event for this long has its watermark moved by the clock.
    #[arg(long, default_value = "30s", value_parser = crate::parse_duration)]
    pub idle_timeout: topk_api::Duration,
    /// How long a worker gaining a moved shard waits for the previous owner's release snapshot.
    #[arg(long, default_value = "30s", value_parser = crate::parse_duration)]
    pub handoff_wait: topk_api::Duration,
}

fn millis(d: topk_api::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis().max(1) as u64)
}

pub async fn worker(args: WorkerArgs) -> Result<(), CliError> {
    let (config_name, spec, version) = topk_worker::load_config(&args.config)?;
    let name = args.metric_name.unwrap_or(config_name);
    let ordinal = match args.ordinal {
        Some(o) => o,
        None => std::env::var("POD_NAME")
            .ok()
            .and_then(|pod| pod.rsplit('-').next()?.parse().ok())
            .ok_or_else(|| {
                CliError::Usage("set --ordinal or POD_NAME (NAME-worker-N)".to_owned())
            })?,
    };
    let mut settings = topk_worker::settings(&name, &spec, &args.namespace, ordinal, version)?;
    if let Some(bootstrap) = args.bootstrap {
        settings.bootstrap = bootstrap;
    }
    settings.state_dir = args.state_dir;
    settings.checkpoint_every = millis(args.checkpoint_interval);
    settings.snapshot_every = millis(args.snapshot_interval);
    settings.idle_timeout = millis(args.idle_timeout);
    settings.handoff_wait = millis(args.handoff_wait);
    let control = match args.assignment_file {
        Some(assignment) => ControlPlane::Files {
            assignment,
            report: args.report_file,
        },
        None => ControlPlane::Kubernetes {
            client: kube::Client::try_default()
                .await
                .map_err(|e| CliError::Usage(format!("cannot reach the Kubernetes API ({e}); outside a cluster pass --assignment-file")))?,
            namespace: args.namespace,
        },
    };
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|source| CliError::Bind {
            addr: args.listen.clone(),
            source,
        })?;
    let addr = listener.local_addr().map_err(CliError::Serve)?;
    tracing::info!("worker {ordinal} of {name} listening on http://{addr}");
    topk_worker::run(settings, control, listener).await?;
    Ok(())
}
