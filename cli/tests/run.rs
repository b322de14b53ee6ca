//! `topk run` end to end: real process, real files, real HTTP on loopback.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::time::Duration;

use common::{await_some, get, spawn, topk};
use serde_json::Value;
use topk_testenv::list_items;

const MANIFEST: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: test}
spec:
  metric: clicks
  source: {kafka: {bootstrapServers: "localhost:9092", topic: clicks}}
  shards: 4
  k: 3
  allowedLateness: 10s
  windows:
    - {name: 1m, length: 1m, bucket: 10s}
    - {name: all, allTime: true}
"#;

fn event(t: &str, key: &str, scope: &str, cost: u64) -> String {
    format!(
        r#"{{"event_id":"{key}{t}","event_time":"2026-09-01T19:{t}Z","metric":"clicks","scope":"{scope}","key":"{key}","cost":{cost}}}"#
    )
}

/// Writes the manifest and an input with known answers; returns (dir, manifest, input).
fn fixture() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("metric.yaml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let mut lines = vec![
        event("00:05", "old", "", 50), // leaves the 1m window, stays all-time
        event("01:01", "a", "", 1),
        event("01:02", "b", "", 2),
        event("01:03", "c", "", 3),
        event("01:04", "a", "", 4),
        event("01:05", "d", "eu", 1),
        event("01:20", "b", "", 1),
        "{broken".to_owned(),
        String::new(),
        event("01:21", "x", "", 0),
        r#"{"event_time":1,"metric":"other","key":"k"}"#.to_owned(),
        event("00:59", "late", "", 1), // older than 01:21 - 10s
        // Two MiB without a line break: dropped whole, the next line still reads.
        format!("{{\"key\":\"{}", "k".repeat(2 << 20)),
    ];
    lines.push(event("01:25", "e", "", 1));
    let input = dir.path().join("events.jsonl");
    let mut f = std::fs::File::create(&input).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    f.write_all(&[0xff, 0xfe, b'\n']).unwrap();
    let m = manifest.display().to_string();
    let i = input.display().to_string();
    (dir, m, i)
}

/// `topk run --exit-at-end --output json` of `manifest` over `input`: the report.
fn run_to_end(manifest: &str, input: &str) -> Value {
    let out = topk()
        .args(["run", "--file", manifest, "--input", input])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--exit-at-end",
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn pairs(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(k, c)| (k.to_string(), *c)).collect()
}

#[test]
fn exit_at_end_prints_every_list_and_the_rejections() {
    let (_dir, manifest, input) = fixture();
    let doc = run_to_end(&manifest, &input);
    assert_eq!(doc["accepted"], 8);
    let rejected = &doc["rejected"];
    assert_eq!(
        rejected["invalid_json"], 2,
        "broken line and non-UTF-8 line"
    );
    assert_eq!(rejected["invalid_cost"], 1);
    assert_eq!(rejected["other_metric"], 1);
    assert_eq!(rejected["late"], 1);
    assert_eq!(rejected["oversize_event"], 1);

    let rankings = doc["rankings"].as_array().unwrap();
    let find = |window: &str, scope: &str| {
        rankings
            .iter()
            .find(|r| r["window"] == window && r["scope"] == scope)
            .unwrap()
    };
    // Latest event 19:01:25 -> the 1m window ends at 19:01:30 and covers [19:00:30, 19:01:30).
    let one_minute = find("1m", "");
    assert_eq!(one_minute["windowStart"], "2026-09-01T19:00:30Z");
    assert_eq!(one_minute["windowEnd"], "2026-09-01T19:01:30Z");
    assert_eq!(
        list_items(one_minute),
        pairs(&[("a", 5), ("b", 3), ("c", 3)])
    );
    assert_eq!(one_minute["mode"], "exact");
    assert_eq!(one_minute["maxOvercount"], 0);
    assert_eq!(list_items(find("1m", "eu")), pairs(&[("d", 1)]));
    let all = find("all", "");
    assert!(all.get("windowStart").is_none());
    assert_eq!(list_items(all), pairs(&[("old", 50), ("a", 5), ("b", 3)]));
}

