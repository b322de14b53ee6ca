//! `topk worker`: the counting worker the operator's StatefulSet runs (see `topk_worker`).

use std::path::PathBuf;

use clap::Args;

use crate::dataplane::DataPlaneArgs;
use crate::error::CliError;

#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub common: DataPlaneArgs,
    /// With --assignment-file: where to write the applied assignment version (and, next to it
    /// as `FILE.shard-N-loss`, each shard's newest input loss).
    #[arg(long)]
    pub report_file: Option<PathBuf>,
}

pub async fn worker(args: WorkerArgs) -> Result<(), CliError> {
    let common = &args.common;
    let (config, kafka) = common.config.load()?;
    config.needs_input("worker")?;
    let ordinal = common.ordinal()?;
    let mut settings = topk_worker::settings(&config, ordinal, kafka)?;
    settings.state_dir = common.state_dir.clone();
    let control = common.control(&config, args.report_file.clone()).await?;
    let listener = common.bind().await?;
    tracing::info!("worker {ordinal} of {}", config.name);
    topk_worker::run(settings, control, listener).await?;
    Ok(())
}
