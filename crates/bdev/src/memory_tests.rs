use super::*;

fn write(m: &MallocMem, offset: u64, data: &mut [u8]) -> IoResult {
    let iov = [libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    }];
    m.execute(IoOp::Write { fua: false }, offset, data.len() as u32, &iov)
}

/// Resident set of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    pages * PAGE as u64
}

#[test]
fn a_large_sparse_disk_costs_address_space_not_ram() {
    let before = rss();
    let m = MallocMem::new(16 << 40, Budget::new(1 << 30)).expect("16 TiB of address space");
    assert_eq!(m.words, (16usize << 40) / CHUNK / 64);
    // Reading the map of untouched chunks maps no memory either.
    let status = m.block_status(8 << 40, u32::MAX);
    assert_eq!(status, vec![(u32::MAX, EXTENT_HOLE)]);
    assert_eq!(write(&m, 12 << 40, &mut [1u8; 512]), IoResult::Ok);
    assert!(rss() < before + (8 << 20), "{} -> {}", before, rss());
}

#[test]
fn writes_past_the_budget_fail_with_enospc_until_zeroing_refunds() {
    let m = MallocMem::new(1 << 20, Budget::new(2 * CHUNK as u64)).expect("map");
    let mut data = vec![3u8; CHUNK + 1];
    assert_eq!(write(&m, 0, &mut data), IoResult::Ok, "two chunks fit");
    assert_eq!(m.budget.used(), 2 * CHUNK as u64);
    assert_eq!(
        write(&m, 100, &mut data),
        IoResult::Ok,
        "rewrites cost nothing"
    );
    let third = 4 * CHUNK as u64;
    assert_eq!(
        write(&m, third, &mut [1u8; 1]),
        IoResult::Err(crate::ENOSPC)
    );
    let trim = IoOp::Trim { fua: false };
    assert_eq!(m.execute(trim, 0, CHUNK as u32, &[]), IoResult::Ok);
    assert_eq!(m.budget.used(), CHUNK as u64, "a whole chunk refunded");
    assert_eq!(write(&m, third, &mut [1u8; 1]), IoResult::Ok);
    // A partly zeroed chunk stays written and charged.
    assert_eq!(m.execute(trim, third, 1, &[]), IoResult::Ok);
    assert_eq!(m.budget.used(), 2 * CHUNK as u64);
}

#[test]
fn only_wholly_written_ranges_are_lent() {
    let m = MallocMem::new(1 << 20, Budget::new(1 << 20)).expect("map");
    let chunk = CHUNK as u32;
    assert!(m.lend(0, 4096).is_none(), "a hole");
    let mut data = vec![9u8; CHUNK];
    assert_eq!(write(&m, u64::from(chunk), &mut data), IoResult::Ok);
    let lent = m.lend(u64::from(chunk) + 10, 100).expect("written");
    assert_eq!(lent.iov_len, 100);
    // SAFETY: the lent range is inside the mapping.
    assert_eq!(unsafe { *lent.iov_base.cast::<u8>() }, 9);
    assert!(m.lend(u64::from(chunk) - 1, 2).is_none(), "half a hole");
    assert!(m.lend(u64::from(2 * chunk), 1).is_none());
    assert!(m.lend(u64::from(chunk), 0).is_none(), "nothing to lend");
    assert!(m.lend(1 << 20, 1).is_none(), "past the end");
}

#[test]
fn written_chunks_are_data_and_the_rest_holes() {
    let m = MallocMem::new(1 << 20, Budget::new(1 << 20)).expect("map");
    let whole = 1u32 << 20;
    assert_eq!(m.block_status(0, whole), vec![(whole, EXTENT_HOLE)]);
    assert_eq!(write(&m, 100_000, &mut [7u8; 10]), IoResult::Ok);
    let chunk = CHUNK as u32;
    assert_eq!(
        m.block_status(0, whole),
        vec![
            (chunk, EXTENT_HOLE),
            (chunk, 0),
            (whole - 2 * chunk, EXTENT_HOLE)
        ]
    );
    // A query starting inside a chunk reports from there.
    assert_eq!(m.block_status(70_000, 100), vec![(100, 0)]);
}

