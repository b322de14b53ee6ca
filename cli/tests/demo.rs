//! `topk demo` starts without any input, counts the ten minutes before it first, publishes
//! lists (a trending one too), answers point counts and prints the changing top 5.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::{await_some, get, spawn};
use serde_json::Value;

#[test]
fn demo_serves_and_prints_a_moving_top_five() {
    let mut server = spawn(&[
        "demo",
        "--rate",
        "5000",
        "--every",
        "1s",
        "--duration",
        "120s",
    ]);
    let url = format!("{}/v1/rankings/api_requests?window=1m&k=5", server.base);
    let first: Value = await_some("a first 1m list", Duration::from_secs(60), || {
        let (status, body) = get(&url);
        (status == 200).then(|| serde_json::from_str(&body).unwrap())
    });
    assert_eq!(first["items"].as_array().unwrap().len(), 5);
    // The history counted before the live stream fills the ten-minute window from the start:
    // without it the two windows would hold the same seconds of traffic.
    let (status, body) = get(&format!(
        "{}/v1/rankings/api_requests?window=10m&k=1",
        server.base
    ));
    assert_eq!(status, 200, "{body}");
    let ten: Value = serde_json::from_str(&body).unwrap();
    let leader_count = |list: &Value| list["items"][0]["count"].as_u64().unwrap();
    assert!(
        leader_count(&ten) >= 5 * leader_count(&first),
        "10m {ten} against 1m {first}"
    );
    let version = first["version"].as_u64().unwrap();
    await_some("a newer version", Duration::from_secs(30), || {
        let (_, body) = get(&url);
        let v: Value = serde_json::from_str(&body).ok()?;
        (v["version"].as_u64()? > version).then_some(())
    });
    let (_, regional) = get(&format!(
        "{}/v1/rankings/api_requests?window=1m&scope=eu-west",
        server.base
    ));
    assert!(regional.contains("\"items\""), "{regional}");
    // Point counts from the same engine: the leader keeps being requested, so it counts.
    let leader = &first["items"][0];
    let (status, body) = get(&format!(
        "{}/v1/frequency/api_requests?window=1m&key={}",
        server.base,
        leader["key"]
            .as_str()
            .unwrap()
            .replace(' ', "%20")
            .replace('/', "%2F")
    ));
    assert_eq!(status, 200, "{body}");
    let counts: Value = serde_json::from_str(&body).unwrap();
    assert!(
        counts["items"][0]["count"].as_u64() > Some(0),
        "{counts} for {leader}"
    );

    // The trending list of the demo's manifest, ranked by score: the route that starts
    // rising after 5 s, absent from the history, comes in faster than its baseline and leads
    // it, far ahead of the steady routes, which score about 1 against their history (without
    // it every route would be new, and score alike).
    let trending: Value = await_some(
        "the riser leading trending",
        Duration::from_secs(60),
        || {
            let (status, body) = get(&format!(
                "{}/v1/rankings/api_requests?window=trending",
                server.base
            ));
            let list: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
            let score = |rank: usize| list["items"][rank]["score"].as_f64();
            (list["items"][0]["key"] == "GET /v1/tickets/final-2026" && score(0)? > 2.0 * score(1)?)
                .then_some(list)
        },
    );
    let items = trending["items"].as_array().unwrap();
    assert!(!items.is_empty(), "{trending}");
    let scores: Vec<f64> = items.iter().map(|i| i["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{trending}");
    assert!(
        items.iter().all(|i| i["baseline"].as_u64() >= Some(5)),
        "{trending}"
    );

    let stdout = server.child.stdout.take().unwrap();
    let printed_rank_one = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .take(200)
        .any(|line| line.trim_start().starts_with("1 "));
    assert!(printed_rank_one, "the demo prints ranked rows");
}
