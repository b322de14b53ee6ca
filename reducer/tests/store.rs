//! The ranking store on a real RocksDB: readers only ever see pointed versions, a crash
//! between writing versions and moving pointers leaves them on the old ones, rollback moves a
//! pointer back, retention keeps the served and newest versions, and a replica that applies
//! the writer's ranking log changes holds what the writer holds and nothing else.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use topk_api::RankingRecord;
use topk_engine::RankedItem;
use topk_engine::event::format_rfc3339_ms;
use topk_reducer::store::{ListChange, Meta, RankingStore, Retention};

fn record(window: &str, scope: &str, version: u64, as_of_ms: i64, leader: &str) -> RankingRecord {
    RankingRecord {
        retries_may_count: false,
        metric: "plays".into(),
        scope: scope.into(),
        window: window.into(),
        window_start: None,
        window_end: Some(format_rfc3339_ms(as_of_ms)),
        items: vec![RankedItem {
            rank: 1,
            key: leader.into(),
            count: version,
            baseline: None,
            score: None,
        }],
        mode: "exact".into(),
        max_overcount: 0,
        watermark: format_rfc3339_ms(as_of_ms),
        as_of: format_rfc3339_ms(as_of_ms),
        version,
        exact_until: None,
        stale: false,
        input_range: Vec::new(),
        regions: None,
    }
}

fn meta(end: i64, resume: i64) -> Meta {
    Meta {
        published_ends: BTreeMap::from([("1h".to_owned(), end)]),
        resume_offset: Some(resume),
        log_offset: None,
    }
}

#[test]
fn a_crash_before_the_pointer_moves_leaves_readers_on_the_old_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rankings");
    {
        let store = RankingStore::open(&path, "plays").unwrap();
        let v1 = [
            record("1h", "", 1, 1_000, "old"),
            record("1h", "eu", 1, 1_000, "old-eu"),
        ];
        store.write_versions(&v1).unwrap();
        store.point(&v1, &meta(1_000, 7)).unwrap();
        // Version 2 is written, then the process dies before the pointers move.
        store
            .write_versions(&[
                record("1h", "", 2, 2_000, "new"),
                record("1h", "eu", 2, 2_000, "new-eu"),
            ])
            .unwrap();
    }
    let store = RankingStore::open(&path, "plays").unwrap();
    let latest = store.latest().unwrap();
    assert_eq!(latest.len(), 2);
    assert!(latest.iter().all(|r| r.version == 1), "{latest:?}");
    assert_eq!(
        store.latest_of("1h", "").unwrap().unwrap().items[0].key,
        "old"
    );
    assert_eq!(store.meta(&["1h".into()]).unwrap(), meta(1_000, 7));
    // The orphan is never reused: the next version number is past it.
    assert_eq!(store.newest_version("1h", "").unwrap(), 2);
    // A store rebuilt after corruption numbers every list above its floor.
    store.rebuilt(1_700_000_000_000).unwrap();
    assert_eq!(store.newest_version("1h", "").unwrap(), 1_700_000_000_000);
    assert_eq!(store.newest_version("5m", "eu").unwrap(), 1_700_000_000_000);
    // Scopes are separate lists, whatever bytes they hold.
    let odd = record("1h", "a/b\u{0}c", 1, 1_000, "odd");
    store.write_versions(std::slice::from_ref(&odd)).unwrap();
    store
        .point(std::slice::from_ref(&odd), &Meta::default())
        .unwrap();
    assert_eq!(store.latest_of("1h", "a/b\u{0}c").unwrap(), Some(odd));
    assert_eq!(store.versions("1h", "a/b").unwrap(), Vec::<u64>::new());
}

