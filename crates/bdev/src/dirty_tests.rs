use super::*;
use proptest::prelude::*;

const K: u64 = 1024;

fn bitmap(size: u64, granularity: u64) -> DirtyBitmap {
    DirtyBitmap::new("b", size, granularity).expect("bitmap")
}

#[test]
fn a_mark_rounds_out_to_the_granularity() {
    let b = bitmap(1 << 20, 64 * K);
    b.mark(65 * K, 1);
    assert_eq!(
        b.extents(0, 1 << 20),
        [(64 * 1024, 0), (64 * 1024, 1), (896 * 1024, 0)]
    );
    assert_eq!(b.dirty_bytes(), 64 * K);
    // Straddling a boundary dirties both blocks.
    b.mark(255 * K, 2 * K);
    assert_eq!(b.dirty_bytes(), 3 * 64 * K);
    // Nothing, and nothing past the end.
    b.mark(10, 0);
    b.mark(1 << 20, 4096);
    assert_eq!(b.dirty_bytes(), 3 * 64 * K);
}

#[test]
fn extents_coalesce_and_start_mid_block() {
    let b = bitmap(1 << 20, 4 * K);
    b.mark(0, 8 * K);
    b.mark(8 * K, 4 * K);
    b.mark(20 * K, 4 * K);
    let e = b.extents(2 * K, 30 * 1024);
    assert_eq!(
        e,
        [(10 * 1024, 1), (8 * 1024, 0), (4 * 1024, 1), (8 * 1024, 0)]
    );
    assert_eq!(e.iter().map(|x| u64::from(x.0)).sum::<u64>(), 30 * K);
    b.clear();
    assert_eq!(b.extents(0, 1 << 20), [(1 << 20, 0)]);
    assert_eq!(b.dirty_bytes(), 0);
}

#[test]
fn runs_across_words_and_a_partial_last_block() {
    // 200 blocks and a half: the last block is 512 bytes of a 1 KiB granularity.
    let size = 200 * K + 512;
    let b = bitmap(size, K);
    b.mark(10 * K, 150 * K);
    b.mark(size - 1, 1);
    let e = b.extents(0, size as u32);
    assert_eq!(
        e,
        [(10 * 1024, 0), (150 * 1024, 1), (40 * 1024, 0), (512, 1)]
    );
    assert_eq!(b.dirty_bytes(), 150 * K + 512);
    // Past the end: nothing, and a range ending past it stops at it.
    assert!(b.extents(size, 4096).is_empty());
    assert_eq!(b.extents(size - 512, 4096), [(512, 1)]);
}

#[test]
fn extents_stop_at_the_most_a_reply_carries() {
    let b = bitmap(64 << 20, 512);
    for k in (0..64 << 20).step_by(1024) {
        b.mark(k, 1);
    }
    let e = b.extents(0, 64 << 20);
    assert_eq!(e.len(), MAX_EXTENTS);
    assert!(e.iter().all(|x| x.0 == 512));
}

#[test]
fn names_and_granularities_are_checked() {
    assert!(DirtyBitmap::new("", 4096, 65536).is_err());
    assert!(DirtyBitmap::new("a\nb", 4096, 65536).is_err());
    assert!(DirtyBitmap::new("a", 4096, 256).is_err());
    assert!(DirtyBitmap::new("a", 4096, 3 << 12).is_err());
    assert!(DirtyBitmap::new("a", 4096, 1 << 32).is_err());
    assert!(DirtyBitmap::new("a", 0, 512).is_ok());
}

#[test]
fn a_removed_bitmap_is_all_dirty_and_no_longer_listed() {
    let set = DirtyBitmaps::new(1 << 20);
    let kept = set.add("backup", 64 * K).expect("add");
    assert!(set.add("backup", 64 * K).is_err(), "names are unique");
    assert_eq!(kept.extents(0, 4096), [(4096, 0)]);
    set.remove("backup").expect("remove");
    assert!(set.remove("backup").is_err());
    assert!(set.get("backup").is_none());
    assert_eq!(kept.extents(0, 4096), [(4096, STATE_DIRTY)]);
}

#[test]
fn marks_follow_bitmaps_added_and_removed() {
    let set = DirtyBitmaps::new(1 << 20);
    let mut marks = DirtyMarks::default();
    marks.mark(0, &set, 0, 4096);
    let a = set.add("a", 4 * K).expect("add");
    marks.mark(0, &set, 8 * K, 4096);
    assert_eq!(a.dirty_bytes(), 4 * K, "only writes after it was added");
    let b = set.add("b", 4 * K).expect("add");
    marks.mark(0, &set, 0, 4096);
    assert_eq!((a.dirty_bytes(), b.dirty_bytes()), (8 * K, 4 * K));
    set.remove("a").expect("remove");
    marks.mark(0, &set, 16 * K, 4096);
    assert_eq!((a.dirty_bytes(), b.dirty_bytes()), (8 * K, 8 * K));
}

