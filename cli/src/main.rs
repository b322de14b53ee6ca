//! `topk`: the Top-K engine in one process.

mod combine;
mod dataplane;
mod demo;
mod error;
mod gateway;
mod ingest;
mod metrics;
mod produce;
mod recount;
mod reducer;
mod run;
mod server;
mod worker;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

// mimalloc for Rust and, through its `override` feature, for librdkafka and RocksDB: the
// worker frees each consumed Kafka message on its counting thread, and glibc's arena lock
// made that thread wait for the fetch thread (measured in `worker/benches/throughput.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "topk",
    version,
    about = "Sliding-window Top-K: which keys have the largest counts"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Count JSON-lines events from a file or stdin and serve the rankings over HTTP.
    Run(run::RunArgs),
    /// Generate a skewed stream with a trending key, count it, serve it, print the top 5.
    Demo(demo::DemoArgs),
    /// Count the shards assigned to this worker on Kafka (what the worker pods run).
    Worker(worker::WorkerArgs),
    /// Merge the workers' summaries into versioned rankings and serve them (the reducer pods).
    Reducer(reducer::ReducerArgs),
    /// Recount one closed hour exactly from the input topic (the hourly Jobs).
    Recount(recount::RecountArgs),
    /// Send JSON-lines events to a Kafka input topic, keyed and stamped as topk expects.
    Produce(produce::ProduceArgs),
    /// Take events over HTTP (`POST /v1/events`) and produce them to the metric's input topic.
    Ingest(gateway::IngestArgs),
    /// Sum an input not keyed for topk per key and bucket, and write the sums keyed for the
    /// workers (the combiner pods of `source.partitionedBy: any`).
    Combine(combine::CombineArgs),
    /// Print the TopKMetric CustomResourceDefinition (YAML), generated from the Rust types.
    Crd {
        /// Print the Helm chart's template instead (gated by `crds.install`, kept on uninstall).
        #[arg(long)]
        helm: bool,
    },
}

/// Durations as in manifests: `500ms`, `10s`, `5m`, `1h`.
pub(crate) fn parse_duration(text: &str) -> Result<topk_api::Duration, String> {
    topk_api::Duration::parse(text).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(args).await,
        Command::Demo(args) => demo::demo(args).await,
        Command::Worker(args) => worker::worker(args).await,
        Command::Reducer(args) => reducer::reducer(args).await,
        Command::Recount(args) => recount::recount(args).await,
        Command::Produce(args) => produce::produce(args).await,
        Command::Ingest(args) => gateway::ingest(args).await,
        Command::Combine(args) => combine::combine(args).await,
        Command::Crd { helm } => if helm {
            topk_api::crd::crd_helm_template()
        } else {
            topk_api::crd::crd_yaml()
        }
        .map(|yaml| print!("{yaml}"))
        .map_err(error::CliError::from),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("topk: {err}");
            std::process::ExitCode::from(2)
        }
    }
}
