//! A paced HTTP client for the latency benchmarks: requests on a fixed schedule over a few
//! keep-alive connections, each timed from when it was due to reading the whole answer, so a
//! stall counts for every request it held back (as wrk2 does), not only the one it caught.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One keep-alive HTTP/1.1 request; returns once the whole body is read.
fn exchange(stream: &mut BufReader<TcpStream>, request: &[u8]) {
    stream.get_mut().write_all(request).expect("send");
    let mut length = 0;
    let mut line = String::new();
    stream.read_line(&mut line).expect("status line");
    // A refusal is answered fast and would flatter the figures.
    assert!(line.starts_with("HTTP/1.1 200"), "answered {line:?}");
    loop {
        line.clear();
        stream.read_line(&mut line).expect("header");
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some(value) = trimmed.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().expect("length");
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).expect("body");
}

/// Latencies (ms) of a paced run, and the rate achieved (lower when the client could not keep
/// the schedule).
#[derive(Debug, Clone, Copy)]
pub struct Paced {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub achieved: f64,
}

/// `rate` requests/s of `GET target` for `seconds`, over 4 connections on a fixed schedule.
pub fn paced(port: u16, target: &str, rate: f64, seconds: f64) -> Paced {
    const CONNECTIONS: usize = 4;
    let request = format!("GET {target} HTTP/1.1\r\nHost: bench\r\nConnection: keep-alive\r\n\r\n");
    let interval = Duration::from_secs_f64(CONNECTIONS as f64 / rate);
    let count = (seconds * rate / CONNECTIONS as f64) as usize;
    let start = Instant::now() + Duration::from_millis(100);
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let request = request.clone();
            std::thread::spawn(move || {
                let mut stream =
                    BufReader::new(TcpStream::connect(("127.0.0.1", port)).expect("connect"));
                stream.get_ref().set_nodelay(true).expect("nodelay");
                let offset = interval.mul_f64(c as f64 / CONNECTIONS as f64);
                let mut latencies = Vec::with_capacity(count);
                for i in 0..count {
                    let due = start + offset + interval * i as u32;
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    exchange(&mut stream, request.as_bytes());
                    // From when the request was due, not when it was sent: a request held
                    // back behind a stalled one waited too (no coordinated omission).
                    latencies.push(due.elapsed().as_secs_f64() * 1000.0);
                }
                latencies
            })
        })
        .collect();
    let mut all: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client"))
        .collect();
    let achieved = all.len() as f64 / start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    Paced {
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
        achieved,
    }
}
