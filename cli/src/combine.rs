//! `topk combine`: a combiner the operator's StatefulSet runs for an input that is not keyed
//! for topk (see `topk_combiner`).

use clap::Args;

use crate::dataplane::{ConfigArgs, ordinal};
use crate::error::CliError;

#[derive(Args)]
pub struct CombineArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// This combiner's ordinal (default: the suffix of POD_NAME, as in a StatefulSet): it
    /// reads the input partitions p with p mod combiners.replicas = ordinal.
    #[arg(long)]
    pub ordinal: Option<u32>,
    /// Address of the probe and metrics endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: String,
}

pub async fn combine(args: CombineArgs) -> Result<(), CliError> {
    let (config, kafka) = args.config.load()?;
    config.needs_input("combine")?;
    let ordinal = ordinal(args.ordinal)?;
    let settings = topk_combiner::settings(&config, ordinal, kafka)?;
    let (listener, addr) = crate::server::bind(&args.listen).await?;
    tracing::info!("listening on http://{addr}");
    tracing::info!(
        "combiner {ordinal} of {}: {} -> {}",
        config.name,
        settings.input_topic,
        settings.combine.topics.partials
    );
    topk_combiner::run(settings, listener).await?;
    Ok(())
}
