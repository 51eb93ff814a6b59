use super::*;

const K: u64 = 1024;
const M: u64 = 1024 * K;

fn set_with(marks: &[(u64, u64)]) -> DirtyBitmaps {
    let set = DirtyBitmaps::new(8 * M);
    set.add("backup", 64 * K).expect("add");
    let fine = set.add("fine", 4 * K).expect("add");
    for &(off, len) in marks {
        for b in set.all().iter() {
            b.mark(off, len);
        }
    }
    fine.mark(7 * M, 1);
    set
}

fn extents(set: &DirtyBitmaps, name: &str) -> Vec<(u32, u32)> {
    set.get(name).expect("bitmap").extents(0, 8 * M as u32)
}

fn found(state: FileState, set: &DirtyBitmaps) -> Found {
    let bytes = encode(state, set.size(), &set.all());
    Found::Saved(decode(&bytes).expect("decodes"))
}

#[test]
fn a_clean_file_restores_every_bit_and_the_rpc_added_bitmaps() {
    let before = set_with(&[(M, 4 * K), (3 * M + 5, 100 * K)]);
    let f = found(FileState::Clean, &before);
    let after = DirtyBitmaps::new(8 * M);
    let said = restore(&after, &["backup".into()], 64 * K, &f).expect("restore");
    assert_eq!(said.note, "restored from a clean shutdown");
    assert!(said.all_dirty.is_empty());
    assert_eq!(after.names(), ["backup", "fine"]);
    for name in ["backup", "fine"] {
        assert_eq!(extents(&after, name), extents(&before, name), "{name}");
    }
    assert_eq!(after.get("fine").expect("fine").granularity(), 4 * K);
}

#[test]
fn a_file_left_in_use_or_damaged_or_missing_makes_everything_dirty() {
    let before = set_with(&[(M, 4 * K)]);
    let bytes = encode(FileState::Clean, 8 * M, &before.all());
    let mut flipped = bytes.clone();
    flipped[40] ^= 1;
    let cases = [
        (found(FileState::InUse, &before), "did not stop cleanly"),
        (Found::Damaged("x".into()), "damaged"),
        (Found::Missing, "no bitmap file yet"),
        (
            Found::Damaged(decode(&flipped).expect_err("bad sum")),
            "checksum",
        ),
        (
            Found::Damaged(decode(&bytes[..bytes.len() - 9]).expect_err("short")),
            "checksum",
        ),
    ];
    for (f, why) in cases {
        let after = DirtyBitmaps::new(8 * M);
        let said = restore(&after, &["backup".into()], 64 * K, &f).expect("restore");
        assert_eq!(said.all_dirty, after.names());
        let said = said.note;
        assert!(said.contains("all dirty") && said.contains(why), "{said}");
        for b in after.all().iter() {
            assert_eq!(b.dirty_bytes(), 8 * M, "{}: {said}", b.name());
        }
    }
}

#[test]
fn another_size_or_an_unsaved_bitmap_starts_all_dirty() {
    let before = set_with(&[(M, 4 * K)]);
    let f = found(FileState::Clean, &before);
    let bigger = DirtyBitmaps::new(16 * M);
    let said = restore(&bigger, &["backup".into()], 64 * K, &f)
        .expect("restore")
        .note;
    assert!(said.contains("saved for 8388608 bytes"), "{said}");
    assert_eq!(bigger.get("backup").expect("b").dirty_bytes(), 16 * M);
    let after = DirtyBitmaps::new(8 * M);
    let names = ["new".to_string(), "backup".to_string()];
    let said = restore(&after, &names, 64 * K, &f).expect("restore");
    assert_eq!(said.all_dirty, ["new"]);
    assert!(said.note.ends_with("all dirty: new"), "{said:?}");
    assert_eq!(after.get("new").expect("new").dirty_bytes(), 8 * M);
    assert_eq!(after.get("backup").expect("b").dirty_bytes(), 64 * K);
}

#[test]
fn a_changed_granularity_rounds_the_saved_blocks_out() {
    let before = set_with(&[(M + 4 * K, 4 * K)]);
    let f = found(FileState::Clean, &before);
    let after = DirtyBitmaps::new(8 * M);
    restore(&after, &["fine".into()], 256 * K, &f).expect("restore");
    let fine = after.get("fine").expect("fine");
    assert_eq!(fine.granularity(), 256 * K);
    let want = [(M as u32, 0), (256 * K as u32, 1)];
    assert_eq!(fine.extents(0, 8 * M as u32)[..2], want);
    assert_eq!(fine.dirty_bytes(), 2 * 256 * K, "1 MiB + 4K and 7 MiB");
}

#[test]
fn the_file_is_written_atomically_and_a_foreign_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("e.bitmaps");
    assert_eq!(read(&path), Ok(Found::Missing));
    let set = set_with(&[(2 * M, 1)]);
    save(&path, FileState::Clean, &set).expect("save");
    assert!(!dir.path().join("e.bitmaps.tmp").exists());
    let Ok(Found::Saved(s)) = read(&path) else {
        panic!("saved");
    };
    assert_eq!(
        (s.state, s.size, s.bitmaps.len()),
        (FileState::Clean, 8 * M, 2)
    );
    save(&path, FileState::InUse, &set).expect("save");
    assert!(matches!(read(&path), Ok(Found::Saved(s)) if s.state == FileState::InUse));
    std::fs::write(&path, b"").expect("write");
    assert!(matches!(read(&path), Ok(Found::Damaged(_))));
    std::fs::write(&path, b"QFI\xfb disk image").expect("write");
    let e = read(&path).expect_err("foreign");
    assert!(e.contains("refusing to overwrite"), "{e}");
    let e = read(&dir.path().join("nope/e.bitmaps")).expect_err("no dir");
    assert!(e.contains("does not exist"), "{e}");
    assert!(read(dir.path()).is_err(), "a directory");
}

#[test]
fn decoding_never_panics_on_garbage() {
    let set = set_with(&[(0, 1)]);
    let bytes = encode(FileState::Clean, 8 * M, &set.all());
    for cut in 0..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] = b[i].wrapping_add(0x55);
        assert!(decode(&b).is_err(), "byte {i} changed");
    }
}
