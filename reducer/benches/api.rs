//! Query API throughput and latency for a k=100 list, next to nginx serving the same JSON as a
//! static file, in the same run on the same machine.
//!
//! `cargo bench -p topk-reducer --bench api --profile dev` with `nginx` and `wrk` installed
//! (`apt-get install nginx wrk`); skipped with a message otherwise. `API_BENCH_SECONDS` sets
//! each wrk run's length (default 5).
//!
//! 1. `wrk` (2 threads, 32 connections) against each server: requests/s and wrk's latency
//!    percentiles at full load.
//! 2. A paced client at half of the reducer's full-load rate: 4 keep-alive connections send on
//!    a fixed schedule (a request due while the previous one is out waits for it); latency is
//!    from sending a request to reading its whole answer, p50 and p99.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::family::Family;
use topk_api::RankingRecord;
use topk_engine::RankedItem;
use topk_engine::event::format_rfc3339_ms;
use topk_query::{Served, query_router};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod paced;

const PATH: &str = "/v1/rankings/api_requests";
const QUERY: &str = "?window=1h&k=100";

fn list() -> RankingRecord {
    let at = 1_796_000_000_000;
    RankingRecord {
        retries_may_count: false,
        metric: "api_requests".into(),
        scope: String::new(),
        window: "1h".into(),
        window_start: Some(format_rfc3339_ms(at - 3_600_000)),
        window_end: Some(format_rfc3339_ms(at)),
        items: (0..100)
            .map(|i| RankedItem {
                rank: i + 1,
                key: format!("GET /api/v2/tenants/{}/orders", 7919 * (i + 3) % 100_000),
                count: 1_000_000 / u64::from(i + 1),
                baseline: None,
                score: None,
            })
            .collect(),
        mode: "exact".into(),
        max_overcount: 0,
        watermark: format_rfc3339_ms(at),
        as_of: format_rfc3339_ms(at + 2_000),
        version: 42,
        exact_until: Some(format_rfc3339_ms(at)),
        stale: false,
        input_range: Vec::new(),
        regions: None,
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx serving `body` at PATH from a temp dir, in the foreground, no access log.
fn nginx(dir: &std::path::Path, body: &[u8]) -> (Nginx, u16) {
    let root = dir.join("www");
    let file = root.join(PATH.trim_start_matches('/'));
    std::fs::create_dir_all(file.parent().expect("parent")).expect("www");
    std::fs::write(&file, body).expect("body");
    let port = free_port();
    let d = dir.display();
    let conf = format!(
        "daemon off; worker_processes 2; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  server {{
    listen 127.0.0.1:{port};
    root {root};
    location / {{ default_type application/json; }}
  }}
}}
",
        root = root.display()
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("conf");
    // As root nginx hands its workers to `nobody`: let them read the temp dir.
    let _ = Command::new("chmod").args(["-R", "a+rX"]).arg(dir).status();
    let child = Command::new("nginx")
        .arg("-c")
        .arg(&conf_path)
        .arg("-p")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start nginx");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nginx did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Nginx(child), port)
}

/// What wrk measured: requests/s and its p50/p99 latency in ms.
#[derive(Debug, Clone, Copy)]
struct Load {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn wrk_ms(text: &str) -> Option<f64> {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = number.parse().ok()?;
    Some(match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        _ => return None,
    })
}

fn wrk(url: &str, seconds: u64) -> Load {
    let out = Command::new("wrk")
        .args(["-t2", "-c32", &format!("-d{seconds}s"), "--latency", url])
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |label: &str| {
        text.lines()
            .map(str::trim)
            .find(|l| l.starts_with(label))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {label:?} in wrk output:\n{text}"))
    };
    assert!(!text.contains("Non-2xx"), "errors from {url}:\n{text}");
    Load {
        per_sec: field("Requests/sec:").parse().expect("rate"),
        p50_ms: wrk_ms(&field("50%")).expect("p50"),
        p99_ms: wrk_ms(&field("99%")).expect("p99"),
    }
}

fn main() {
    for tool in ["nginx", "wrk"] {
        if Command::new("which")
            .arg(tool)
            .output()
            .map_or(true, |o| !o.status.success())
        {
            eprintln!(
                "\n*** SKIPPED api benchmark: `{tool}` is not installed (apt-get install nginx wrk).\n"
            );
            return;
        }
    }
    let seconds: u64 = std::env::var("API_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let record = list();
    let body = serde_json::to_vec(&record).expect("json");
    let dir = tempfile::tempdir().expect("tempdir");
    let (_nginx, nginx_port) = nginx(dir.path(), &body);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let served = Arc::new(Served::new(
        "api_requests",
        vec!["1h".into()],
        100,
        Family::default(),
    ));
    served.put([record]);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let app = query_router(served);
    runtime.spawn(async move { axum::serve(listener, app).await });
    let reducer_base = format!("http://127.0.0.1:{port}");

    println!(
        "{} byte JSON list (k=100), wrk -t2 -c32 for {seconds}s each",
        body.len()
    );
    let static_load = wrk(
        &format!("http://127.0.0.1:{nginx_port}{PATH}{QUERY}"),
        seconds,
    );
    let api_load = wrk(&format!("{reducer_base}{PATH}{QUERY}"), seconds);
    // Both at the same paced rate: the client shares the machine's cores with the server, so
    // nginx's numbers say what the machine allows.
    let half = api_load.per_sec / 2.0;
    let target = format!("{PATH}{QUERY}");
    let static_paced = paced::paced(nginx_port, &target, half, seconds as f64);
    let api_paced = paced::paced(port, &target, half, seconds as f64);
    println!();
    println!("| server | requests/s | ratio | p50 at full load | p99 at full load |");
    println!("|---|---:|---:|---:|---:|");
    for (name, load) in [
        ("nginx, static file", static_load),
        ("topk reducer API", api_load),
    ] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} ms | {:.2} ms |",
            load.per_sec,
            load.per_sec / static_load.per_sec,
            load.p50_ms,
            load.p99_ms
        );
    }
    println!();
    println!("Paced at half the reducer's full-load rate ({half:.0} requests/s):");
    println!();
    println!("| server | achieved requests/s | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|");
    for (name, run) in [
        ("nginx, static file", static_paced),
        ("topk reducer API", api_paced),
    ] {
        println!(
            "| {name} | {:.0} | {:.3} ms | {:.3} ms | {:.1} ms |",
            run.achieved, run.p50, run.p99, run.max
        );
    }
}
