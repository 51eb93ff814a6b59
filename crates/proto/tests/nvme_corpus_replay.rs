//! Replays the committed NVMe/TCP fuzz corpus through its fuzz harness.

use std::path::PathBuf;

#[test]
fn replay_nvme_fuzz_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/nvme_decode");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let (mut n, mut pdus) = (0, 0);
    for entry in entries {
        let path = entry.expect("dir entry").path();
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        pdus += proto::nvme::fuzzing::run(&data);
        proto::nvme::fuzzing::run_queue(&data);
        n += 1;
    }
    assert!(n >= 10, "corpus has only {n} files");
    // The hand-made seeds alone decode 23 PDUs: the corpus reaches past ICReq.
    assert!(pdus >= 23, "the corpus decodes only {pdus} PDUs");
}