#[test]
fn zeroing_whole_chunks_makes_holes_again_partial_ones_stay_data() {
    let m = MallocMem::new(1 << 20, Budget::new(1 << 20)).expect("map");
    let chunk = CHUNK as u32;
    assert_eq!(write(&m, 0, &mut vec![1u8; 3 * CHUNK]), IoResult::Ok);
    let zero = IoOp::WriteZeroes {
        may_trim: true,
        fua: false,
        fast: false,
    };
    // Chunk 0 partly, chunk 1 wholly.
    assert_eq!(m.execute(zero, 100, 2 * chunk - 100, &[]), IoResult::Ok);
    assert_eq!(
        m.block_status(0, 3 * chunk),
        vec![(chunk, 0), (chunk, EXTENT_HOLE), (chunk, 0)]
    );
    let mut back = vec![9u8; 2 * CHUNK];
    let iov = [libc::iovec {
        iov_base: back.as_mut_ptr().cast(),
        iov_len: back.len(),
    }];
    assert_eq!(m.execute(IoOp::Read, 0, 2 * chunk, &iov), IoResult::Ok);
    assert!(back[..100].iter().all(|b| *b == 1));
    assert!(back[100..].iter().all(|b| *b == 0));
}

#[test]
fn write_zeroes_with_no_hole_leaves_provisioned_data() {
    let m = MallocMem::new(1 << 20, Budget::new(4 * CHUNK as u64)).expect("map");
    let chunk = CHUNK as u32;
    assert_eq!(write(&m, 0, &mut vec![1u8; CHUNK]), IoResult::Ok);
    let no_hole = IoOp::WriteZeroes {
        may_trim: false,
        fua: false,
        fast: false,
    };
    // A written chunk and a hole, both wholly: both stay (become) data.
    assert_eq!(m.execute(no_hole, 0, 2 * chunk, &[]), IoResult::Ok);
    assert_eq!(
        m.block_status(0, 3 * chunk),
        vec![(2 * chunk, 0), (chunk, EXTENT_HOLE)]
    );
    assert_eq!(m.budget.used(), 2 * CHUNK as u64, "both chunks charged");
    let mut back = vec![9u8; 2 * CHUNK];
    let iov = [libc::iovec {
        iov_base: back.as_mut_ptr().cast(),
        iov_len: back.len(),
    }];
    assert_eq!(m.execute(IoOp::Read, 0, 2 * chunk, &iov), IoResult::Ok);
    assert!(back.iter().all(|b| *b == 0), "reads as zeros");
    // Provisioning past the budget fails as a write would.
    assert_eq!(
        m.execute(no_hole, 2 * u64::from(chunk), 3 * chunk, &[]),
        IoResult::Err(crate::ENOSPC)
    );
    // Without NO_HOLE the same zeroing makes holes and refunds.
    let may_trim = IoOp::WriteZeroes {
        may_trim: true,
        fua: false,
        fast: false,
    };
    assert_eq!(m.execute(may_trim, 0, 1 << 20, &[]), IoResult::Ok);
    assert_eq!(m.block_status(0, 1 << 20), vec![(1 << 20, EXTENT_HOLE)]);
    assert_eq!(m.budget.used(), 0);
}

#[test]
fn reads_across_holes_and_data_see_zeros_and_the_written_bytes() {
    let m = MallocMem::new(1 << 20, Budget::new(1 << 20)).expect("map");
    let at = CHUNK - 3;
    assert_eq!(write(&m, at as u64, &mut [5u8; 6]), IoResult::Ok);
    // Chunk 0 was never written; one that was, and was then zeroed by
    // whole chunks, is a hole again.
    assert_eq!(
        write(&m, 3 * CHUNK as u64, &mut vec![4u8; CHUNK]),
        IoResult::Ok
    );
    let trim = IoOp::Trim { fua: false };
    assert_eq!(
        m.execute(trim, 3 * CHUNK as u64, CHUNK as u32, &[]),
        IoResult::Ok
    );
    let (mut a, mut b) = (vec![9u8; CHUNK], vec![9u8; 3 * CHUNK]);
    let iov = [
        libc::iovec {
            iov_base: a.as_mut_ptr().cast(),
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        },
    ];
    assert_eq!(
        m.execute(IoOp::Read, 0, 4 * CHUNK as u32, &iov),
        IoResult::Ok
    );
    let mut back = a;
    back.extend_from_slice(&b);
    let mut want = vec![0u8; 4 * CHUNK];
    want[at..at + 6].fill(5);
    assert!(back == want, "holes read as zeros, data as written");
}

fn trim(m: &MallocMem, offset: u64, len: u64) -> IoResult {
    let len = u32::try_from(len).expect("a short trim");
    m.execute(IoOp::Trim { fua: false }, offset, len, &[])
}

