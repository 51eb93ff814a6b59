//! Replays the committed fuzz corpus (`fuzz/corpus/decode.bin`, packed by
//! `fuzz/corpus.py`) through the fuzz harness.

use std::path::PathBuf;

#[test]
fn replay_fuzz_corpus() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode.bin");
    let packed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let inputs = proto::fuzzing::packed_inputs(&packed).unwrap_or_else(|e| panic!("{e}"));
    for data in &inputs {
        proto::fuzzing::run(data);
    }
    assert!(
        inputs.len() >= 10,
        "corpus has only {} inputs",
        inputs.len()
    );
}
