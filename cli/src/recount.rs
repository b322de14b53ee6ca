//! `topk recount`: the exact recount of one closed hour (see `topk_recount`); the operator's
//! hourly Jobs run it. Prints the hour's manifest as one JSON line, and writes it to the
//! termination log so that it is in the Pod's status.

use std::path::PathBuf;

use clap::Args;
use topk_engine::event::parse_rfc3339_ms;

use crate::dataplane::ConfigArgs;
use crate::error::CliError;

#[derive(Args)]
pub struct RecountArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Start of the hour to recount, RFC 3339 (e.g. 2026-09-01T19:00:00Z).
    #[arg(long)]
    pub hour: String,
    /// Scratch space for counts and event ids beyond memory (emptied first).
    #[arg(long, default_value = "/var/lib/topk/recount")]
    pub spill_dir: PathBuf,
    /// Where the manifest also goes when that file's directory exists (Kubernetes shows it
    /// as the container's termination message).
    #[arg(long, default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
}

pub async fn recount(args: RecountArgs) -> Result<(), CliError> {
    let (config, kafka) = args.config.load()?;
    config.needs_input("recount")?;
    let hour = parse_rfc3339_ms(&args.hour).ok_or_else(|| {
        CliError::Usage(format!(
            "--hour {:?} is not an RFC 3339 time (e.g. 2026-09-01T19:00:00Z)",
            args.hour
        ))
    })?;
    let mut settings = topk_recount::settings(&config, hour, kafka)?;
    settings.spill_dir = args.spill_dir;
    let manifest = tokio::task::spawn_blocking(move || topk_recount::recount(&settings))
        .await
        .map_err(|e| CliError::Usage(e.to_string()))??;
    let line = serde_json::to_string(&manifest).unwrap_or_default();
    tracing::info!(
        hour = manifest.hour,
        read = manifest.events_read,
        counted = manifest.counted,
        duplicates = manifest.duplicates,
        keys = manifest.keys,
        duration_ms = manifest.duration_ms,
        "hour recounted"
    );
    println!("{line}");
    if args
        .termination_log
        .parent()
        .is_some_and(|dir| dir.is_dir())
        && let Err(err) = std::fs::write(&args.termination_log, &line)
    {
        tracing::warn!(%err, "cannot write the termination log");
    }
    Ok(())
}
