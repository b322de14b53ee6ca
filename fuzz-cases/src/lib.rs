//! One function per fuzz target: each takes arbitrary bytes the way the system takes them from
//! outside (an input record, a topic's record, a ConfigMap value, a manifest) and must return
//! without panicking, whatever the bytes. `fuzz/` runs them under libFuzzer; the corpus test
//! runs the committed corpus through them on stable.

use std::borrow::Cow;

use topk_api::assignment::{AssignmentTable, planner};
use topk_api::handoff::SnapshotRecords;
use topk_api::record::{ExactHourChunk, ExactHourManifest, SummaryRecord};
use topk_api::{DataPlaneConfig, load_manifest};
use topk_engine::event::{Event, EventParser};
use topk_engine::stream::{ShardStream, StreamSnapshot};
use topk_engine::{EngineConfig, Mode, SketchParams, WindowConfig};

/// What a target does with one input.
pub type Target = fn(&[u8]);

/// The targets by name (as in `fuzz/fuzz_targets/` and `fuzz/corpus/`).
pub const TARGETS: [(&str, Target); 7] = [
    ("event", event),
    ("summary", summary),
    ("snapshot", snapshot),
    ("exact_hour", exact_hour),
    ("assignment", assignment),
    ("handoff", handoff),
    ("manifest", manifest),
];

/// An input record: parsed as a worker does, and counted if accepted.
pub fn event(data: &[u8]) {
    let cfg = engine_config(Mode::Exact);
    let parser = EventParser::new(cfg.max_key_bytes);
    let mut stream = ShardStream::new(&cfg, 0);
    let mut out = Vec::new();
    if let Ok(event) = parser.parse(data) {
        let _ = stream.ingest(&event, i64::MAX, &mut out);
        stream.advance_idle(i64::MAX, 0, &mut out);
    }
}

/// A summaries-topic record: decoded as the reducer does, then split into parts again as a
/// worker would send it.
pub fn summary(data: &[u8]) {
    if let Ok(record) = serde_json::from_slice::<SummaryRecord>(data) {
        let _ = record.encode(64 * 1024);
    }
}

/// A shard's saved state (postcard, as in checkpoints and handoff snapshots): restored under
/// both modes, which must refuse what does not fit, then counted on and saved again.
pub fn snapshot(data: &[u8]) {
    let Ok(snap) = postcard::from_bytes::<StreamSnapshot>(data) else {
        return;
    };
    for cfg in snapshot_configs() {
        if let Ok(mut stream) = ShardStream::restore(&cfg, &snap) {
            let mut out = Vec::new();
            for (t, scope) in [(0, ""), (10_000, "eu"), (500_000, "")] {
                let _ = stream.ingest(&probe(t, scope), i64::MAX, &mut out);
            }
            stream.advance_idle(i64::MAX, 0, &mut out);
            let _ = stream.snapshot();
        }
    }
}

/// An exact-hours record: a manifest or a chunk of counts.
pub fn exact_hour(data: &[u8]) {
    let _ = serde_json::from_slice::<ExactHourManifest>(data);
    let _ = serde_json::from_slice::<ExactHourChunk>(data);
}

/// The assignment ConfigMap's table, read as workers and reducers read it, and as the
/// operator reads it: checked, then planned from for a few shard and worker counts. A table
/// the check passes must plan to one on running workers only.
pub fn assignment(data: &[u8]) {
    if let Ok(table) = serde_json::from_slice::<AssignmentTable>(data) {
        for shard in 0..table.shards.len().min(4096) as u32 + 1 {
            let _ = table.owner(shard);
        }
        let listed = u32::try_from(table.shards.len())
            .unwrap_or(u32::MAX)
            .min(4096);
        for shards in [1, listed.max(1), listed.saturating_add(1)] {
            for workers in [1, 3, shards] {
                let passed = planner::table_problem(&table, shards, workers, None).is_none();
                let next = planner::plan(shards, Some(&table), workers);
                assert_eq!(
                    next.shards.len(),
                    shards as usize,
                    "a plan lists every shard"
                );
                if passed {
                    assert!(
                        next.shards.iter().all(|o| o.worker < workers),
                        "a checked table planned onto a worker that does not run"
                    );
                    assert_eq!(
                        planner::table_problem(&next, shards, workers, Some(table.version)),
                        None,
                        "a plan from a checked table fails the check"
                    );
                }
            }
        }
    }
}

/// A handoff partition's records (chunks, manifests and tombstones in any order) read by a
/// worker gaining a shard, one per line: `key TAB snapshot-id TAB payload`; a line without a
/// payload is a tombstone, an empty id no header.
pub fn handoff(data: &[u8]) {
    let mut records = SnapshotRecords::default();
    for line in data.split(|b| *b == b'\n') {
        let mut fields = line.splitn(3, |b| *b == b'\t');
        let key = fields.next().unwrap_or_default();
        let id = fields
            .next()
            .filter(|id| !id.is_empty())
            .map(|id| String::from_utf8_lossy(id).into_owned());
        records.record(key, id, fields.next());
    }
    for shard in 0..3 {
        let Some(chosen) = records.newest_complete(shard, |bytes| Ok(bytes.to_vec()), |_| {})
        else {
            continue;
        };
        // What an owner of the chosen epoch deletes never changes what a reader takes.
        let mut cleaned = SnapshotRecords::default();
        for (key, id, payload) in records.live() {
            cleaned.record(key, id.clone(), Some(payload));
        }
        for key in records.older_than(shard, chosen.manifest.epoch) {
            cleaned.record(&key, None, None);
        }
        let again = cleaned.newest_complete(shard, |bytes| Ok(bytes.to_vec()), |_| {});
        assert_eq!(
            again.map(|c| (c.manifest, c.snapshot)),
            Some((chosen.manifest, chosen.snapshot)),
            "deleting older epochs' records changed the snapshot taken"
        );
    }
}

/// A TopKMetric manifest (`topk run`, the data-plane commands): loaded, validated and turned
/// into the engine's and the pods' config.
pub fn manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(metric) = load_manifest(text) {
        let _ = metric.spec.engine_config();
        if let Ok(config) = DataPlaneConfig::from_metric(&metric) {
            let _ = DataPlaneConfig::parse(&config.render());
        }
    }
}

fn engine_config(mode: Mode) -> EngineConfig {
    EngineConfig {
        metric: "m".into(),
        shards: 1,
        k: 3,
        mode,
        allowed_lateness_ms: 1_000,
        max_future_skew_ms: 1_000,
        max_key_bytes: 64,
        max_scope_bytes: 64,
        max_scopes: 16,
        dedupe: None,
        windows: vec![
            WindowConfig::sliding("short", 4_000, 1_000),
            WindowConfig::all_time("all", 1_000),
        ],
        trending: None,
    }
}

/// What the snapshot target restores under, exact then approximate: the configurations its
/// seeds were taken under.
pub fn snapshot_configs() -> [EngineConfig; 2] {
    [Mode::Exact, approximate()].map(engine_config)
}

fn approximate() -> Mode {
    Mode::Approximate(SketchParams {
        epsilon: 0.05,
        delta: 0.1,
        candidates: 4,
    })
}

fn probe(time_ms: i64, scope: &'static str) -> Event<'static> {
    Event {
        event_id: None,
        time_ms,
        metric: Cow::Borrowed("m"),
        scope: Cow::Borrowed(scope),
        key: Cow::Borrowed("k"),
        cost: 1,
    }
}
