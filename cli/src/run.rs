//! `topk run`: count a file or stdin in one process and serve the rankings.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use prometheus_client::metrics::family::Family;
use serde::Serialize;
use tokio::sync::watch;
use topk_api::{DEFAULT_MANIFEST, DataPlaneConfig, DenyList, RankingRecord, load_manifest};
use topk_engine::event::{MAX_EVENT_BYTES, RejectReason};
use topk_engine::{EngineConfig, Pipeline};

use crate::error::CliError;
use crate::ingest::{Ingestor, now_ms};
use crate::metrics::Metrics;
use crate::server::{self, AppState};
use topk_query::Served;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Json,
    Table,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// TopKMetric manifest (YAML). Without it, the embedded default (`api_requests`).
    #[arg(long, short = 'f')]
    pub file: Option<PathBuf>,
    /// JSON-lines input file, or `-` for stdin.
    #[arg(long, short = 'i', default_value = "-")]
    pub input: String,
    /// Address of the query API (`:0` picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Exit once the input ends, after printing every list.
    #[arg(long)]
    pub exit_at_end: bool,
    /// Format of the final report printed with --exit-at-end.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

/// What `--exit-at-end --output json` prints.
#[derive(Serialize)]
struct RunReport {
    rankings: Vec<RankingRecord>,
    accepted: u64,
    rejected: BTreeMap<&'static str, u64>,
    /// What dedupe made of the valid events (absent when it is off).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    dedupe: BTreeMap<&'static str, u64>,
}

/// Loads and validates a manifest (or the embedded default) into the config the data plane
/// runs by.
pub fn load_config(file: Option<&PathBuf>) -> Result<DataPlaneConfig, CliError> {
    let text = match file {
        Some(path) => std::fs::read_to_string(path).map_err(|source| CliError::ReadFile {
            path: path.display().to_string(),
            source,
        })?,
        None => DEFAULT_MANIFEST.to_owned(),
    };
    manifest_config(&text)
}

fn manifest_config(text: &str) -> Result<DataPlaneConfig, CliError> {
    Ok(DataPlaneConfig::from_metric(&load_manifest(text)?)?)
}

pub fn app_state(cfg: &EngineConfig) -> Arc<AppState> {
    // A head window refreshes its parent in a cluster's reducer; alone it is not a list.
    let windows: Vec<String> = (cfg.lists().into_iter())
        .filter(|w| w.head_of.is_none())
        .map(|w| w.name)
        .collect();
    let requests = Family::default();
    let served = Served::new(&cfg.metric, windows, cfg.k, requests.clone());
    let metrics = Metrics::new(requests);
    Arc::new(AppState {
        served: Arc::new(served),
        metrics,
    })
}

pub async fn run(args: RunArgs) -> Result<(), CliError> {
    let config = load_config(args.file.as_ref())?;
    config.needs_input("run")?;
    let name = config.name.clone();
    let state = app_state(&config.engine);
    let deny = config.deny.list(None);
    let (deny_tx, deny_rx) = watch::channel(Some(deny.clone()));
    let mut pipeline = Pipeline::new(config.engine)?;
    pipeline.set_deny(deny);
    if let Some(path) = args.file.clone() {
        // The manifest is read again every second: an edited denyKeys applies live.
        tokio::spawn(topk_runtime::control::poll_deny_list(
            path,
            manifest_config,
            deny_tx,
        ));
    }
    let (listener, addr) = server::bind(&args.listen).await?;
    tracing::info!("TopKMetric {name}: query API listening on http://{addr}");
    let server = tokio::spawn(server::serve(listener, state.clone()));

    let input = args.input.clone();
    let ingest_state = state.clone();
    let ingestor = tokio::task::spawn_blocking(move || {
        ingest(&input, Ingestor::new(pipeline, ingest_state), deny_rx)
    })
    .await
    .map_err(|e| CliError::Input(std::io::Error::other(e)))??;

    if args.exit_at_end {
        report(&ingestor, &state, args.output);
        return Ok(());
    }
    tracing::info!("input finished; serving the final lists until interrupted");
    let mut ingestor = ingestor;
    if let Some(mut points) = ingestor.take_points() {
        tokio::task::spawn_blocking(move || {
            while let Some(request) = points.blocking_recv() {
                ingestor.answer(request);
            }
        });
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(()),
        served = server => served.map_err(|e| CliError::Serve(std::io::Error::other(e)))?,
    }
}

fn ingest(
    input: &str,
    mut ingestor: Ingestor,
    mut deny: watch::Receiver<Option<DenyList>>,
) -> Result<Ingestor, CliError> {
    let reader: Box<dyn Read + Send> = if input == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(File::open(input).map_err(|source| CliError::ReadFile {
            path: input.to_owned(),
            source,
        })?)
    };
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let mut buf = Vec::with_capacity(4096);
    let started = Instant::now();
    let mut last_report = started;
    let mut lines: u64 = 0;
    let mut now = now_ms();
    loop {
        let line = read_line(&mut reader, &mut buf, MAX_EVENT_BYTES).map_err(CliError::Input)?;
        if line == Line::End {
            break;
        }
        lines += 1;
        // One atomic load: a slow stream picks up a changed deny list at its next line.
        if deny.has_changed().unwrap_or(false)
            && let Some(list) = deny.borrow_and_update().clone()
        {
            ingestor.set_deny(list);
        }
        if lines.is_multiple_of(1024) {
            now = now_ms();
            ingestor.answer_waiting();
            if lines.is_multiple_of(1 << 16) && last_report.elapsed().as_secs() >= 2 {
                last_report = Instant::now();
                progress(&ingestor, lines, started);
            }
        }
        if line == Line::TooLong {
            ingestor.refuse(RejectReason::OversizeEvent);
            continue;
        }
        match std::str::from_utf8(&buf) {
            Ok(line) => {
                ingestor.line(line.trim_end_matches(['\n', '\r']), now);
            }
            Err(_) => ingestor.refuse(RejectReason::InvalidJson),
        }
    }
    ingestor.finish(now_ms());
    if started.elapsed().as_secs() >= 2 {
        progress(&ingestor, lines, started);
    }
    Ok(ingestor)
}

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line, in the buffer with its line ending.
    Read,
    /// A line longer than the limit, read to its end and dropped: the buffer holds only
    /// its start.
    TooLong,
    /// The end of the input.
    End,
}

