//! Every committed corpus input (`fuzz/corpus/TARGET/*`) through its target, on stable: what
//! the fuzzer found once stays found, and the seeds stay valid examples.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

#[test]
fn every_corpus_input_runs_through_its_target() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (name, target) in topk_fuzz_cases::TARGETS {
        let dir = corpus.join(name);
        let inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("corpus entry").path())
            .collect();
        assert!(!inputs.is_empty(), "no corpus for {name}");
        for input in inputs {
            let data = std::fs::read(&input).expect("corpus input");
            target(&data);
        }
    }
}

/// The snapshot seeds are states the engine wrote in the current layout (the approximate one
/// with counts an open bucket's candidates hold outside its sketch), so that fuzzing starts
/// from inputs that restore and reach the code behind decoding.
#[test]
fn the_snapshot_seeds_restore_under_their_configuration() {
    use topk_engine::snapshot::WindowSnapshot;
    use topk_engine::stream::{ShardStream, StreamSnapshot};

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/snapshot");
    let configs = ["exact", "approximate"]
        .into_iter()
        .zip(topk_fuzz_cases::snapshot_configs());
    for (name, cfg) in configs {
        let data = std::fs::read(dir.join(name)).expect("seed");
        let snap: StreamSnapshot =
            postcard::from_bytes(&data).unwrap_or_else(|e| panic!("{name}: {e}"));
        ShardStream::restore(&cfg, &snap).unwrap_or_else(|e| panic!("{name}: {e}"));
        let pending = snap.counter.windows.iter().any(|w| match w {
            WindowSnapshot::Approximate(state) => state
                .open
                .iter()
                .flat_map(|b| b.candidates.iter().flatten())
                .any(|(_, _, _, pending)| *pending > 0),
            _ => false,
        });
        assert_eq!(pending, name == "approximate", "{name}");
    }
}
