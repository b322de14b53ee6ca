//! `topk-operator`: reconciles TopKMetric resources.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use topk_operator::builders::Settings;
use topk_operator::decide;
use topk_operator::leader::LeaderElector;
use topk_operator::reconcile::{self, Context};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "topk-operator",
    version,
    about = "Reconciles TopKMetric resources"
)]
struct Args {
    /// Address of /metrics and /healthz.
    #[arg(long, default_value = "0.0.0.0:9090")]
    listen: String,
    /// Image of the data plane (worker, reducer).
    #[arg(long, env = "TOPK_IMAGE")]
    image: Option<String>,
    /// Size of each worker and reducer state volume (checkpoints, ranking store).
    #[arg(long, default_value = "1Gi")]
    state_storage: String,
    /// Seconds departing workers get to report their shards released before they are removed.
    #[arg(long, default_value_t = 30)]
    drain_seconds: u64,
    /// Seconds a rescale step may wait (e.g. for new workers to be ready) before the metric
    /// reports Degraded.
    #[arg(long, default_value_t = 600)]
    rescale_deadline_seconds: u64,
    /// Seconds finished recount Jobs are kept (for their logs).
    #[arg(long, default_value_t = 86_400)]
    recount_ttl_seconds: u64,
    /// Namespace of the leader-election Lease; without it the operator runs unelected (one
    /// replica only).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "topk-operator")]
    lease_name: String,
    /// Reconcile TopKMetrics only in these namespaces (comma-separated); the operator then
    /// needs Roles in them only. Empty: every namespace (a ClusterRole).
    #[arg(long, env = "TOPK_WATCH_NAMESPACES", value_delimiter = ',')]
    watch_namespaces: Vec<String>,
    /// Where new TopKMetrics' internal topics go when their spec has no `internalKafka`: the
    /// same fields as JSON (`{"bootstrapServers": ..., "tls": ..., "authentication": ...}`,
    /// Secrets read in each metric's namespace). Unset: the input's cluster.
    #[arg(long, env = "TOPK_INTERNAL_KAFKA")]
    internal_kafka: Option<String>,
    /// This replica's identity in the Lease.
    #[arg(long, env = "POD_NAME", default_value = "topk-operator")]
    identity: String,
}

/// The leader Lease's duration: a follower takes over a lease left unrenewed this long.
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the leader renews the lease and a follower tries to take it.
const LEASE_RETRY: Duration = Duration::from_secs(2);

/// SIGTERM (how Kubernetes stops a pod) or Ctrl-C, named.
async fn stop_signal() -> &'static str {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(%err, "cannot watch for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = terminate => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "interrupt",
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(err) => {
            eprintln!("topk-operator: cannot reach the Kubernetes API: {err}");
            return std::process::ExitCode::from(2);
        }
    };
    let internal_kafka = match args.internal_kafka.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => match decide::internal_kafka_default(text) {
            Ok(cluster) => Some(cluster),
            Err(err) => {
                eprintln!("topk-operator: --internal-kafka: {err}");
                return std::process::ExitCode::from(2);
            }
        },
    };
    let mut settings = Settings {
        internal_kafka,
        state_storage: args.state_storage,
        drain: Duration::from_secs(args.drain_seconds),
        rescale_deadline: Duration::from_secs(args.rescale_deadline_seconds),
        recount_ttl: Duration::from_secs(args.recount_ttl_seconds),
        watch_namespaces: args
            .watch_namespaces
            .iter()
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty())
            .collect(),
        ..Settings::default()
    };
    if let Some(image) = args.image {
        settings.image = image;
    }
    let ctx = Context::new(client, settings);
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(err) => {
            eprintln!("topk-operator: cannot listen on {}: {err}", args.listen);
            return std::process::ExitCode::from(2);
        }
    };
    let metrics_ctx = ctx.clone();
    // Ready as soon as it serves: whether this replica leads is the Lease's business.
    let app = topk_runtime::probes::router(topk_runtime::probes::Probes {
        metrics: Arc::new(move || metrics_ctx.metrics.encode()),
        ready: Arc::new(|| true),
        waiting: "",
    });
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(%err, "metrics server stopped");
        }
    });
    let watched = &ctx.settings.watch_namespaces;
    if watched.is_empty() {
        tracing::info!("topk-operator started, watching every namespace");
    } else {
        tracing::info!(namespaces = %watched.join(","), "topk-operator started, namespaced");
    }
    let elector = args.lease_namespace.map(|ns| {
        Arc::new(LeaderElector::new(
            ctx.client.clone(),
            &ns,
            &args.lease_name,
            &args.identity,
            LEASE_DURATION,
        ))
    });
    let controller = async {
        match &elector {
            Some(elector) => {
                reconcile::run_when_leader(ctx, elector.clone(), LEASE_RETRY).await;
            }
            None => {
                tracing::warn!(
                    "no --lease-namespace/POD_NAMESPACE: running without leader election"
                );
                reconcile::run(ctx).await;
            }
        }
    };
    tokio::select! {
        _ = controller => {}
        signal = stop_signal() => tracing::info!(signal, "stopping"),
    }
    // The controller has stopped acting: hand the lease to a follower now rather than after
    // it expires (every rollout of the operator would otherwise pause reconciling).
    if let Some(elector) = elector {
        match tokio::time::timeout(LEASE_RETRY, elector.release()).await {
            Ok(Ok(())) => tracing::info!("released the leader Lease"),
            Ok(Err(err)) => tracing::warn!(%err, "could not release the leader Lease"),
            Err(_) => tracing::warn!("releasing the leader Lease timed out"),
        }
    }
    std::process::ExitCode::SUCCESS
}