/// Resident bytes of `m`'s data mapping, page by page (`mincore`): a
/// VMA in /proc/self/smaps may have merged with another test's mapping
/// beside it, and then its Rss counts that one's pages too.
fn resident(m: &MallocMem) -> u64 {
    let mut pages = vec![0u8; m.len.div_ceil(PAGE)];
    // SAFETY: `m.base..m.base + m.len` is `m`'s own mapping, page-aligned,
    // and `pages` has one byte per page of it.
    let rc = unsafe { libc::mincore(m.base.cast(), m.len, pages.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
    pages.iter().filter(|&&p| p & 1 != 0).count() as u64 * PAGE as u64
}

const R: u64 = REGION as u64;
const C: u64 = CHUNK as u64;

#[test]
fn small_budgets_and_small_disks_keep_chunks() {
    let m = MallocMem::new(64 << 30, Budget::new(1 << 20)).expect("map");
    assert_eq!(m.region, CHUNK, "a 1 MiB budget holds no 2 MiB region");
    let huge = MallocMem::with_pages(3 << 20, Budget::new(1 << 30), true).expect("map");
    assert_eq!(huge.base as usize % REGION, 0, "regions are huge pages");
}

#[test]
fn a_region_is_charged_once_and_refunded_when_all_its_chunks_are_holes() {
    let m = MallocMem::with_pages(4 * R, Budget::new(1 << 30), true).expect("map");
    assert_eq!(write(&m, 0, &mut [1u8; 1]), IoResult::Ok);
    assert_eq!(m.budget.used(), R, "a byte costs its huge page");
    assert_eq!(write(&m, 5 * C, &mut [2u8; 1]), IoResult::Ok);
    assert_eq!(m.budget.used(), R, "the region is paid for");
    assert_eq!(write(&m, R + 10, &mut [3u8; 1]), IoResult::Ok);
    assert_eq!(m.budget.used(), 2 * R);
    // Chunk 0 becomes a hole, but chunk 5 keeps region 0 resident.
    assert_eq!(trim(&m, 0, C), IoResult::Ok);
    assert_eq!(m.budget.used(), 2 * R, "a partial trim refunds nothing");
    assert_eq!(m.block_status(0, C as u32), vec![(C as u32, EXTENT_HOLE)]);
    assert_eq!(trim(&m, 5 * C, C), IoResult::Ok);
    assert_eq!(m.budget.used(), R, "the region's last chunk refunds it");
    // Region 1 but for the start of chunk 32, which holds its byte.
    assert_eq!(trim(&m, R + 100, R), IoResult::Ok);
    assert_eq!(m.budget.used(), R, "chunk 32 was only partly trimmed");
    assert_eq!(trim(&m, 0, 4 * R), IoResult::Ok);
    assert_eq!(m.budget.used(), 0);
    assert_eq!(
        m.block_status(0, 4 * R as u32),
        vec![(4 * R as u32, EXTENT_HOLE)]
    );
}

#[test]
fn regions_past_the_budget_fail_with_enospc_until_a_whole_one_is_trimmed() {
    let m = MallocMem::with_pages(8 * R, Budget::new(2 * R), true).expect("map");
    assert_eq!(write(&m, 0, &mut [1u8; 1]), IoResult::Ok);
    assert_eq!(write(&m, R, &mut [1u8; 1]), IoResult::Ok);
    assert_eq!(
        write(&m, 4 * R, &mut [1u8; 1]),
        IoResult::Err(crate::ENOSPC)
    );
    // Within a charged region, any chunk still fits.
    assert_eq!(write(&m, R + 31 * C, &mut vec![4u8; CHUNK]), IoResult::Ok);
    // A write straddling a charged and a new region fails whole: its first
    // part stays written, charged with its region already.
    let mut two = vec![5u8; 2 * CHUNK];
    assert_eq!(write(&m, 2 * R - C, &mut two), IoResult::Err(crate::ENOSPC));
    assert_eq!(m.budget.used(), 2 * R);
    // Region 1 with its first chunk left is still charged.
    assert_eq!(trim(&m, R + C, R - C), IoResult::Ok);
    assert_eq!(
        write(&m, 4 * R, &mut [1u8; 1]),
        IoResult::Err(crate::ENOSPC)
    );
    assert_eq!(trim(&m, R, C), IoResult::Ok);
    assert_eq!(m.budget.used(), R);
    assert_eq!(write(&m, 4 * R, &mut [1u8; 1]), IoResult::Ok);
    let mut back = [0u8; 1];
    let iov = [libc::iovec {
        iov_base: back.as_mut_ptr().cast(),
        iov_len: 1,
    }];
    assert_eq!(m.execute(IoOp::Read, 0, 1, &iov), IoResult::Ok);
    assert_eq!(back, [1], "region 0's data untouched by the trims");
}

#[test]
fn a_tail_shorter_than_a_region_costs_its_pages_and_a_small_disk_fits_its_budget() {
    let size = 2 * R + 3 * C + 512;
    let m = MallocMem::with_pages(size, Budget::new(1 << 30), true).expect("map");
    assert_eq!(write(&m, size - 1, &mut [1u8; 1]), IoResult::Ok);
    assert_eq!(m.budget.used(), 3 * C + PAGE as u64);
    // A trim to the disk's end takes its partial last chunk too.
    assert_eq!(trim(&m, 2 * R, size - 2 * R), IoResult::Ok);
    assert_eq!(m.budget.used(), 0);
    // A 1 MiB disk is one tail region: a 1 MiB budget holds all of it.
    let small = MallocMem::with_pages(1 << 20, Budget::new(1 << 20), true).expect("map");
    assert_eq!(write(&small, 0, &mut vec![1u8; 1 << 20]), IoResult::Ok);
    assert_eq!(small.budget.used(), 1 << 20);
}

#[test]
fn a_shared_budget_takes_each_bdevs_own_units() {
    let budget = Budget::new(R + C);
    let huge = MallocMem::with_pages(4 * R, budget.clone(), true).expect("map");
    let small = MallocMem::with_pages(4 * R, budget.clone(), false).expect("map");
    assert_eq!(write(&huge, 7, &mut [1u8; 1]), IoResult::Ok);
    assert_eq!(write(&small, 7, &mut [1u8; 1]), IoResult::Ok);
    assert_eq!(budget.used(), R + C);
    assert_eq!(
        write(&small, R, &mut [1u8; 1]),
        IoResult::Err(crate::ENOSPC)
    );
    assert_eq!(write(&huge, R, &mut [1u8; 1]), IoResult::Err(crate::ENOSPC));
    assert_eq!(trim(&huge, 0, R), IoResult::Ok);
    assert_eq!(budget.used(), C);
    assert_eq!(write(&small, R, &mut [1u8; 1]), IoResult::Ok);
    assert_eq!(budget.used(), 2 * C);
}

#[test]
fn an_emptied_region_is_given_back_whole_and_zeroing_holes_touches_nothing() {
    let m = MallocMem::with_pages(4 * R, Budget::new(1 << 30), true).expect("map");
    // Zeroing inside holes, by trim or without NO_HOLE, maps no pages.
    assert_eq!(trim(&m, 1000, 100), IoResult::Ok);
    let zero = IoOp::WriteZeroes {
        may_trim: true,
        fua: false,
        fast: false,
    };
    assert_eq!(m.execute(zero, 3 * R + 5, 3 * C as u32, &[]), IoResult::Ok);
    assert_eq!((resident(&m), m.budget.used()), (0, 0));
    assert_eq!(write(&m, 0, &mut [1u8; 1]), IoResult::Ok);
    assert_eq!(write(&m, 3 * C, &mut [1u8; 1]), IoResult::Ok);
    assert!(resident(&m) >= 2 * PAGE as u64);
    // With huge pages, chunk 3's trim leaves a 2 MiB page resident but
    // for chunk 0's: chunk 0's gives back all of it.
    assert_eq!(trim(&m, 3 * C, C), IoResult::Ok);
    assert_eq!(trim(&m, 0, C), IoResult::Ok);
    assert_eq!((resident(&m), m.budget.used()), (0, 0));
}

/// Writers and trimmers of different chunks of the same regions, at once:
/// a region emptied and given back never takes another chunk's new data
/// with it, and the budget ends at zero.
#[test]
fn concurrent_writes_and_trims_of_one_region_keep_data_and_budget() {
    let m = Arc::new(MallocMem::with_pages(2 * R, Budget::new(1 << 30), true).expect("map"));
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for i in 0..300u64 {
                    let at = (i % 2) * R + u64::from(t) * 3 * C;
                    let mut data = vec![t + 1; 4096];
                    assert_eq!(write(&m, at, &mut data), IoResult::Ok);
                    let mut back = vec![0u8; 4096];
                    let iov = [libc::iovec {
                        iov_base: back.as_mut_ptr().cast(),
                        iov_len: back.len(),
                    }];
                    assert_eq!(m.execute(IoOp::Read, at, 4096, &iov), IoResult::Ok);
                    assert!(back == data, "thread {t} lost its write {i}");
                    assert_eq!(trim(&m, at, C), IoResult::Ok);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread failed");
    }
    assert_eq!(m.budget.used(), 0);
}
