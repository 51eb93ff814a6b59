//! Tests of the bdev stack builder and the memory leaves.

use super::*;

/// The tables are checked into specs first, as the config does.
fn build(tables: &[BdevTable]) -> Result<BdevSet, BuildError> {
    crate::build(&specs(tables)?)
}

fn check(tables: &[BdevTable]) -> Result<BdevSet, BuildError> {
    crate::check(&specs(tables)?)
}

fn spec(name: &str, kind: BdevKindName) -> BdevTable {
    BdevTable::new(name, kind)
}

fn malloc(name: &str, size: u64) -> BdevTable {
    let mut s = spec(name, BdevKindName::Malloc);
    s.size = Some(ByteSize(size));
    s
}

#[test]
fn stack_resolves_in_any_order() {
    let mut d = spec("slow", BdevKindName::Delay);
    d.base = Some("partp1".into());
    d.read_avg_us = Some(1000);
    let mut p = spec("part", BdevKindName::Split);
    p.base = Some("m".into());
    p.parts = Some(3);
    let set = build(&[d, p, malloc("m", 3 << 20)]).expect("build");
    let slow = set.get("slow").expect("slow");
    assert_eq!(slow.size(), 1 << 20);
    assert_eq!(slow.offset, 1 << 20);
    assert!(slow.has_delay());
    assert_eq!(slow.kind(), "malloc");
    assert!(set.get("partp2").is_some());
    assert!(!set.get("partp0").expect("p0").has_delay());
}

#[test]
fn build_errors_name_the_field() {
    let mut d = spec("d", BdevKindName::Delay);
    d.base = Some("nope".into());
    let e = build(&[malloc("m", 1 << 20), d]).unwrap_err();
    assert_eq!((e.index, e.field), (1, "base"));

    let e = build(&[malloc("m", 1 << 20), malloc("m", 1 << 20)]).unwrap_err();
    assert_eq!((e.index, e.field), (1, "name"));

    let mut a = spec("a", BdevKindName::Delay);
    a.base = Some("b".into());
    let mut b = spec("b", BdevKindName::Delay);
    b.base = Some("a".into());
    let e = build(&[a, b]).unwrap_err();
    assert_eq!(e.field, "base");
    assert!(e.message.contains("cycle"), "{}", e.message);

    let e = build(&[spec("n", BdevKindName::Null)]).unwrap_err();
    assert_eq!(e.field, "size");

    let mut s = spec("s", BdevKindName::Split);
    s.base = Some("m".into());
    s.parts = Some(0);
    assert_eq!(
        build(&[malloc("m", 1 << 20), s.clone()]).unwrap_err().field,
        "parts"
    );
    s.parts = Some(u32::MAX);
    let mut n = spec("m", BdevKindName::Null);
    n.size = Some(ByteSize(MAX_SIZE));
    assert_eq!(build(&[n, s]).unwrap_err().field, "parts");

    let mut f = spec("f", BdevKindName::File);
    f.path = Some("/nonexistent/dir/x.img".into());
    assert_eq!(build(&[f]).unwrap_err().field, "path");
}

#[test]
fn memory_sizes_are_exact_to_the_byte() {
    let mut n = spec("n", BdevKindName::Null);
    n.size = Some(ByteSize(1000));
    n.block_size = Some(ByteSize(4096));
    let set = build(&[n.clone(), malloc("m", (1 << 20) + 1)]).expect("odd sizes");
    assert_eq!(set.get("n").expect("n").size(), 1000);
    assert_eq!(set.get("m").expect("m").size(), (1 << 20) + 1);
    for bad in [0, MAX_SIZE + 1, u64::MAX] {
        n.size = Some(ByteSize(bad));
        let e = build(&[n.clone()]).unwrap_err();
        assert_eq!(e.field, "size", "{bad}: {}", e.message);
    }
    n.size = Some(ByteSize(MAX_SIZE));
    assert_eq!(
        build(&[n]).expect("2^63 - 1").get("n").expect("n").size(),
        MAX_SIZE
    );
}

#[test]
fn malloc_ram_is_promised_only_up_to_the_machines() {
    let ram = memory::physical_ram();
    let mut a = malloc("a", 1 << 30);
    a.max_resident = Some(ByteSize(ram / 2 + (1 << 20)));
    // Alone, it may have more than half the RAM; beside the shared half, not.
    assert!(build(&[a.clone()]).is_ok());
    let e = build(&[a.clone(), malloc("b", 1 << 30)]).unwrap_err();
    assert_eq!((e.index, e.field), (1, "size"), "{}", e.message);
    let e = build(&[malloc("b", 1 << 30), a.clone()]).unwrap_err();
    assert_eq!((e.index, e.field), (1, "max_resident"), "{}", e.message);
    a.max_resident = Some(ByteSize(0));
    assert_eq!(build(&[a]).unwrap_err().field, "max_resident");
    // Sizes past the RAM are fine: the disk is thin.
    assert!(build(&[malloc("c", ram * 4), malloc("d", ram * 4)]).is_ok());
}

#[test]
fn check_maps_malloc_as_serve_does() {
    // More address space than x86-64 user space has: refused by both.
    let huge = malloc("m", 1 << 62);
    assert_eq!(
        check(std::slice::from_ref(&huge)).unwrap_err().field,
        "size"
    );
    assert_eq!(build(&[huge]).unwrap_err().field, "size");
}