#[test]
fn dedupe_counts_a_retried_event_once_and_without_it_the_retries_over_count() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("events.jsonl");
    let mut f = std::fs::File::create(&input).unwrap();
    // "a" 3 plays, "b" 2, "c" 1; "c"'s play is retried 5 times and "b"'s first twice, one
    // retry re-stamped a second later; an event without an id is counted as it comes.
    let c = event("01:03", "c", "", 1);
    let b = event("01:01", "b", "", 1);
    let restamped_b = b.replace("19:01:01Z", "19:01:02Z");
    let no_id = r#"{"event_time":"2026-09-01T19:01:04Z","metric":"clicks","key":"a"}"#;
    for line in [
        event("01:01", "a", "", 1),
        b.clone(),
        event("01:02", "a", "", 1),
        c.clone(),
        c.clone(),
        b.clone(),
        c.clone(),
        event("01:05", "b", "", 1),
        restamped_b,
        c.clone(),
        c,
        no_id.to_owned(),
    ] {
        writeln!(f, "{line}").unwrap();
    }
    let input = input.display().to_string();
    let run = |dedupe: &str| {
        let manifest = dir.path().join(format!("metric{}.yaml", dedupe.len()));
        std::fs::write(&manifest, format!("{MANIFEST}  {dedupe}\n")).unwrap();
        run_to_end(&manifest.display().to_string(), &input)
    };
    let one_minute = |doc: &Value| {
        let rankings = doc["rankings"].as_array().unwrap();
        let list = rankings
            .iter()
            .find(|r| r["window"] == "1m" && r["scope"] == "")
            .unwrap();
        list_items(list)
    };

    let deduped = run("dedupe: {horizon: 5s}");
    assert_eq!(one_minute(&deduped), pairs(&[("a", 3), ("b", 2), ("c", 1)]));
    assert_eq!(deduped["accepted"], 6);
    let outcomes = &deduped["dedupe"];
    assert_eq!(outcomes["first"], 5, "{outcomes}");
    assert_eq!(outcomes["duplicate"], 6, "{outcomes}");
    assert_eq!(outcomes["no_id"], 1, "{outcomes}");

    // Without dedupe every retry counts: c over-counted by its 4 retries, b by 2.
    let plain = run("");
    assert_eq!(one_minute(&plain), pairs(&[("c", 5), ("b", 4), ("a", 3)]));
    assert_eq!(plain["accepted"], 12);
    assert!(plain.get("dedupe").is_none(), "{plain}");
}