#[test]
fn a_snapshot_takes_the_marks_and_leaves_the_bitmap_clean() {
    let set = DirtyBitmaps::new(1 << 20);
    let live = set.add("backup", 4 * K).expect("add");
    let mut marks = DirtyMarks::default();
    marks.mark(0, &set, 4 * K, 10);
    let snap = set.snapshot("backup", "inc").expect("snapshot");
    assert!(set.snapshot("backup", "inc").is_err(), "`inc` exists");
    assert!(set.snapshot("nope", "x").is_err());
    assert_eq!((live.dirty_bytes(), snap.dirty_bytes()), (0, 4 * K));
    assert_eq!(snap.granularity(), 4 * K);
    // Later writes mark both: the snapshot errs on the side of copying.
    marks.mark(0, &set, 0, 1);
    assert_eq!((live.dirty_bytes(), snap.dirty_bytes()), (4 * K, 8 * K));
    assert_eq!(set.names(), ["backup", "inc"]);
}

/// The model: one bool per block.
fn model_extents(dirty: &[bool], g: u64, size: u64, offset: u64, len: u64) -> Vec<(u32, u32)> {
    let end = (offset + len).min(size);
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut pos = offset;
    while pos < end {
        let next = ((pos / g + 1) * g).min(end);
        let f = u32::from(dirty[(pos / g) as usize]);
        match out.last_mut() {
            Some(l) if l.1 == f => l.0 += (next - pos) as u32,
            _ => out.push(((next - pos) as u32, f)),
        }
        pos = next;
    }
    out
}

proptest! {
    #[test]
    fn extents_match_a_block_model(
        shift in 9u32..14,
        blocks in 1u64..300,
        tail in 0u64..512,
        writes in prop::collection::vec((0u64..400_000, 1u64..40_000), 0..20),
        query in (0u64..400_000, 1u32..400_000),
    ) {
        let g = 1u64 << shift;
        let size = blocks * g + tail;
        let b = bitmap(size, g);
        let mut model = vec![false; size.div_ceil(g) as usize];
        for &(off, len) in &writes {
            b.mark(off, len);
            let end = (off + len).min(size);
            if off < end {
                for k in off / g..=(end - 1) / g {
                    model[k as usize] = true;
                }
            }
        }
        let (off, len) = query;
        let got = b.extents(off, len);
        prop_assert_eq!(&got, &model_extents(&model, g, size, off, u64::from(len)));
        prop_assert!(got.windows(2).all(|w| w[0].1 != w[1].1), "coalesced");
        let bytes: u64 = (0..model.len() as u64)
            .filter(|&k| model[k as usize])
            .map(|k| ((k + 1) * g).min(size) - k * g)
            .sum();
        prop_assert_eq!(b.dirty_bytes(), bytes);
    }
}

/// The marking cost on its own, printed (no assertion: timing belongs to
/// benchmarks): `cargo test --release -p iopace-bdev --lib mark_cost --
/// --ignored --nocapture`. 4 KiB marks at random offsets of a 1 GiB export
/// through a reactor's `DirtyMarks` into two bitmaps (64 KiB and 4 KiB),
/// clean at first (mostly a `fetch_or` per bitmap), then again once dirty
/// (a load per bitmap); then an export without bitmaps.
#[test]
#[ignore]
fn mark_cost() {
    let set = DirtyBitmaps::new(1 << 30);
    for (name, g) in [("g64k", 64 * K), ("g4k", 4 * K)] {
        set.add(name, g).expect("add");
    }
    let mut marks = DirtyMarks::default();
    let n = 4_000_000u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut offsets = Vec::with_capacity(n as usize);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        offsets.push((x % (1 << 18)) * 4096);
    }
    for pass in ["clean", "dirty"] {
        let t = std::time::Instant::now();
        for &o in &offsets {
            marks.mark(0, &set, o, 4096);
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!("{pass}: {ns:.1} ns per 4 KiB write (two bitmaps)");
    }
    let none = DirtyBitmaps::new(1 << 30);
    let t = std::time::Instant::now();
    for &o in &offsets {
        marks.mark(1, &none, o, 4096);
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("no bitmap: {ns:.1} ns per write");
}
