//! `topk reducer`: merges the workers' summaries into versioned rankings and serves them
//! (see `topk_reducer`); the operator's reducer StatefulSet runs it.

use clap::Args;
use topk_api::dataplane::std_duration;
use topk_reducer::StatusTarget;

use crate::dataplane::DataPlaneArgs;
use crate::error::CliError;

#[derive(Args)]
pub struct ReducerArgs {
    #[command(flatten)]
    pub common: DataPlaneArgs,
    /// Outside a cluster: the workers' base URLs by ordinal (comma-separated), asked for point
    /// counts. In a cluster the reducer finds each worker pod under its headless Service.
    #[arg(long, value_delimiter = ',')]
    pub worker_urls: Vec<String>,
}

pub async fn reducer(args: ReducerArgs) -> Result<(), CliError> {
    let common = &args.common;
    let (config, kafka) = common.config.load()?;
    let mut settings = topk_reducer::settings(&config, kafka.internal);
    settings.state_dir = common.state_dir.clone();
    settings.replica = common.ordinal().unwrap_or(0);
    // A global metric on another cluster: its clients connect the way the config says.
    if let (Some(output), Some(cluster)) = (
        settings.region_output.as_mut(),
        config.region.as_ref().and_then(|r| r.cluster.as_ref()),
    ) {
        output.kafka = topk_runtime::cluster_properties(cluster, &common.config.kafka_secrets)?;
    }
    let control = common.control(&config, None).await?;
    if let (topk_runtime::ControlPlane::Files { .. }, Some(points)) =
        (&control, settings.point_counts.as_mut())
    {
        if args.worker_urls.is_empty() {
            settings.point_counts = None;
        } else {
            points.workers = topk_reducer::points::WorkerUrls::Listed(args.worker_urls.clone());
        }
    }
    // One writer is enough and avoids replicas fighting over the same fields.
    let status = match (&control, common.ordinal().unwrap_or(0)) {
        (topk_runtime::ControlPlane::Kubernetes { client, namespace }, 0) => Some(StatusTarget {
            client: client.clone(),
            namespace: namespace.clone(),
            name: config.name.clone(),
            every: std_duration(config.reducer.status_interval),
        }),
        _ => None,
    };
    let listener = common.bind().await?;
    tracing::info!("reducer of {}", config.name);
    let config_file = common.config.config.clone();
    topk_reducer::run(settings, control, config_file, status, listener).await?;
    Ok(())
}
