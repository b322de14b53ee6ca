//! `topk worker`: the counting worker the operator's StatefulSet runs (see `topk_worker`).

use std::path::PathBuf;

use clap::Args;

use crate::dataplane::{DataPlaneArgs, millis};
use crate::error::CliError;

#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub common: DataPlaneArgs,
    /// With --assignment-file: where to write the applied assignment version.
    #[arg(long)]
    pub report_file: Option<PathBuf>,
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

pub async fn worker(args: WorkerArgs) -> Result<(), CliError> {
    let common = &args.common;
    let loaded = common.config.load()?;
    let ordinal = common.ordinal()?;
    let mut settings = topk_worker::settings(
        &loaded.name,
        &loaded.spec,
        &common.config.namespace,
        ordinal,
        loaded.version,
    )?;
    if let Some(bootstrap) = &common.config.bootstrap {
        settings.bootstrap = bootstrap.clone();
    }
    settings.state_dir = common.state_dir.clone();
    settings.checkpoint_every = millis(args.checkpoint_interval);
    settings.snapshot_every = millis(args.snapshot_interval);
    settings.idle_timeout = millis(args.idle_timeout);
    settings.handoff_wait = millis(args.handoff_wait);
    let control = common.control(args.report_file.clone()).await?;
    let listener = common.bind().await?;
    tracing::info!("worker {ordinal} of {}", loaded.name);
    topk_worker::run(settings, control, listener).await?;
    Ok(())
}
