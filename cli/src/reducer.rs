//! `topk reducer`: merges the workers' summaries into versioned rankings and serves them
//! (see `topk_reducer`); the operator's reducer StatefulSet runs it.

use clap::Args;
use topk_reducer::StatusTarget;

use crate::dataplane::{DataPlaneArgs, millis};
use crate::error::CliError;

#[derive(Args)]
pub struct ReducerArgs {
    #[command(flatten)]
    pub common: DataPlaneArgs,
    /// A window's lists are marked stale when nothing newer was published for this long
    /// (or two of its buckets, if longer).
    #[arg(long, default_value = "2m", value_parser = crate::parse_duration)]
    pub stale_after: topk_api::Duration,
    /// Versions kept per list, whatever their age.
    #[arg(long, default_value_t = 100)]
    pub keep_versions: usize,
    /// Older versions than this are deleted (beyond the newest and the served one).
    #[arg(long, default_value = "24h", value_parser = crate::parse_duration)]
    pub keep_for: topk_api::Duration,
    /// How often the ranking summary is written to the TopKMetric status at most (replica 0
    /// only; never outside a cluster).
    #[arg(long, default_value = "5s", value_parser = crate::parse_duration)]
    pub status_interval: topk_api::Duration,
}

pub async fn reducer(args: ReducerArgs) -> Result<(), CliError> {
    let common = &args.common;
    let loaded = common.config.load()?;
    let mut settings = topk_reducer::settings(
        &loaded.name,
        &loaded.spec,
        &common.config.namespace,
        loaded.version,
    )?;
    if let Some(bootstrap) = &common.config.bootstrap {
        settings.bootstrap = bootstrap.clone();
    }
    settings.state_dir = common.state_dir.clone();
    settings.stale_after = millis(args.stale_after);
    settings.keep_versions = args.keep_versions.max(1);
    settings.keep_for = millis(args.keep_for);
    let control = common.control(None).await?;
    // One writer is enough and avoids replicas fighting over the same fields.
    let status = match (&control, common.ordinal().unwrap_or(0)) {
        (topk_worker::ControlPlane::Kubernetes { client, namespace }, 0) => Some(StatusTarget {
            client: client.clone(),
            namespace: namespace.clone(),
            name: loaded.name.clone(),
            every: millis(args.status_interval),
        }),
        _ => None,
    };
    let listener = common.bind().await?;
    tracing::info!("reducer of {}", loaded.name);
    topk_reducer::run(settings, control, status, listener).await?;
    Ok(())
}