#[test]
fn fields_of_other_kinds_are_errors() {
    let mut m = malloc("m", 1 << 20);
    m.path = Some("/tmp/x".into());
    let e = build(&[m]).unwrap_err();
    assert_eq!((e.index, e.field), (0, "path"));
    assert!(e.message.contains("only file bdevs"), "{}", e.message);
    let mut n = spec("n", BdevKindName::Null);
    n.size = Some(ByteSize(1 << 20));
    n.max_resident = Some(ByteSize(1 << 20));
    assert_eq!(check(&[n]).unwrap_err().field, "max_resident");
    let mut sp = spec("s", BdevKindName::Split);
    sp.base = Some("m".into());
    sp.parts = Some(2);
    sp.size = Some(ByteSize(1 << 20));
    let e = build(&[malloc("m", 1 << 20), sp]).unwrap_err();
    assert_eq!((e.index, e.field), (1, "size"));
}

#[test]
fn malloc_roundtrip_and_zeroing() {
    let set = build(&[malloc("m", 4 << 20)]).expect("build");
    let m = set.get("m").expect("m");
    let mut data = vec![0x5au8; 8192];
    let iov = [libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    }];
    let io = |op, offset| IoRequest {
        op,
        offset,
        len: 8192,
        iov: iov.as_ptr(),
        iovcnt: 1,
    };
    // SAFETY: iov describes `data`, alive for the whole test.
    unsafe {
        assert!(matches!(
            m.prepare(&io(IoOp::Write { fua: false }, 4096)),
            Prep::Done(IoResult::Ok)
        ));
    }
    data.fill(0);
    unsafe {
        m.prepare(&io(IoOp::Read, 4096));
    }
    assert!(data.iter().all(|b| *b == 0x5a));
    unsafe {
        m.prepare(&io(
            IoOp::WriteZeroes {
                may_trim: true,
                fua: false,
                fast: false,
            },
            4096,
        ));
        m.prepare(&io(IoOp::Read, 4096));
    }
    assert!(data.iter().all(|b| *b == 0));
}

#[test]
fn null_reads_return_pattern() {
    let mut n = spec("n", BdevKindName::Null);
    n.size = Some(ByteSize(1 << 20));
    let set = build(&[n]).expect("build");
    let mut data = vec![0u8; 4096];
    let iov = [libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: 4096,
    }];
    let io = IoRequest {
        op: IoOp::Read,
        offset: 0,
        len: 4096,
        iov: iov.as_ptr(),
        iovcnt: 1,
    };
    // SAFETY: iov describes `data`.
    unsafe {
        set.get("n").expect("n").prepare(&io);
    }
    assert!(data.iter().all(|b| *b == 0xA5));
}

#[test]
fn a_fault_bdev_fails_its_range_before_the_base_and_offsets_its_own() {
    let mut p = spec("part", BdevKindName::Split);
    p.base = Some("m".into());
    p.parts = Some(2);
    let mut f = spec("flaky", BdevKindName::Fault);
    f.base = Some("partp1".into());
    f.ops = Some(vec![FaultOp::Write]);
    f.errno = Some(Errno::Enospc);
    f.fail_range = Some(FailRange {
        offset: ByteSize(0),
        length: ByteSize(4096),
    });
    let set = build(&[malloc("m", 2 << 20), p, f.clone()]).expect("build");
    let flaky = set.get("flaky").expect("flaky");
    assert!(
        flaky.has_delay(),
        "its holds go through the engine's timers"
    );
    assert!(set.fault("flaky").is_some() && set.fault("partp1").is_none());
    let mut data = vec![0x11u8; 4096];
    let iov = [libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    }];
    let io = |op, offset| IoRequest {
        op,
        offset,
        len: 4096,
        iov: iov.as_ptr(),
        iovcnt: 1,
    };
    let w = IoOp::Write { fua: false };
    // SAFETY: iov describes `data`, alive for the whole test.
    unsafe {
        assert!(matches!(
            flaky.prepare(&io(w, 0)),
            Prep::Done(IoResult::Err(ENOSPC))
        ));
        assert!(matches!(
            flaky.prepare(&io(w, 4096)),
            Prep::Done(IoResult::Ok)
        ));
        assert!(matches!(
            flaky.prepare(&io(IoOp::Read, 0)),
            Prep::Done(IoResult::Ok)
        ));
    }
    assert!(
        data.iter().all(|b| *b == 0),
        "the failed write never reached the base"
    );
    assert!(flaky.lend_read(&io(IoOp::Read, 0)).is_none());
    f.base = Some("m".into());
    f.fail_range = Some(FailRange {
        offset: ByteSize(2 << 20),
        length: ByteSize(1),
    });
    let e = build(&[malloc("m", 2 << 20), f.clone()]).unwrap_err();
    assert_eq!(e.field, "fail_range");
    f.fail_range = None;
    f.error_rate = Some(2.0);
    let e = build(&[malloc("m", 2 << 20), f]).unwrap_err();
    assert_eq!((e.index, e.field), (1, "error_rate"));
}
