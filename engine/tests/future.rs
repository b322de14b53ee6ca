//! Future-stamped input cannot move a shard's watermark past the reader's clock: whatever the
//! events' times and their records' timestamps (a producer may stamp records with any time),
//! no watermark passes the clock plus `maxFutureSkew` minus the allowed lateness, and honest
//! records are judged by their own timestamp, so a replay decides as the first run did.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;

use proptest::prelude::*;
use topk_engine::event::Event;
use topk_engine::pipeline::future_reference_ms;
use topk_engine::stream::ShardStream;
use topk_engine::{EngineConfig, Mode, RejectReason, WindowConfig};

const NOW: i64 = 1_788_289_200_000;
const YEAR_MS: i64 = 365 * 24 * 3_600_000;
const SKEW_MS: i64 = 300_000;
const LATENESS_MS: i64 = 1_000;

fn config() -> EngineConfig {
    EngineConfig {
        metric: "m".into(),
        shards: 1,
        k: 3,
        mode: Mode::Exact,
        allowed_lateness_ms: LATENESS_MS,
        max_future_skew_ms: SKEW_MS,
        max_key_bytes: 64,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe: None,
        windows: vec![
            WindowConfig::sliding("1m", 60_000, 1_000),
            WindowConfig::all_time("all", 1_000),
        ],
        trending: None,
    }
}

fn event(time_ms: i64, key: u8) -> Event<'static> {
    Event {
        event_id: None,
        time_ms,
        metric: Cow::Borrowed("m"),
        scope: Cow::Borrowed(""),
        key: Cow::Owned(format!("k{key}")),
        cost: 1,
    }
}

/// (clock step, event time and record timestamp as offsets from the clock, key). Offsets reach
/// a year either way; a record may carry no timestamp.
fn input() -> impl Strategy<Value = Vec<(i64, i64, Option<i64>, u8)>> {
    let offset = prop_oneof![
        -5_000i64..5_000,
        -YEAR_MS..YEAR_MS,
        Just(SKEW_MS),
        Just(SKEW_MS + 1),
    ];
    prop::collection::vec(
        (
            0i64..2_000,
            offset.clone(),
            prop::option::of(offset),
            0u8..4,
        ),
        1..200,
    )
}

proptest! {
    #[test]
    fn no_event_moves_the_watermark_past_the_clock_plus_the_skew(input in input()) {
        let cfg = config();
        let mut stream = ShardStream::new(&cfg, 0);
        let mut out = Vec::new();
        let mut clock = NOW;
        for (step, time, record, key) in input {
            clock += step;
            let record = record.map(|r| clock + r);
            let reference = future_reference_ms(record, clock);
            let result = stream.ingest(&event(clock + time, key), reference, &mut out);
            if time > SKEW_MS {
                prop_assert_eq!(result, Err(RejectReason::FutureTime));
            }
            let ceiling = clock + SKEW_MS - LATENESS_MS;
            prop_assert!(
                stream.watermark_ms().is_none_or(|wm| wm <= ceiling),
                "watermark {:?} past {ceiling}", stream.watermark_ms()
            );
        }
    }

    #[test]
    fn a_record_stamped_at_or_before_the_clock_is_judged_by_its_own_time(
        record in 0i64..(NOW + YEAR_MS),
        later in 0i64..YEAR_MS,
    ) {
        let clock = record.max(NOW);
        // A replay reads the same record at a later clock and decides the same way.
        prop_assert_eq!(future_reference_ms(Some(record), clock), record);
        prop_assert_eq!(future_reference_ms(Some(record), clock + later), record);
    }
}

#[test]
fn a_record_without_a_timestamp_is_judged_by_the_clock() {
    assert_eq!(future_reference_ms(None, NOW), NOW);
    assert_eq!(future_reference_ms(Some(NOW + YEAR_MS), NOW), NOW);
}