#[test]
fn serves_rankings_index_metrics_and_clear_errors_over_http() {
    let (_dir, manifest, input) = fixture();
    let server = spawn(&["run", "--file", &manifest, "--input", &input]);
    let base = &server.base;
    let url = format!("{base}/v1/rankings/clicks?window=1m&k=2");
    // Lists are also published while the input streams; the final one ends at 19:01:30.
    let record: Value = await_some("the final 1m list", Duration::from_secs(30), || {
        let (status, body) = get(&url);
        let record: Value = serde_json::from_str(&body).ok()?;
        (status == 200 && record["windowEnd"] == "2026-09-01T19:01:30Z").then_some(record)
    });
    assert_eq!(list_items(&record), pairs(&[("a", 5), ("b", 3)]));
    for field in [
        "asOf",
        "watermark",
        "version",
        "windowStart",
        "windowEnd",
        "metric",
        "scope",
    ] {
        assert!(record.get(field).is_some(), "missing {field}");
    }

    let (status, body) = get(&format!("{base}/v1/rankings/clicks?window=all&scope=eu"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        list_items(&serde_json::from_str(&body).unwrap()),
        pairs(&[("d", 1)])
    );

    let (status, body) = get(&format!("{base}/v1/rankings"));
    assert_eq!(status, 200);
    let index: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(index["rankings"].as_array().unwrap().len(), 4, "{index}");

    // Point counts from the same engine, for keys on the list and off it (k is 3: `e` is
    // fourth), as of the same window end.
    let counts = |query: &str| -> Value {
        let (status, body) = get(&format!("{base}/v1/frequency/clicks?{query}"));
        assert_eq!(status, 200, "{query}: {body}");
        serde_json::from_str(&body).unwrap()
    };
    let answer = counts("window=1m&key=a&key=e&key=old&key=never");
    assert_eq!(answer["mode"], "exact");
    let found: Vec<(String, u64)> = answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            assert_eq!(i["windowEnd"], "2026-09-01T19:01:30Z", "{i}");
            (
                i["key"].as_str().unwrap().to_owned(),
                i["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        found,
        pairs(&[("a", 5), ("e", 1), ("never", 0), ("old", 0)])
    );
    let all_time = counts("window=all&key=old");
    assert_eq!(all_time["items"][0]["count"], 50, "{all_time}");
    assert!(
        all_time["items"][0].get("windowStart").is_none(),
        "{all_time}"
    );
    assert_eq!(counts("window=all&scope=eu&key=d")["items"][0]["count"], 1);

    // Answers by code so far (the wait above may have been answered 404 before the first
    // list): the cases below must add five of each.
    let answered = |code: u16| -> u64 {
        let page = get(&format!("{base}/metrics")).1;
        let series = format!("topk_requests_total{{code=\"{code}\"}}");
        common::metric(&page, &series).unwrap_or(0.0) as u64
    };
    let before = [answered(400), answered(404)];
    let cases = [
        ("/v1/frequency/clicks?window=1m", 400, "give 1 to 1000 keys"),
        (
            "/v1/frequency/clicks?window=5m&key=a",
            400,
            "unknown window",
        ),
        ("/v1/frequency/nope?key=a", 404, "unknown metric"),
        ("/v1/rankings/nope?window=1m", 404, "unknown metric"),
        ("/v1/rankings/clicks?window=5m", 400, "unknown window"),
        ("/v1/rankings/clicks?window=1m&k=0", 400, "k must be"),
        ("/v1/rankings/clicks?window=1m&k=4", 400, "between 1 and 3"),
        (
            "/v1/rankings/clicks?window=1m&scope=mars",
            404,
            "no ranking published yet",
        ),
        (
            "/v1/rankings/clicks?window=1m&version=1",
            404,
            "keeps no earlier versions",
        ),
        (
            "/v1/rankings/clicks/history?window=1m",
            404,
            "keeps no earlier versions",
        ),
    ];
    for (path, want_status, want_text) in cases {
        let (status, body) = get(&format!("{base}{path}"));
        assert_eq!(status, want_status, "{path}: {body}");
        assert!(body.contains(want_text), "{path}: {body}");
    }

    let (status, metrics) = get(&format!("{base}/metrics"));
    assert_eq!(status, 200);
    assert!(
        metrics.contains("topk_events_accepted_total 8"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"topk_events_rejected_total{reason="late"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"topk_events_rejected_total{reason="oversize_key"} 0"#));
    // The error answers above, five of each code, are counted where `/metrics` shows them.
    assert_eq!(
        [answered(400), answered(404)],
        before.map(|n| n + 5),
        "{metrics}"
    );
    assert_eq!(get(&format!("{base}/healthz")).0, 200);
}

#[test]
fn invalid_manifest_fails_with_the_field_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, MANIFEST.replace("bucket: 10s", "bucket: 7s")).unwrap();
    let out = topk()
        .args([
            "run",
            "--file",
            path.to_str().unwrap(),
            "--input",
            "/dev/null",
            "--exit-at-end",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("spec.windows[0] (\"1m\"): bucket 7s must divide length 1m"),
        "{stderr}"
    );
}

#[test]
fn reads_stdin_with_the_embedded_default_manifest() {
    use std::process::Stdio;
    let mut child = topk()
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--exit-at-end",
            "--output",
            "json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for i in 0..3 {
        writeln!(
            stdin,
            r#"{{"event_time":{},"metric":"api_requests","key":"GET /"}}"#,
            1_000 + i
        )
        .unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["accepted"], 3);
    assert_eq!(doc["rankings"][0]["items"][0]["count"], 3);
}

#[test]
fn denied_keys_leave_the_lists_and_a_changed_manifest_applies_while_reading() {
    // At start: the manifest's denyKeys are left out, the next keys move up.
    let (dir, _, input) = fixture();
    let denied = dir.path().join("denied.yaml");
    std::fs::write(
        &denied,
        MANIFEST.replace("  k: 3\n", "  k: 3\n  denyKeys: [a, old]\n"),
    )
    .unwrap();
    let doc = run_to_end(denied.to_str().unwrap(), &input);
    let all = doc["rankings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["window"] == "all" && r["scope"] == "")
        .unwrap();
    assert_eq!(list_items(all), pairs(&[("b", 3), ("c", 3), ("e", 1)]));

    // While reading: a takedown written into the manifest applies at the next publication,
    // and lifting it brings the key back with its whole count.
    let live = dir.path().join("live.yaml");
    let with_deny = |keys: &str| {
        MANIFEST
            .replace("  k: 3\n", &format!("  k: 3\n  denyKeys: [{keys}]\n"))
            .replace(
                "{name: all, allTime: true}",
                "{name: all, allTime: true, bucket: 10s}",
            )
    };
    std::fs::write(&live, with_deny("")).unwrap();
    let (server, mut stdin) = common::spawn_piped(&["run", "--file", live.to_str().unwrap()]);
    let mut second = 0u32;
    // One event a second of event time: `key` or, by default, a key of its own with count 1,
    // so that lists keep being published.
    let mut send = move |key: Option<(&str, u64)>| {
        second += 1;
        let time = format!("{:02}:{:02}", second / 60, second % 60);
        let (key, cost) = key.map_or((format!("z{second}"), 1), |(k, c)| (k.to_owned(), c));
        writeln!(stdin, "{}", event(&time, &key, "", cost)).unwrap();
    };
    send(Some(("a", 5)));
    send(Some(("b", 2)));
    let url = format!("{}/v1/rankings/clicks?window=all", server.base);
    let mut await_top = |what: &str, want: &[(&str, u64)]| {
        let want = pairs(want);
        await_some(what, Duration::from_secs(30), || {
            send(None);
            let (status, body) = get(&url);
            let list: Value = serde_json::from_str(&body).ok()?;
            let top: Vec<_> = list_items(&list).into_iter().take(want.len()).collect();
            (status == 200 && top == want).then_some(())
        })
    };
    await_top("a on top", &[("a", 5), ("b", 2)]);
    std::fs::write(&live, with_deny("a")).unwrap();
    await_top("a taken down", &[("b", 2)]);
    std::fs::write(&live, with_deny("")).unwrap();
    await_top("a back", &[("a", 5), ("b", 2)]);
}

#[test]
fn crd_subcommand_prints_the_committed_crd() {
    let out = topk().arg("crd").output().unwrap();
    assert!(out.status.success());
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/topkmetrics.topk.io.yaml"
    ))
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), committed);
}
