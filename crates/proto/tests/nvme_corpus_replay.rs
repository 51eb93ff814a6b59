//! Replays the committed NVMe/TCP fuzz corpus (`fuzz/corpus/nvme_decode.bin`,
//! packed by `fuzz/corpus.py`) through its fuzz harness.

use std::path::PathBuf;

#[test]
fn replay_nvme_fuzz_corpus() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/nvme_decode.bin");
    let packed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let inputs = proto::fuzzing::packed_inputs(&packed).unwrap_or_else(|e| panic!("{e}"));
    let (n, mut pdus) = (inputs.len(), 0);
    for data in &inputs {
        pdus += proto::nvme::fuzzing::run(data);
        proto::nvme::fuzzing::run_queue(data);
    }
    assert!(n >= 10, "corpus has only {n} files");
    // The hand-made seeds alone decode 23 PDUs: the corpus reaches past ICReq.
    assert!(pdus >= 23, "the corpus decodes only {pdus} PDUs");
}
