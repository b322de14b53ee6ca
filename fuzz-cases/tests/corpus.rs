//! Every committed corpus input (`fuzz/corpus/TARGET/*`) through its target, on stable: what
//! the fuzzer found once stays found, and the seeds stay valid examples.

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
