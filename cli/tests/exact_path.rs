//! The exact path end to end on the test environment's broker, every data-plane client over
//! its SASL_SSL listener with credentials read from Secret files as the pods mount them: the
//! input with SCRAM-SHA-512, the internal topics (`internalKafka`) with OAUTHBEARER (tokens
//! from the test environment's OAuth token endpoint). Three closed hours of events through
//! two `topk worker` processes and a `topk reducer`, then `topk recount` hour by hour.
//! The 24h and all-time lists move from streaming estimates to the exact counts, `exactUntil`
//! advances one hour per recount, and each recounted hour's streaming 1h list is graded: the
//! hour with re-delivered events (same `event_id`, counted twice by the streaming path, once
//! by the recount) shows the known over-count, recall and rank displacement.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::Value;
use topk_engine::event::format_rfc3339_ms;
use topk_engine::partition::message_key;
use topk_engine::summary::rank_order;
use topk_testenv::{TestEnv, list_items, metric_manifest_from, unique_name};

const SHARDS: u32 = 2;
const K: usize = 5;
const HOUR: i64 = 3_600_000;
const WAIT: Duration = Duration::from_secs(120);
/// Times `song-0` is re-delivered in the second hour.
const REDELIVERED: u64 = 100;

/// The windows of the exact path's metric.
const LONG_WINDOWS: &str = r#"
  - {name: 1h, length: 1h, bucket: 5m}
  - {name: 24h, length: 24h, bucket: 1h}
  - {name: all, allTime: true, bucket: 1h}
"#;

/// How the first test's metric counts.
const APPROXIMATE: &str = r#"
mode: approximate
sketch: {epsilon: 0.001, delta: 0.001, candidates: 20}
allowedLateness: 1s
recount: {grace: 1m}
workers: {checkpointInterval: 200ms, idleTimeout: 1s}
"#;

/// The exact path's metric with `counting` (mode, lateness, dedupe, workers) and `windows` in
/// its spec.
fn manifest_with(name: &str, env: &TestEnv, topic: &str, counting: &str, windows: &str) -> String {
    let secure = &env.secure_kafka;
    let internal = secure.oauth_cluster(&secure.sasl_bootstrap, &secure.oauth_token_url);
    metric_manifest_from(
        name,
        "plays",
        &secure.scram_source(&secure.sasl_bootstrap, topic),
        &format!(
            r#"
internalKafka: {{{internal}}}
shards: {SHARDS}
k: {K}
{}
windows:
{}
"#,
            counting.trim_matches('\n'),
            windows.trim_matches('\n'),
        ),
    )
}