#[test]
fn rollback_moves_the_pointer_to_a_stored_version_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = RankingStore::open(dir.path(), "plays").unwrap();
    for v in 1..=3 {
        let r = [record(
            "1h",
            "",
            v,
            v as i64 * 1_000,
            &format!("leader-{v}"),
        )];
        store.write_versions(&r).unwrap();
        store.point(&r, &Meta::default()).unwrap();
    }
    assert_eq!(store.handled_rollback().unwrap(), None);
    let back = store.rollback("1h", "", 2, "first").unwrap();
    assert_eq!(back.items[0].key, "leader-2");
    assert_eq!(store.latest_of("1h", "").unwrap().unwrap().version, 2);
    assert_eq!(store.handled_rollback().unwrap().as_deref(), Some("first"));
    let missing = store.rollback("1h", "", 9, "second").unwrap_err();
    assert!(missing.to_string().contains("no version 9"), "{missing}");
    assert_eq!(store.latest_of("1h", "").unwrap().unwrap().version, 2);
    assert_eq!(store.handled_rollback().unwrap().as_deref(), Some("first"));
    store.mark_rollback_handled("second").unwrap();
    assert_eq!(store.handled_rollback().unwrap().as_deref(), Some("second"));
}

#[test]
fn retention_keeps_the_newest_and_the_pointed_versions() {
    let dir = tempfile::tempdir().unwrap();
    let store = RankingStore::open(dir.path(), "plays").unwrap();
    for v in 1..=10 {
        let r = [record("1h", "", v, v as i64 * 1_000, "k")];
        store.write_versions(&r).unwrap();
        if v <= 4 {
            store.point(&r, &Meta::default()).unwrap();
        }
    }
    // By count: the newest 3, plus version 4 that readers are on.
    let policy = Retention {
        keep: 3,
        older_than_ms: 0,
    };
    assert_eq!(store.retain("1h", "", policy).unwrap(), 6);
    assert_eq!(store.versions("1h", "").unwrap(), vec![4, 8, 9, 10]);
    // By age: everything published before 9 s goes, but never the pointed or newest one.
    let policy = Retention {
        keep: 100,
        older_than_ms: 9_500,
    };
    assert_eq!(store.retain("1h", "", policy).unwrap(), 2);
    assert_eq!(store.versions("1h", "").unwrap(), vec![4, 10]);
}

#[test]
fn only_an_empty_list_is_deleted_and_its_versions_continue_above_the_deleted_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = RankingStore::open(&dir.path().join("rankings"), "plays").unwrap();
    let full = [
        record("1h", "eu", 1, 1_000, "a"),
        record("1h", "us", 1, 1_000, "b"),
    ];
    store.write_versions(&full).unwrap();
    store.point(&full, &meta(1_000, 1)).unwrap();
    let mut emptied = record("1h", "eu", 2, 2_000, "a");
    emptied.items.clear();
    store
        .write_versions(std::slice::from_ref(&emptied))
        .unwrap();
    store
        .point(std::slice::from_ref(&emptied), &meta(2_000, 2))
        .unwrap();

    assert!(
        !store.delete_empty_list("1h", "us").unwrap(),
        "a list with items stays"
    );
    assert!(!store.delete_empty_list("1h", "nowhere").unwrap());
    assert!(store.delete_empty_list("1h", "eu").unwrap());
    assert_eq!(store.latest_of("1h", "eu").unwrap(), None);
    assert_eq!(store.versions("1h", "eu").unwrap(), Vec::<u64>::new());
    assert_eq!(
        store.latest_of("1h", "us").unwrap().map(|r| r.version),
        Some(1)
    );
    assert_eq!(
        store.newest_version("1h", "eu").unwrap(),
        2,
        "the next version is 3"
    );
}

