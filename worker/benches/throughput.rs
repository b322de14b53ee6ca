//! Worker throughput end to end (consume, parse, count, checkpoint) next to a bare rdkafka
//! consumer reading the same topic in the same run, on the test environment's broker.
//!
//! `cargo bench -p topk-worker --bench throughput` (after `./scripts/testenv.sh up`).
//! `WORKER_BENCH_EVENTS` sets the stream length (default 3,000,000 events, 4 partitions: a few
//! seconds of counting, so that start-up effects such as the first touch of fetch buffers and
//! table growth weigh little and the worker checkpoints at least once while it is timed).

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use topk_testenv::{TestEnv, unique_name};
use topk_worker::Health;

// The same allocator as the `topk` binary, so that the numbers are the deployed worker's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench_worker;
mod kafka_bench;

use bench_worker::BenchWorker;

use kafka_bench::{
    Reads, ThreadTimes, bare_consumer, count_from_env, now_ms, process_cpu, produce,
};

const SHARDS: u32 = 4;

fn main() {
    let Some(env) = TestEnv::get("worker throughput benchmark") else {
        return;
    };
    let events = count_from_env("WORKER_BENCH_EVENTS", 3_000_000);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("bench");
    let input = unique_name("bench-input");
    runtime.block_on(env.create_metric_topics("bench", &name, &input, SHARDS));

    let start_ms = now_ms();
    let bytes = produce(&env, &input, events, start_ms, false);
    println!(
        "{events} events, {} bytes on average, {SHARDS} partitions",
        bytes / events as usize
    );

    let (polled, polled_cpu) = bare_consumer(&env, &input, SHARDS as i32, events, Reads::Poll);
    let (bare, bare_cpu) = bare_consumer(&env, &input, SHARDS as i32, events, Reads::Batch);
    let run = worker(&env, &name, &input, events);
    runtime.block_on(env.delete_metric_topics("bench", &name, &input, SHARDS));
    let per_sec = |secs: f64| events as f64 / secs;
    println!();
    println!("| reader | events/s | ratio |");
    println!("|---|---:|---:|");
    println!(
        "| bare rdkafka consumer, batch reads | {:.0} | 1.00 |",
        per_sec(bare.as_secs_f64())
    );
    println!(
        "| bare rdkafka consumer, one `poll` per message | {:.0} | {:.2} |",
        per_sec(polled.as_secs_f64()),
        bare.as_secs_f64() / polled.as_secs_f64()
    );
    println!(
        "| topk worker (consume, parse, count, checkpoint) | {:.0} | {:.2} |",
        per_sec(run.secs),
        bare.as_secs_f64() / run.secs
    );
    println!();
    if let Some(times) = run.thread {
        println!(
            "worker thread: {:.2} s on a CPU ({:.0} events per CPU-second), {:.0} ms runnable but waiting",
            times.on_cpu.as_secs_f64(),
            per_sec(times.on_cpu.as_secs_f64()),
            times.runnable_waiting.as_secs_f64() * 1000.0
        );
    }
    for (reads, cpu) in [("batch reads", bare_cpu), ("poll per message", polled_cpu)] {
        if let Some(cpu) = cpu {
            println!(
                "bare consumer ({reads}), whole process: {:.2} s on a CPU ({:.0} events per CPU-second)",
                cpu.as_secs_f64(),
                per_sec(cpu.as_secs_f64())
            );
        }
    }
    if let Some(process) = run.process {
        println!(
            "whole process while counting: {:.2} s on a CPU ({:.0} events per CPU-second)",
            process.as_secs_f64(),
            per_sec(process.as_secs_f64())
        );
    }
    println!(
        "state {:.1} MiB in memory, checkpoint {:.1} MiB written in {:.0} ms; {} checkpoints while counting",
        run.state_bytes as f64 / 1_048_576.0,
        run.checkpoint_bytes as f64 / 1_048_576.0,
        run.checkpoint.as_secs_f64() * 1000.0,
        run.checkpoints_while_counting
    );
}

/// What one worker run measured.
struct WorkerRun {
    /// From the first event read to the last.
    secs: f64,
    /// One more checkpoint after the stream.
    checkpoint: Duration,
    /// Checkpoints taken between the first event read and the last.
    checkpoints_while_counting: u64,
    state_bytes: i64,
    checkpoint_bytes: i64,
    /// The counting thread's own CPU time (Linux only).
    thread: Option<ThreadTimes>,
    /// Every thread's CPU time while counting: the counting thread, librdkafka's, and the
    /// benchmark's own mostly idle ones (Linux only).
    process: Option<Duration>,
}

/// Runs a worker owning every shard until it has read `events`.
fn worker(env: &TestEnv, name: &str, topic: &str, events: u64) -> WorkerRun {
    let spec = format!(
        r#"
shards: {SHARDS}
k: 100
windows:
  - {{name: 5m, length: 5m, bucket: 10s}}
  - {{name: 1h, length: 1h, bucket: 1m}}
"#
    );
    let started = Instant::now();
    // Checkpoints more often than the default (5 s), so that they fall inside the timed stretch.
    let worker = BenchWorker::start(env, name, topic, &spec, SHARDS, Duration::from_secs(1));
    let health = worker.health.clone();
    // Restoring shards (reading the handoff topic) is startup, not throughput: time from the
    // first event read.
    worker.await_first_event();
    let counting = Instant::now();
    let process_before = process_cpu();
    let checkpoints_before = checkpoints_taken(&health);
    eprintln!("worker startup: {:?}", started.elapsed());
    while health.metrics.events_in.get() < events {
        std::thread::park_timeout(Duration::from_millis(5));
    }
    let secs = counting.elapsed().as_secs_f64();
    let checkpoints_while_counting = checkpoints_taken(&health) - checkpoints_before;
    let process = process_cpu()
        .zip(process_before)
        .map(|(after, before)| after.saturating_sub(before));
    let (mut worker, times) = worker.stop();
    let checkpoint_started = Instant::now();
    worker.checkpoint().expect("checkpoint");
    let checkpoint = checkpoint_started.elapsed();
    WorkerRun {
        secs,
        checkpoint,
        checkpoints_while_counting,
        state_bytes: health.metrics.state_bytes.get(),
        checkpoint_bytes: health.metrics.checkpoint_bytes.get(),
        thread: times,
        process,
    }
}

/// Checkpoints written so far, from the count of the checkpoint-duration histogram.
fn checkpoints_taken(health: &Health) -> u64 {
    health
        .metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix("topk_worker_checkpoint_duration_seconds_count "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}