/// One event: (event time, scope, key, event id).
type Event = (i64, &'static str, String, String);

/// Hour `h` (0, 1, 2) of the stream: in the global scope `song-i` is played `5 (i + 1) + h`
/// times, in `eu` `eu-song-j` `2 (j + 1)` times, spread evenly over the hour.
fn hour_events(start: i64, h: i64) -> Vec<Event> {
    let mut plays: Vec<(&'static str, String)> = Vec::new();
    for i in 0..9 {
        for _ in 0..5 * (i + 1) + h {
            plays.push(("", format!("song-{i}")));
        }
    }
    for j in 0..3 {
        for _ in 0..2 * (j + 1) {
            plays.push(("eu", format!("eu-song-{j}")));
        }
    }
    // Interleave the keys deterministically so every part of the hour sees most of them.
    let n = plays.len() as i64;
    let mut events: Vec<Event> = plays
        .into_iter()
        .enumerate()
        .map(|(i, (scope, key))| {
            let slot = (i as i64 * 7919) % n;
            let time = start + 1_000 + slot * (HOUR - 2_000) / n;
            (time, scope, key, format!("h{h}-e{i}"))
        })
        .collect();
    events.sort();
    events
}

/// A new metric name, its input topic and internal topics in `ns`, and a temp dir.
fn metric_topics(env: &TestEnv, ns: &str) -> (String, String, tempfile::TempDir) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("plays");
    let input = unique_name("plays-input");
    runtime.block_on(env.create_metric_topics(ns, &name, &input, SHARDS));
    (name, input, tempfile::tempdir().expect("tempdir"))
}

/// A metric of the exact path in `ns`: its input topic, the operator's rendered config and the
/// Kafka Secret files in a temp dir, the first of the three hours before the current one, and
/// an idempotent producer.
struct Setup {
    input: String,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    secrets: std::path::PathBuf,
    first_hour: i64,
    producer: ThreadedProducer<DefaultProducerContext>,
}

fn setup(env: &TestEnv, ns: &str, counting: &str, windows: &str) -> Setup {
    let (name, input, dir) = metric_topics(env, ns);
    let manifest = manifest_with(&name, env, &input, counting, windows);
    let config = common::rendered_config(dir.path(), &manifest, ns);
    let secrets = dir.path().join("kafka-secrets");
    env.secure_kafka.write_secret_files(&secrets);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let producer = keyed_producer(env);
    Setup {
        input,
        dir,
        config,
        secrets,
        first_hour: now.div_euclid(HOUR) * HOUR - 3 * HOUR,
        producer,
    }
}

/// An idempotent producer partitioning keys as topk does.
fn keyed_producer(env: &TestEnv) -> ThreadedProducer<DefaultProducerContext> {
    env.kafka_config()
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .create()
        .expect("producer")
}

/// Sends `event` to `topic` keyed and timestamped as producers do.
fn send(producer: &ThreadedProducer<DefaultProducerContext>, topic: &str, event: &Event) {
    let (time, scope, key, id) = event;
    let payload = serde_json::json!({
        "event_time": time, "metric": "plays", "scope": scope, "key": key, "event_id": id,
    })
    .to_string();
    producer
        .send(
            BaseRecord::to(topic)
                .key(&message_key("plays", scope, key))
                .payload(&payload)
                .timestamp(*time),
        )
        .expect("enqueue");
}

/// Runs `topk recount` for the hour starting at `hour` (its manifest in `dir`'s
/// termination-log) and waits for it to succeed.
fn recount(stack: &common::Stack, dir: &std::path::Path, hour: i64) {
    recount_on(&stack.config, &stack.secrets_args(), dir, hour);
}

/// [`recount`] on the config file `config`, with the further arguments `extra`.
fn recount_on(config: &str, extra: &[String], dir: &std::path::Path, hour: i64) {
    let out = common::topk()
        .args(["recount", "--config", config])
        .args(["--hour", &format_rfc3339_ms(hour)])
        .args(extra)
        .arg("--spill-dir")
        .arg(dir.join("spill"))
        .arg("--termination-log")
        .arg(dir.join("termination-log"))
        .output()
        .expect("run topk recount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The exact top k per scope of counts.
fn top(counts: &BTreeMap<(String, String), u64>, scope: &str) -> Vec<(String, u64)> {
    let mut list: Vec<(String, u64)> = counts
        .iter()
        .filter(|((s, _), _)| s == scope)
        .map(|((_, key), count)| (key.clone(), *count))
        .collect();
    list.sort_by(|a, b| rank_order(&a.0, a.1, &b.0, b.1));
    list.truncate(K);
    list
}

#[test]
fn recounted_hours_make_long_lists_exact_and_grade_the_streaming_path() {
    let Some(env) = TestEnv::get("exact path end to end") else {
        return;
    };
    let Setup {
        input,
        dir,
        config,
        secrets,
        first_hour,
        producer,
    } = setup(&env, "exact", APPROXIMATE, LONG_WINDOWS);
    let rendered = std::fs::read_to_string(&config).expect("rendered config");
    assert!(
        !rendered.contains(&env.secure_kafka.password()),
        "the rendered config holds the password: {rendered}"
    );
    let client_secret = env.secure_kafka.file("oauth-client-secret");
    assert!(
        rendered.contains("oauth") && !rendered.contains(client_secret.trim()),
        "the rendered config names the OAuth client's Secret, never its value: {rendered}"
    );
    // Three closed hours before the current one.
    // What the recount must find: each event_id once.
    let mut exact: BTreeMap<(String, String), u64> = BTreeMap::new();
    for h in 0..3 {
        let mut hour_counts: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (time, scope, key, id) in hour_events(first_hour + h * HOUR, h) {
            // In the second hour song-0 is delivered again and again right after its first
            // play: the same event, which only the recount recognises.
            let copies = if h == 1
                && key == "song-0"
                && !hour_counts.contains_key(&(String::new(), key.clone()))
            {
                1 + REDELIVERED
            } else {
                1
            };
            let event = (time, scope, key, id);
            for _ in 0..copies {
                send(&producer, &input, &event);
            }
            let (_, scope, key, _) = event;
            *hour_counts
                .entry((scope.to_owned(), key.clone()))
                .or_default() += 1;
            *exact.entry((scope.to_owned(), key)).or_default() += 1;
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let stack = common::Stack::start_with(dir.path(), &config, Some(&secrets));
    let _workers = [stack.worker(0), stack.worker(1)];

    let list = |window: &str, scope: &str| -> Option<Value> {
        let (status, body) = common::get(&format!(
            "{}/v1/rankings/plays?window={window}&scope={scope}",
            stack.reducer.base
        ));
        (status == 200).then(|| serde_json::from_str(&body).expect("json"))
    };
    let third_hour_end = format_rfc3339_ms(first_hour + 3 * HOUR);
    // Streaming first: the long lists cover the three hours, re-deliveries included, and
    // nothing is exact yet.
    let exact_song0 = exact[&(String::new(), "song-0".to_owned())];
    for window in ["24h", "all"] {
        let streamed = common::await_some("the streaming long lists", WAIT, || {
            list(window, "").filter(|l| l["windowEnd"].as_str() >= Some(third_hour_end.as_str()))
        });
        assert!(streamed.get("exactUntil").is_none(), "{streamed}");
        let song0 = list_items(&streamed).into_iter().find(|i| i.0 == "song-0");
        assert!(
            song0.is_some_and(|i| i.1 >= exact_song0 + REDELIVERED),
            "{streamed}"
        );
    }

    for h in 0..3 {
        recount(&stack, dir.path(), first_hour + h * HOUR);
        let until = format_rfc3339_ms(first_hour + (h + 1) * HOUR);
        for window in ["24h", "all"] {
            let composed =
                common::await_some(&format!("{window} exact until {until}"), WAIT, || {
                    list(window, "").filter(|l| l["exactUntil"].as_str() == Some(until.as_str()))
                });
            assert_eq!(composed["mode"], "approximate");
            if h == 2 {
                // Every hour with data is exact: the lists are the recount's, bound zero.
                assert_eq!(list_items(&composed), top(&exact, ""), "{window}");
                assert_eq!(composed["maxOvercount"], 0);
                let eu = list(window, "eu").expect("eu list");
                assert_eq!(list_items(&eu), top(&exact, "eu"), "{window} eu");
            } else {
                // The open hours are still streaming estimates, re-deliveries included.
                let song0 = list_items(&composed)
                    .into_iter()
                    .find(|i| i.0 == "song-0")
                    .map(|i| i.1);
                if h == 0 {
                    assert!(song0 >= Some(exact_song0 + REDELIVERED), "{composed}");
                } else {
                    assert!(
                        song0.is_none_or(|c| c < exact_song0 + REDELIVERED),
                        "{composed}"
                    );
                }
            }
        }
    }

    // Each recounted hour's streaming 1h list is graded against the exact hour.
    let grades = common::await_some("three graded hours", WAIT, || {
        let (status, body) = common::get(&format!("{}/v1/grades", stack.reducer.base));
        let value: Value = serde_json::from_str(&body).ok()?;
        let grades = value["grades"].as_array()?.clone();
        (status == 200 && grades.len() == 3).then_some(grades)
    });
    for (h, grade) in grades.iter().enumerate() {
        assert_eq!(grade["hourMs"], first_hour + h as i64 * HOUR, "{grade}");
        let bound = grade["overcountBound"].as_u64().expect("bound");
        let overcount = grade["maxOvercount"].as_u64().expect("overcount");
        if h == 1 {
            // song-0 (6 plays) published first with 106: four of the exact top five remain,
            // and song-0 is really 9th.
            assert!(
                (REDELIVERED..=REDELIVERED + bound).contains(&overcount),
                "{grade}"
            );
            assert_eq!(grade["boundViolated"], true);
            assert_eq!(grade["recallAtK"], 0.8);
            assert_eq!(grade["maxRankDisplacement"], 8);
        } else {
            assert!(overcount <= bound, "{grade}");
            assert_eq!(grade["boundViolated"], false);
            assert_eq!(grade["recallAtK"], 1.0);
            assert_eq!(grade["maxRankDisplacement"], 0);
        }
        assert_eq!(grade["scopes"], 2);
    }
    let (_, metrics) = common::get(&format!("{}/metrics", stack.reducer.base));
    assert!(
        metrics.contains("topk_reducer_exact_hours_total 3"),
        "{metrics}"
    );
    assert!(metrics.contains("topk_reducer_grade_bound_violations_total 1"));
    // The newest recount's figures, as its Job reported them (its termination message).
    let last: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("termination-log")).expect("termination log"),
    )
    .expect("the last recount's manifest");
    for (series, value) in [
        ("hour_seconds", Value::from((first_hour + 2 * HOUR) / 1000)),
        ("events_read", last["eventsRead"].clone()),
        ("counted", last["counted"].clone()),
        ("duplicates", last["duplicates"].clone()),
        ("keys", last["keys"].clone()),
    ] {
        let line = format!("topk_reducer_recount_{series} {value}\n");
        assert!(metrics.contains(&line), "no {line:?} in {metrics}");
    }
}

/// A labelled or unlabelled sample of worker `server`'s metrics (0 when absent).
fn worker_metric(server: &common::Server, sample: &str) -> f64 {
    let (_, page) = common::get(&format!("{}/metrics", server.base));
    common::metric(&page, sample).unwrap_or(0.0)
}

/// With `dedupe` on, retried events (the same `event_id` sent again, before and after both
/// workers are SIGKILLed and restarted on their checkpoints) are counted once: the streaming
/// lists equal the oracle of unique events, and the recount grades both hours clean (no
/// over-count, full recall), where the test above, without dedupe, shows the retries'
/// over-count.
#[test]
fn dedupe_counts_each_event_id_once_across_a_worker_kill_and_grades_clean() {
    let Some(env) = TestEnv::get("streaming dedupe end to end") else {
        return;
    };
    // A 10 minute lateness keeps the last minutes' retries countable, so only dedupe can drop
    // them; the long idle timeout keeps the clock from making them late instead.
    let counting = r#"
mode: exact
dedupe: {}
allowedLateness: 10m
recount: {grace: 10m}
workers: {checkpointInterval: 200ms, idleTimeout: 4h}
"#;
    let Setup {
        input,
        dir,
        config,
        secrets,
        first_hour,
        producer,
    } = setup(&env, "dedupe", counting, LONG_WINDOWS);
    // Two closed hours, ending an hour before the current one.
    let hours: Vec<Vec<Event>> = (0..2)
        .map(|h| hour_events(first_hour + h * HOUR, h))
        .collect();
    let tail: Vec<Event> = hours[1][hours[1].len() - 20..].to_vec();
    // Round 1: every event once, song-0's first play of the second hour re-sent right after
    // it, and the second hour's last 20 events re-sent at the end.
    let mut retried = 0;
    for (h, events) in hours.iter().enumerate() {
        let mut song0_sent = false;
        for event in events {
            send(&producer, &input, event);
            if h == 1 && event.2 == "song-0" && !std::mem::replace(&mut song0_sent, true) {
                for _ in 0..REDELIVERED {
                    send(&producer, &input, event);
                    retried += 1;
                }
            }
        }
    }
    for event in &tail {
        send(&producer, &input, event);
        retried += 1;
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let stack = common::Stack::start_with(dir.path(), &config, Some(&secrets));
    let duplicates = r#"topk_worker_dedupe_total{outcome="duplicate"}"#;
    let checkpoints = "topk_worker_checkpoint_duration_seconds_count";
    {
        let workers = [stack.served_worker(0), stack.served_worker(1)];
        let total = |sample: &str| {
            workers
                .iter()
                .map(|w| worker_metric(w, sample))
                .sum::<f64>()
        };
        common::await_some("round 1's retries dropped", WAIT, || {
            (total(duplicates) == f64::from(retried)).then_some(())
        });
        // Checkpoints after the last event: the restarted workers replay nothing, and only
        // the ids in their checkpoints can catch the next retries.
        let written: Vec<f64> = workers
            .iter()
            .map(|w| worker_metric(w, checkpoints))
            .collect();
        common::await_some("two more checkpoints per worker", WAIT, || {
            workers
                .iter()
                .zip(&written)
                .all(|(w, before)| worker_metric(w, checkpoints) >= before + 2.0)
                .then_some(())
        });
        // Every checkpoint written paused the counting thread once (to copy the state); the
        // rest of it ran on the checkpoint thread.
        // (Written ones read first: a checkpoint is counted paused before it is written.)
        for w in &workers {
            let written = worker_metric(w, checkpoints);
            let paused = worker_metric(w, "topk_worker_checkpoint_pause_seconds_count");
            assert!(
                written > 0.0 && paused >= written,
                "{paused} checkpoint pauses, {written} checkpoints written"
            );
        }
        assert_eq!(
            total(r#"topk_worker_dedupe_total{outcome="not_remembered"}"#),
            0.0
        );
        assert_eq!(
            total(r#"topk_worker_events_rejected_total{reason="late"}"#),
            0.0
        );
        // Dropped here: SIGKILL.
    }

    // Round 2, while the workers are down: the tail once more, then, per shard, an event past
    // the second hour's end plus the lateness, so that the hour's lists close.
    for event in &tail {
        send(&producer, &input, event);
    }
    let second_end = first_hour + 2 * HOUR;
    for shard in 0..SHARDS {
        let key = (0..)
            .map(|i| format!("closer-{i}"))
            .find(|k| topk_engine::partition::shard_for("plays", "", k, SHARDS) == shard)
            .expect("a key for the shard");
        let closer = (
            second_end + 10 * 60_000 + 30_000,
            "",
            key,
            format!("closer-{shard}"),
        );
        send(&producer, &input, &closer);
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
    let workers = [stack.served_worker(0), stack.served_worker(1)];
    let total = |sample: &str| {
        workers
            .iter()
            .map(|w| worker_metric(w, sample))
            .sum::<f64>()
    };
    common::await_some(
        "round 2's retries dropped by the restored ids",
        WAIT,
        || (total(duplicates) == tail.len() as f64).then_some(()),
    );
    assert_eq!(
        total(r#"topk_worker_events_rejected_total{reason="late"}"#),
        0.0
    );

    // The oracle: each event once.
    let mut counts: Vec<BTreeMap<(String, String), u64>> = vec![BTreeMap::new(); 2];
    for (h, events) in hours.iter().enumerate() {
        for (_, scope, key, _) in events {
            *counts[h]
                .entry(((*scope).to_owned(), key.clone()))
                .or_default() += 1;
        }
    }
    let mut both = counts[0].clone();
    for (k, n) in &counts[1] {
        *both.entry(k.clone()).or_default() += n;
    }
    let end = format_rfc3339_ms(second_end);
    let list = |window: &str, scope: &str| -> Option<Value> {
        let (status, body) = common::get(&format!(
            "{}/v1/rankings/plays?window={window}&scope={scope}",
            stack.reducer.base
        ));
        (status == 200)
            .then(|| serde_json::from_str(&body).expect("json"))
            .filter(|l: &Value| l["windowEnd"].as_str() == Some(end.as_str()))
    };
    for (window, want) in [("1h", &counts[1]), ("24h", &both)] {
        for scope in ["", "eu"] {
            let served =
                common::await_some(&format!("the {window} list ending {end}"), WAIT, || {
                    list(window, scope)
                });
            assert_eq!(served["mode"], "exact");
            assert_eq!(
                list_items(&served),
                top(want, scope),
                "{window} {scope:?}: {served}"
            );
        }
    }

    for h in 0..2 {
        recount(&stack, dir.path(), first_hour + h * HOUR);
    }
    let grades = common::await_some("two graded hours", WAIT, || {
        let (status, body) = common::get(&format!("{}/v1/grades", stack.reducer.base));
        let value: Value = serde_json::from_str(&body).ok()?;
        let grades = value["grades"].as_array()?.clone();
        (status == 200 && grades.len() == 2).then_some(grades)
    });
    for grade in &grades {
        assert_eq!(grade["maxOvercount"], 0, "{grade}");
        assert_eq!(grade["recallAtK"], 1.0, "{grade}");
        assert_eq!(grade["boundViolated"], false, "{grade}");
        assert_eq!(grade["maxRankDisplacement"], 0, "{grade}");
    }
}

/// Per (scope, key), the events of `events` in `[start, end)` (all before `end` without a start).
fn counts_in(events: &[Event], start: Option<i64>, end: i64) -> BTreeMap<(String, String), u64> {
    let mut counts = BTreeMap::new();
    for (time, scope, key, _) in events {
        if start.is_none_or(|s| *time >= s) && *time < end {
            *counts
                .entry(((*scope).to_owned(), key.clone()))
                .or_default() += 1;
        }
    }
    counts
}

/// A key of the global scope on each shard, played once at `time`: it moves every shard's
/// watermark past `time` minus the lateness.
fn closers(time: i64, round: &str) -> Vec<Event> {
    (0..SHARDS)
        .map(|shard| {
            let key = (0..)
                .map(|i| format!("closer-{i}"))
                .find(|k| topk_engine::partition::shard_for("plays", "", k, SHARDS) == shard)
                .expect("a key for the shard");
            (time, "", key, format!("closer-{round}-{shard}"))
        })
        .collect()
}

/// A refreshed 24h (and all-time) list moves its head every minute on the operator's rendered
/// config: two recounted hours plus the open hour's minutes so far, labelled from the hour that
/// the next hour end will keep, recounted until the open hour, equal to a brute-force count of
/// the events in its range; a key rising in the open hour climbs it minute by minute.
#[test]
fn a_refreshed_list_moves_its_head_every_minute_over_recounted_hours() {
    let Some(env) = TestEnv::get("minute-fresh long lists") else {
        return;
    };
    // No other 1h window: the 24h list's head gives the streaming hours too.
    let windows = r#"
  - {name: 24h, length: 24h, bucket: 1h, refresh: 1m}
  - {name: all, allTime: true, bucket: 1h, refresh: 1m}
"#;
    let counting = r#"
mode: exact
allowedLateness: 1s
recount: {grace: 1m}
workers: {checkpointInterval: 200ms, idleTimeout: 4h}
"#;
    let Setup {
        input,
        dir,
        config,
        secrets,
        first_hour,
        producer,
    } = setup(&env, "refresh", counting, windows);
    // Two closed hours, then the first minutes of a third, all in the past.
    let open_hour = first_hour + 2 * HOUR;
    const MINUTE: i64 = 60_000;
    let mut sent: Vec<Event> = Vec::new();
    let send_all = |events: Vec<Event>, sent: &mut Vec<Event>| {
        for event in events {
            send(&producer, &input, &event);
            sent.push(event);
        }
        producer.flush(Duration::from_secs(30)).expect("flush");
    };
    // `riser` is played `plays` times in minute `m` of the open hour.
    let rising = |m: i64, plays: i64| -> Vec<Event> {
        (0..plays)
            .map(|i| {
                let time = open_hour + m * MINUTE + 5_000 + i * 500;
                (time, "", "riser".to_owned(), format!("riser-{m}-{i}"))
            })
            .collect()
    };
    let mut round = (0..2)
        .flat_map(|h| hour_events(first_hour + h * HOUR, h))
        .collect::<Vec<_>>();
    round.extend(rising(0, 65));
    round.extend(closers(open_hour + MINUTE + 2_000, "a"));
    send_all(round, &mut sent);

    let stack = common::Stack::start_with(dir.path(), &config, Some(&secrets));
    let _workers = [stack.worker(0), stack.worker(1)];
    let list = |window: &str, scope: &str, end: i64| -> Option<Value> {
        let (status, body) = common::get(&format!(
            "{}/v1/rankings/plays?window={window}&scope={scope}",
            stack.reducer.base
        ));
        (status == 200)
            .then(|| serde_json::from_str::<Value>(&body).expect("json"))
            .filter(|l| l["windowEnd"].as_str() == Some(format_rfc3339_ms(end).as_str()))
    };
    // The hours close first (streaming): their own lists at the open hour's start.
    common::await_some("the 24h list at the open hour's start", WAIT, || {
        list("24h", "", open_hour)
    });
    for h in 0..2 {
        recount(&stack, dir.path(), first_hour + h * HOUR);
    }
    let mut riser_ranks = Vec::new();
    for minute in [1, 2] {
        let end = open_hour + minute * MINUTE;
        for (window, start) in [("24h", Some(open_hour + HOUR - 24 * HOUR)), ("all", None)] {
            let counts = counts_in(&sent, start, end);
            for scope in ["", "eu"] {
                let served = common::await_some(
                    &format!("the {window} {scope:?} list ending at minute {minute}"),
                    WAIT,
                    || list(window, scope, end),
                );
                assert_eq!(served["mode"], "exact", "{served}");
                assert_eq!(
                    served["windowStart"].as_str().map(str::to_owned),
                    start.map(format_rfc3339_ms),
                    "{served}"
                );
                // Exact mode: the whole list is exact (the recount only removes re-deliveries).
                assert_eq!(served["exactUntil"], served["windowEnd"], "{served}");
                assert_eq!(served["maxOvercount"], 0, "{served}");
                assert_eq!(
                    list_items(&served),
                    top(&counts, scope),
                    "{window} {scope:?} at minute {minute}: {served}"
                );
                if window == "24h" && scope.is_empty() {
                    riser_ranks.push(list_items(&served).iter().position(|i| i.0 == "riser"));
                }
            }
        }
        // The recounted part ends where the open hour begins.
        let (_, metrics) = common::get(&format!("{}/metrics", stack.reducer.base));
        for window in ["24h", "all"] {
            let sample = format!("topk_reducer_exact_until_seconds{{window=\"{window}\"}}");
            assert_eq!(
                common::metric(&metrics, &sample),
                Some((open_hour / 1000) as f64),
                "{sample}"
            );
        }
        // The next minute: the riser again, and every shard's watermark past its end.
        let mut next = rising(minute, 60);
        next.extend(closers(
            open_hour + (minute + 1) * MINUTE + 2_000,
            &format!("{minute}"),
        ));
        send_all(next, &mut sent);
    }
    // 65 plays: fourth, below song-8 (91), song-7 (81) and song-6 (71); then 125: first.
    assert_eq!(riser_ranks, [Some(3), Some(0)]);
}

/// A grade that breaks its bound reaches the operator through the apiserver. The operator
/// deploys the metric on the real apiserver (its config and assignment ConfigMaps); workers
/// count from the config it rendered; a reducer runs as its pod does (the API as its control
/// plane, its ordinal from `POD_NAME`), grades the recounted hour in which `song-0` was
/// re-delivered (counted again by the streaming path, once by the recount), and writes the
/// grade to the metric's status; the operator's next reconcile makes the metric `Degraded`
/// with reason `RankingInaccurate`.
#[test]
fn a_grade_past_its_bound_makes_the_metric_degraded_through_the_apiserver() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::PostParams;
    use topk_api::TopKMetric;
    use topk_operator::builders::Settings;
    use topk_operator::reconcile::{Context, reconcile};

    let Some(env) = TestEnv::get("grading through the apiserver") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = runtime.block_on(env.kube_client()).expect("client");
    runtime
        .block_on(topk_testenv::install_crd(&client, &topk_api::crd::crd()))
        .expect("CRD");
    let ns = runtime
        .block_on(env.namespace(&client, "grading"))
        .expect("namespace");
    let name = unique_name("graded");
    let input = unique_name("graded-input");
    runtime.block_on(env.create_topic(&input, SHARDS as i32, &[]));
    let spec = format!(
        "shards: {SHARDS}\nk: {K}\n{}\nwindows:\n{}",
        APPROXIMATE.trim_matches('\n'),
        LONG_WINDOWS.trim_matches('\n')
    );
    let manifest =
        topk_testenv::metric_manifest(&name, "plays", &env.kafka_bootstrap, &input, &spec);
    let metric = topk_api::load_manifest(&manifest).expect("manifest");
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    runtime
        .block_on(metrics.create(&PostParams::default(), &metric))
        .expect("create the TopKMetric");
    let operator = Context::new(client.clone(), Settings::default());
    let reconcile_once = || {
        runtime.block_on(async {
            let metric = metrics.get(&name).await.expect("get the TopKMetric");
            reconcile(std::sync::Arc::new(metric), operator.clone())
                .await
                .expect("reconcile");
        })
    };
    reconcile_once();

    // What the operator wrote is what the data plane runs by.
    let names = topk_api::names::Names::of(&name);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let data = |configmap: &str, key: &str| -> String {
        let cm = runtime
            .block_on(configmaps.get(configmap))
            .unwrap_or_else(|e| panic!("{configmap}: {e}"));
        cm.data
            .and_then(|d| d.get(key).cloned())
            .unwrap_or_else(|| panic!("{configmap} has no {key}"))
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("metric.json");
    std::fs::write(&config, data(&names.config, topk_api::CONFIG_KEY)).expect("config");
    let table_text = data(&names.assignment, topk_api::assignment::ASSIGNMENT_KEY);
    let table: topk_api::assignment::AssignmentTable =
        serde_json::from_str(&table_text).expect("the operator's table");
    let assignment = dir.path().join("assignment.json");
    std::fs::write(&assignment, &table_text).expect("assignment");

    // One closed hour, two before the current one (its recount grace long past), with
    // `song-0` delivered 1 + REDELIVERED times at its first play.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let hour = now.div_euclid(HOUR) * HOUR - 2 * HOUR;
    let producer = keyed_producer(&env);
    let mut redelivered = false;
    for event in hour_events(hour, 1) {
        let copies = if event.2 == "song-0" && !redelivered {
            redelivered = true;
            1 + REDELIVERED
        } else {
            1
        };
        for _ in 0..copies {
            send(&producer, &input, &event);
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let config_arg = config.to_str().expect("utf-8 path");
    let mut ordinals: Vec<u32> = table.shards.iter().map(|o| o.worker).collect();
    ordinals.dedup();
    let _workers: Vec<common::Process> = ordinals
        .into_iter()
        .map(|ordinal| {
            let state = dir.path().join(format!("worker-{ordinal}"));
            common::Process(
                common::topk()
                    .args(["worker", "--config", config_arg])
                    .args(["--ordinal", &ordinal.to_string()])
                    .arg("--assignment-file")
                    .arg(&assignment)
                    .arg("--state-dir")
                    .arg(state)
                    .args(["--listen", "127.0.0.1:0"])
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("start topk worker"),
            )
        })
        .collect();
    // The reducer as its pod runs it: the table and the deny list from the API, and the
    // status written there.
    let _reducer = common::Process(
        common::topk()
            .args(["reducer", "--config", config_arg])
            .arg("--state-dir")
            .arg(dir.path().join("reducer"))
            .args(["--listen", "127.0.0.1:0"])
            .env("KUBECONFIG", &env.kubeconfig)
            .env("POD_NAME", format!("{}-0", names.reducer))
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start topk reducer"),
    );
    // The reducer grades the hour once it has both its streaming list and its recount.
    recount_on(config_arg, &[], dir.path(), hour);
    let grading = common::await_some("the grade in the metric's status", WAIT, || {
        runtime.block_on(metrics.get(&name)).ok()?.status?.grading
    });
    assert_eq!(grading.hour, format_rfc3339_ms(hour), "{grading:?}");
    assert!(
        grading.max_overcount >= REDELIVERED && grading.max_overcount > grading.overcount_bound,
        "{grading:?}"
    );

    reconcile_once();
    let status = runtime
        .block_on(metrics.get(&name))
        .expect("get the TopKMetric")
        .status
        .expect("status");
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .expect("a Degraded condition");
    assert_eq!(degraded.status, "True", "{degraded:?}");
    assert_eq!(degraded.reason, "RankingInaccurate", "{degraded:?}");
    assert!(
        degraded.message.contains("beyond the claimed bound"),
        "{degraded:?}"
    );
}
