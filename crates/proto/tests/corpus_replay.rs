//! Replays the committed fuzz corpus through the fuzz harness.

use std::path::PathBuf;

#[test]
fn replay_fuzz_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut n = 0;
    for entry in entries {
        let path = entry.expect("dir entry").path();
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        proto::fuzzing::run(&data);
        n += 1;
    }
    assert!(n >= 10, "corpus has only {n} files");
}