/// Reads one line into `buf` (cleared first), holding at most `limit` bytes besides its
/// `\r\n`, so that input without line breaks cannot fill the memory.
fn read_line(reader: &mut impl BufRead, buf: &mut Vec<u8>, limit: usize) -> std::io::Result<Line> {
    buf.clear();
    let keep = limit + 2;
    let mut read_any = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            break;
        }
        read_any = true;
        let (taken, done) = match available.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        let room = keep.saturating_sub(buf.len());
        buf.extend_from_slice(&available[..taken.min(room)]);
        reader.consume(taken);
        if done {
            break;
        }
    }
    if !read_any {
        return Ok(Line::End);
    }
    let content = buf
        .strip_suffix(b"\n")
        .map_or(&buf[..], |b| b.strip_suffix(b"\r").unwrap_or(b));
    // A cut-off line keeps `limit + 2` bytes and no `\n`: longer than the limit too.
    Ok(if content.len() > limit {
        Line::TooLong
    } else {
        Line::Read
    })
}

fn progress(ingestor: &Ingestor, lines: u64, started: Instant) {
    let p = ingestor.pipeline();
    let rate = lines as f64 / started.elapsed().as_secs_f64().max(1e-9);
    let rejected: u64 = p.rejected().values().sum();
    eprintln!(
        "topk: {lines} lines read ({rate:.0}/s), {} accepted, {rejected} rejected",
        p.accepted()
    );
}

fn report(ingestor: &Ingestor, state: &AppState, output: OutputFormat) {
    let p = ingestor.pipeline();
    let rankings: Vec<RankingRecord> = state
        .served
        .all()
        .iter()
        .map(|e| e.record.clone())
        .collect();
    match output {
        OutputFormat::Json => {
            let report = RunReport {
                rankings,
                accepted: p.accepted(),
                rejected: p.rejected().iter().map(|(r, n)| (r.as_str(), *n)).collect(),
                dedupe: p
                    .dedupe_outcomes()
                    .iter()
                    .map(|(c, n)| (c.as_str(), *n))
                    .collect(),
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            );
        }
        OutputFormat::Table => {
            for r in &rankings {
                print_table(r, 10);
            }
            let rejected: Vec<String> = p
                .rejected()
                .iter()
                .map(|(r, n)| format!("{r}={n}"))
                .collect();
            println!(
                "accepted {}, rejected {}",
                p.accepted(),
                if rejected.is_empty() {
                    "0".into()
                } else {
                    rejected.join(" ")
                }
            );
            if !p.dedupe_outcomes().is_empty() {
                let outcomes: Vec<String> = p
                    .dedupe_outcomes()
                    .iter()
                    .map(|(c, n)| format!("{}={n}", c.as_str()))
                    .collect();
                println!("dedupe {}", outcomes.join(" "));
            }
        }
    }
}

pub fn print_table(r: &RankingRecord, limit: usize) {
    let scope = if r.scope.is_empty() {
        "(global)"
    } else {
        r.scope.as_str()
    };
    let span = match (&r.window_start, &r.window_end) {
        (Some(s), Some(e)) => format!("[{s}, {e})"),
        _ => "all time".to_owned(),
    };
    println!(
        "{} / {scope}  {span}  {}  v{}  max over-count {}",
        r.window, r.mode, r.version, r.max_overcount
    );
    for item in r.items.iter().take(limit) {
        match (item.score, item.baseline) {
            (Some(score), Some(baseline)) => println!(
                "  {:>4}  {:>12}  {}  (score {:.2}, baseline {baseline})",
                item.rank, item.count, item.key, score.0
            ),
            _ => println!("  {:>4}  {:>12}  {}", item.rank, item.count, item.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_limit_are_dropped_whole_and_the_next_line_reads() {
        let input = b"abc\r\nabcdef\nabcd\nxy\r\n\nlast".to_vec();
        // A tiny buffer, so that lines span several fills.
        let mut reader = BufReader::with_capacity(2, &input[..]);
        let mut buf = Vec::new();
        let mut seen = Vec::new();
        loop {
            let line = read_line(&mut reader, &mut buf, 4).unwrap();
            if line == Line::End {
                break;
            }
            seen.push((line, String::from_utf8_lossy(&buf).into_owned()));
        }
        let want = [
            (Line::Read, "abc\r\n"),
            (Line::TooLong, "abcdef"),
            (Line::Read, "abcd\n"),
            (Line::Read, "xy\r\n"),
            (Line::Read, "\n"),
            (Line::Read, "last"),
        ];
        let want: Vec<_> = want.iter().map(|(l, s)| (l, s.to_string())).collect();
        let seen: Vec<_> = seen.iter().map(|(l, s)| (l, s.clone())).collect();
        assert_eq!(seen, want);
    }
}
