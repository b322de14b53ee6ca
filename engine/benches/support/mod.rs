//! The event stream of the worker benchmarks, shared by `engine/benches/ingest.rs` and
//! `worker/benches/throughput.rs` (through a `#[path]` module) so that both count the same input.

/// Keys per scope.
pub const KEYS: u64 = 10_000;

/// Events per millisecond of event time.
pub const EVENTS_PER_MS: u64 = 1000;

/// Calls `f(scope, key, payload)` for `events` small JSON events (~70 bytes) over [`KEYS`]
/// keys in 3 scopes, one millisecond of event time per thousand events from `start_ms`.
pub fn events(events: u64, start_ms: i64, mut f: impl FnMut(&str, &str, String)) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..events {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let key = format!("k{}", (state % KEYS) * (state % 3) / 2);
        let scope = ["eu", "us", "ap"][(i % 3) as usize];
        let payload = format!(
            r#"{{"event_time":{},"metric":"bench","scope":"{scope}","key":"{key}"}}"#,
            start_ms + (i / EVENTS_PER_MS) as i64
        );
        f(scope, &key, payload);
    }
}