/// Start-up reads the exact hours with the lists: a store holding an exact-hour record that
/// does not decode is set aside and rebuilt like one whose lists do not, never a crash loop.
#[test]
fn an_undecodable_exact_hour_sets_the_store_aside_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let settings = topk_reducer::ReducerSettings {
        name: "plays".into(),
        merge: topk_reducer::ReducerConfig {
            metric: "plays".into(),
            config_version: "v1".into(),
            shards: 1,
            k: 3,
            windows: vec!["1h".into()],
            window_lengths: vec![Some(3_600_000)],
            trending: None,
            heads: Default::default(),
        },
        bucket_ms: vec![60_000],
        kafka: topk_api::kafka::KafkaProperties::plaintext("127.0.0.1:9"),
        topics: topk_api::topics::TopicNames::of("test", "plays"),
        state_dir: dir.path().to_owned(),
        stale_after: std::time::Duration::from_secs(60),
        keep_versions: 10,
        keep_for: std::time::Duration::from_secs(3600),
        point_counts: None,
        region_output: None,
        regions: None,
        replica: 0,
        replicas: 1,
        max_record_bytes: 1 << 20,
    };
    let path = dir.path().join("rankings");
    {
        let store = RankingStore::open(&path, "plays").unwrap();
        let v1 = [record("1h", "", 1, 1_000, "a")];
        store.write_versions(&v1).unwrap();
        store.point(&v1, &meta(1_000, 1)).unwrap();
    }
    {
        // An exact-hour manifest record (tag `x`, hour 0) that is not JSON.
        let db = rocksdb::DB::open_default(&path).unwrap();
        let mut key = vec![b'x'];
        key.extend_from_slice(&0i64.to_be_bytes());
        db.put(key, b"\xff not json").unwrap();
    }
    let shared = topk_reducer::reducer::open_shared(&settings).expect("opened after set-aside");
    assert_eq!(shared.metrics.corrupt_store.get(), 1);
    assert!(topk_runtime::store::aside_path(&path).exists());
    assert!(
        shared.served.all().is_empty(),
        "the rebuilt store starts empty"
    );
}

/// What the writer appends is what a follower applies: the same versions and pointers, and
/// deletions as tombstones. Records that are not a version or pointer of the metric's lists
/// (another metric's, bookkeeping, a value that does not decode) are skipped and counted.
#[test]
fn a_follower_applying_the_log_holds_the_writers_lists_and_nothing_else() {
    let (writer_dir, follower_dir, other_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let writer = RankingStore::open(writer_dir.path(), "plays").unwrap();
    let follower = RankingStore::open(follower_dir.path(), "plays").unwrap();
    let other = RankingStore::open(other_dir.path(), "clicks").unwrap();
    let mut log = Vec::new();
    for version in 1..=3 {
        let records = [record("1h", "eu", version, 1_000 * version as i64, "a")];
        log.extend(writer.publication_changes(&records).unwrap());
        writer.write_versions(&records).unwrap();
        writer.point(&records, &Meta::default()).unwrap();
    }
    log.extend(writer.deletions("1h", "eu", &[1], false));
    writer.delete_versions("1h", "eu", &[1]).unwrap();
    // Another metric's list, a bookkeeping key and a version that is not a record.
    let mut foreign = other
        .publication_changes(&[record("1h", "eu", 9, 9, "x")])
        .unwrap();
    let mut bogus = writer
        .publication_changes(&[record("1h", "eu", 7, 7, "y")])
        .unwrap();
    bogus[0].1 = Some(b"not json".to_vec());
    bogus.truncate(1);
    log.append(&mut foreign);
    log.append(&mut bogus);
    log.push((
        b"mresume-offset".to_vec(),
        Some(0i64.to_be_bytes().to_vec()),
    ));

    let (changed, rejected) = follower.apply_log(&log, 42).unwrap();
    assert_eq!(rejected, 4);
    assert_eq!(
        changed.last(),
        Some(&ListChange::Pointed {
            window: "1h".into(),
            scope: "eu".into()
        })
    );
    assert_eq!(follower.versions("1h", "eu").unwrap(), [2, 3]);
    assert_eq!(
        follower.versions("1h", "eu").unwrap(),
        writer.versions("1h", "eu").unwrap()
    );
    assert_eq!(follower.latest().unwrap(), writer.latest().unwrap());
    assert_eq!(follower.log_offset().unwrap(), Some(42));
    assert_eq!(follower.meta(&["1h".into()]).unwrap().resume_offset, None);

    // A whole list deleted: pointer and versions go, and it is no longer served.
    let (changed, rejected) = follower
        .apply_log(&writer.deletions("1h", "eu", &[2, 3], true), 43)
        .unwrap();
    assert_eq!(rejected, 0);
    assert_eq!(
        changed,
        [ListChange::Removed {
            window: "1h".into(),
            scope: "eu".into()
        }]
    );
    assert!(follower.latest().unwrap().is_empty());
    assert!(follower.versions("1h", "eu").unwrap().is_empty());
}
