//! Engine tests over the fake network: scripted cases (the property test
//! is in `prop_tests.rs`).

use proto::Command;

use super::fake::*;
use super::*;

/// Simple replies in `bytes` after the handshake: (error, cookie) in order,
/// given each cookie's READ length.
fn replies(bytes: &[u8], read_len: impl Fn(u64) -> u32) -> Vec<(u32, u64)> {
    // Greeting (18), then option replies until the final ACK (type 1).
    let mut at = 18;
    loop {
        let typ = u32::from_be_bytes(bytes[at + 12..at + 16].try_into().unwrap());
        let len = u32::from_be_bytes(bytes[at + 16..at + 20].try_into().unwrap()) as usize;
        at += 20 + len;
        if typ == 1 {
            break;
        }
    }
    let mut out = Vec::new();
    while at + 16 <= bytes.len() {
        let err = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        let cookie = u64::from_be_bytes(bytes[at + 8..at + 16].try_into().unwrap());
        at += 16;
        if err == 0 {
            at += read_len(cookie) as usize;
        }
        out.push((err, cookie));
    }
    out
}

#[test]
fn write_then_read_round_trips() {
    let mut net = Net::new(engine("none", 32, TIMEOUTS));
    let c = net.connect();
    let mut bytes = handshake_bytes();
    bytes.extend(request_bytes(Command::Write, 1, 4096, 10_000));
    bytes.extend((0..10_000u32).map(|i| i as u8));
    net.write(c, &bytes);
    net.run_to_quiet();
    net.write(c, &request_bytes(Command::Read, 2, 4096, 10_000));
    net.run_to_quiet();
    let out = &net.clients[&c].from_server;
    let got = replies(out, |cookie| if cookie == 2 { 10_000 } else { 0 });
    assert_eq!(got, vec![(0, 1), (0, 2)]);
    let data = &out[out.len() - 10_000..];
    assert!(data.iter().enumerate().all(|(i, &b)| b == i as u8));
    assert_eq!(net.engine.buffers_in_use(), 0);
    assert_eq!(net.engine.requests_in_use(), 0);
}

/// A connection through the handshake.
fn ready_client(net: &mut Net) -> ConnId {
    let c = net.connect();
    net.write(c, &handshake_bytes());
    while net.deliver(c, usize::MAX) || net.take_sent(c, usize::MAX) {}
    c
}

/// Drives `c` alone: its bytes in, its replies out, its IOs done.
fn serve(net: &mut Net, c: ConnId) {
    for _ in 0..1000 {
        let mut moved = net.deliver(c, usize::MAX) | net.take_sent(c, usize::MAX);
        while !net.ios.is_empty() {
            net.complete_io(0);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

fn answered(net: &Net, c: ConnId, read_len: impl Fn(u64) -> u32) -> Vec<(u32, u64)> {
    replies(&net.clients[&c].from_server, read_len)
}

#[test]
fn stalled_writer_holds_at_most_its_cap_and_times_out() {
    let mut net = Net::new(engine("buffers", 24, TIMEOUTS));
    let stalled = ready_client(&mut net);
    // A 64 KiB WRITE (16 pieces) with 100 bytes of payload, then silence.
    let mut b = request_bytes(Command::Write, 1, 0, 64 << 10);
    b.extend([7u8; 100]);
    net.write(stalled, &b);
    serve(&mut net, stalled);
    let payload_cap = net.engine.io.payload_cap() as u64;
    assert!(net.engine.buffers_in_use() <= payload_cap);
    // Another client's write then read are answered meanwhile.
    let other = ready_client(&mut net);
    let mut b = request_bytes(Command::Write, 2, 8192, 4096);
    b.extend([9u8; 4096]);
    b.extend(request_bytes(Command::Read, 3, 8192, 4096));
    net.write(other, &b);
    serve(&mut net, other);
    let got = answered(&net, other, |c| if c == 3 { 4096 } else { 0 });
    assert_eq!(got.len(), 2, "the other client is served: {got:?}");
    // Past the payload timeout the stalled writer is closed, buffers back.
    net.advance(31_000_000_000);
    serve(&mut net, stalled);
    assert!(
        net.clients[&stalled].closed,
        "{:?}",
        net.engine.conn_state(stalled)
    );
    assert_eq!(net.engine.io.stats().timeouts, 1);
    assert_eq!(net.engine.buffers_in_use(), 0);
    assert!(!net.clients[&other].closed);
}

/// A timeout that frees buffers leaves their grant for the next tick, and
/// that grant posts the waiting writer's recv: `run_to_quiet` must not stop
/// there, though its last round moved nothing before that tick.
#[test]
fn writer_waiting_for_buffers_is_served_after_a_timeout_frees_them() {
    let mut net = Net::new(engine("none", 2, TIMEOUTS));
    let stalled = ready_client(&mut net);
    let mut b = request_bytes(Command::Write, 1, 0, 64 << 10);
    b.extend([7u8; 100]);
    net.write(stalled, &b);
    serve(&mut net, stalled);
    let waiter = ready_client(&mut net);
    let mut b = request_bytes(Command::Write, 2, 0, 8192);
    b.extend([9u8; 8192]);
    net.write(waiter, &b);
    // Its header alone: its payload waits for a buffer to land in.
    net.deliver(waiter, 28);
    net.advance(1_000);
    assert_eq!(
        net.engine.buffers_in_use(),
        2,
        "the stalled writer holds both"
    );
    assert!(net.clients[&waiter].recv.is_none(), "no buffer, no recv");
    net.advance(31_000_000_000);
    assert!(net.clients[&stalled].closed, "payload timeout");
    net.clients.get_mut(&waiter).expect("a client").eof = true;
    net.run_to_quiet();
    assert_eq!(answered(&net, waiter, |_| 0), vec![(0, 2)]);
    assert!(net.clients[&waiter].closed);
    assert_eq!(net.engine.buffers_in_use(), 0);
}

#[test]
fn handshake_and_idle_timeouts_close() {
    let mut net = Net::new(engine("none", 24, TIMEOUTS));
    let silent = net.connect();
    let idle = ready_client(&mut net);
    net.advance(9_000_000_000);
    assert!(!net.clients[&silent].closed);
    net.advance(2_000_000_000);
    assert!(net.clients[&silent].closed, "handshake timeout");
    assert!(!net.clients[&idle].closed);
    net.advance(300_000_000_000);
    assert!(net.clients[&idle].closed, "idle timeout");
    assert_eq!(net.engine.io.stats().timeouts, 2);
    // Without an idle limit (0, the default) an idle client stays.
    let forever = Timeouts {
        idle: 0,
        ..TIMEOUTS
    };
    let mut net = Net::new(engine("none", 24, forever));
    let idle = ready_client(&mut net);
    net.advance(3_600_000_000_000);
    assert!(!net.clients[&idle].closed, "no idle limit");
}

#[test]
fn client_reading_no_replies_holds_only_its_share() {
    let mut net = Net::new(engine("buffers", 24, TIMEOUTS));
    let deaf = ready_client(&mut net);
    let mut b = Vec::new();
    for cookie in 0..12 {
        b.extend(request_bytes(Command::Read, cookie, 0, 8192));
    }
    net.write(deaf, &b);
    // Its bytes arrive and its IOs finish, but it never takes a reply.
    for _ in 0..20 {
        net.deliver(deaf, usize::MAX);
        while !net.ios.is_empty() {
            net.complete_io(0);
        }
    }
    let cap = u64::from(net.engine.conn_cap);
    assert!(
        net.engine.buffers_in_use() <= cap + 1,
        "holds {}",
        net.engine.buffers_in_use()
    );
    let other = ready_client(&mut net);
    net.write(other, &request_bytes(Command::Read, 99, 0, 4096));
    serve(&mut net, other);
    assert_eq!(answered(&net, other, |_| 4096), vec![(0, 99)]);
}

/// A READ of many buffers streams through at most its window of them,
/// with replies queued behind it, under chunked delivery and partial sends.
#[test]
fn large_read_streams_through_its_window() {
    let mut net = Net::new(engine("auto", 24, TIMEOUTS));
    let c = ready_client(&mut net);
    let len = 40_000u32; // 10 pieces of 4 KiB; the window is 2
    let mut b = request_bytes(Command::Write, 1, 8192, len);
    b.extend((0..len).map(|i| (i % 251) as u8));
    b.extend(request_bytes(Command::Flush, 2, 0, 0));
    b.extend(request_bytes(Command::Read, 3, 8192, len));
    b.extend(request_bytes(Command::Read, 4, 8192, 100));
    net.write(c, &b);
    let cap = u64::from(net.engine.io.payload_cap());
    for _ in 0..10_000 {
        let mut moved = net.deliver(c, 3000) | net.take_sent(c, 5000);
        if !net.ios.is_empty() {
            let last = net.ios.len() - 1;
            net.complete_io(last); // out of order
            moved = true;
        }
        // Two buffers for the WRITE's pieces, two for the READ's, and the
        // small READ's one.
        assert!(net.engine.buffers_in_use() <= 2 * cap + 1);
        net.advance(1_000);
        if !moved {
            break;
        }
    }
    let lens = |cookie| match cookie {
        3 => len,
        4 => 100,
        _ => 0,
    };
    let mut got = answered(&net, c, lens);
    got.sort_by_key(|r| r.1);
    assert_eq!(got, vec![(0, 1), (0, 2), (0, 3), (0, 4)]);
    let out = &net.clients[&c].from_server;
    for (cookie, n) in [(3u64, len as usize), (4, 100)] {
        let hdr = out
            .windows(8)
            .rposition(|w| w == cookie.to_be_bytes())
            .expect("reply");
        let data = &out[hdr + 8..hdr + 8 + n];
        assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
    assert_eq!(net.engine.buffers_in_use(), 0);
    assert_eq!(net.engine.requests_in_use(), 0);
}

/// A client that hangs up mid-stream gets every buffer back, whether the
/// stream was sending or still waiting for its first piece.
#[test]
fn hang_up_mid_stream_returns_every_buffer() {
    for sent in [0, 10_000] {
        let mut net = Net::new(engine("none", 24, TIMEOUTS));
        let c = ready_client(&mut net);
        net.write(c, &request_bytes(Command::Read, 1, 0, 400_000));
        net.deliver(c, usize::MAX);
        if sent > 0 {
            while !net.ios.is_empty() {
                net.complete_io(0);
            }
            net.take_sent(c, sent);
        }
        assert!(net.engine.buffers_in_use() > 0);
        net.reset(c);
        while !net.ios.is_empty() {
            net.complete_io(0);
        }
        assert!(net.clients[&c].closed, "{:?}", net.engine.conn_state(c));
        assert_eq!(net.engine.buffers_in_use(), 0);
        assert_eq!(net.engine.requests_in_use(), 0);
        assert_eq!(net.engine.io.pacer().queued(), 0);
    }
}

/// Extended reply chunks after a handshake that ends with its `acks`-th
/// ACK: (cookie, type, flags, payload).
fn ext_chunks(bytes: &[u8], mut acks: usize) -> Vec<(u64, u16, u16, Vec<u8>)> {
    let be = |at: usize, n: usize| {
        bytes[at..at + n]
            .iter()
            .fold(0u64, |v, &b| v << 8 | u64::from(b))
    };
    let mut at = 18;
    while acks > 0 {
        if be(at + 12, 4) == 1 {
            acks -= 1;
        }
        at += 20 + be(at + 16, 4) as usize;
    }
    let mut out = Vec::new();
    while at + 32 <= bytes.len() {
        assert_eq!(be(at, 4), u64::from(proto::EXTENDED_REPLY_MAGIC), "at {at}");
        let len = be(at + 24, 8) as usize;
        let payload = bytes[at + 32..at + 32 + len].to_vec();
        out.push((
            be(at + 8, 8),
            be(at + 6, 2) as u16,
            be(at + 4, 2) as u16,
            payload,
        ));
        at += 32 + len;
    }
    out
}

#[test]
fn extended_headers_stream_and_answer_every_command_in_chunks() {
    let mut net = Net::new(engine("auto", 24, TIMEOUTS));
    let c = net.connect();
    let len = 40_000u64;
    let mut b = ext_handshake_bytes();
    b.extend(ext_request_bytes(Command::Write, 1, 4096, len));
    b.extend((0..len).map(|i| (i % 253) as u8));
    b.extend(ext_request_bytes(Command::Flush, 2, 0, 0));
    b.extend(ext_request_bytes(Command::Read, 3, 4096, len));
    // A 64-bit effect length: answered for what the device takes.
    b.extend(ext_request_bytes(Command::BlockStatus, 4, 0, 1 << 20));
    // A payload where none belongs: consumed, then EINVAL.
    let mut trim = ext_request_bytes(Command::Trim, 5, 0, 16);
    trim[5] |= proto::CMD_FLAG_PAYLOAD_LEN as u8;
    b.extend(trim);
    b.extend([0xee; 16]);
    b.extend(ext_request_bytes(Command::Read, 6, 4096, 10));
    net.write(c, &b);
    net.run_to_quiet();
    let mut got = ext_chunks(&net.clients[&c].from_server, 3);
    got.sort_by_key(|r| r.0);
    use proto::{REPLY_FLAG_DONE as DONE, REPLY_TYPE_BLOCK_STATUS_EXT as BS};
    use proto::{REPLY_TYPE_ERROR as ERR, REPLY_TYPE_NONE as NONE, REPLY_TYPE_OFFSET_DATA as DATA};
    let (streamed, got): (Vec<_>, Vec<_>) = got.into_iter().partition(|r| r.0 == 3);
    // The streamed READ: a DATA chunk per piece, in order, the last one DONE.
    assert_eq!(streamed.len(), len.div_ceil(u64::from(BUF_SIZE)) as usize);
    let mut data = Vec::new();
    for (i, r) in streamed.iter().enumerate() {
        assert_eq!(
            (r.1, r.2 == DONE),
            (DATA, i + 1 == streamed.len()),
            "chunk {i}"
        );
        let offset = u64::from_be_bytes(r.3[..8].try_into().unwrap());
        assert_eq!(offset, 4096 + data.len() as u64);
        data.extend_from_slice(&r.3[8..]);
    }
    assert_eq!(data.len(), len as usize);
    assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8));
    let kinds: Vec<(u64, u16)> = got.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(
        kinds,
        vec![(1, NONE), (2, NONE), (4, BS), (5, ERR), (6, DATA)]
    );
    assert!(got.iter().all(|r| r.2 == DONE));
    assert_eq!(&got[3].3[..4], &proto::EINVAL.to_be_bytes());
    // 64-bit extents, counted, covering the 1 MiB export.
    let status = &got[2].3;
    let n = u32::from_be_bytes(status[4..8].try_into().unwrap()) as usize;
    assert_eq!(status.len(), 8 + 16 * n);
    let covered: u64 = (0..n)
        .map(|i| u64::from_be_bytes(status[8 + 16 * i..16 + 16 * i].try_into().unwrap()))
        .sum();
    assert_eq!(covered, 1 << 20);
    assert_eq!(net.engine.buffers_in_use(), 0);
}

/// A 16 GiB null export behind a 1 ms delay bdev: long effect requests fit.
const BIG_NULL: &str = "[[bdev]]\nname = \"n0\"\nkind = \"null\"\nsize = \"16G\"\n\n\
    [[bdev]]\nname = \"slow\"\nkind = \"delay\"\nbase = \"n0\"\nwrite_avg_us = 1000\n\n\
    [[export]]\nname = \"default\"\nbdev = \"slow\"\n";

/// Serves `c`'s pending device IOs one by one, failing the `fail_at`-th
/// with `errno`, through their emulated delays: the (op, offset, len) of
/// each, in order.
fn pieces(net: &mut Net, c: ConnId, fail_at: Option<(usize, u32)>) -> Vec<(bdev::IoOp, u64, u32)> {
    let mut seen = Vec::new();
    for _ in 0..100 {
        net.deliver(c, usize::MAX);
        net.take_sent(c, usize::MAX);
        if let Some(&(_, _, req)) = net.ios.first() {
            assert_eq!(net.ios.len(), 1, "one piece at the device at a time");
            let fail = fail_at.filter(|f| f.0 == seen.len()).map(|f| f.1);
            seen.push((req.op, req.offset, req.len));
            net.complete_io_as(0, fail);
        }
        net.advance(10_000_000);
    }
    seen
}

#[test]
fn long_effect_requests_go_to_the_device_in_pieces_and_answer_once() {
    let mut net = Net::new(engine_over(BIG_NULL, "auto", 8, TIMEOUTS));
    let c = net.connect();
    let mut b = ext_handshake_bytes();
    let (offset, len) = (4096u64, 10u64 << 30);
    let flags = proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO;
    b.extend(ext_request_flagged(
        Command::WriteZeroes,
        flags,
        1,
        offset,
        len,
    ));
    net.write(c, &b);
    let got = pieces(&mut net, c, None);
    let max = proto::MAX_EFFECT_LEN;
    let zero = bdev::IoOp::WriteZeroes {
        may_trim: false,
        fua: true,
        fast: true,
    };
    let want = [
        (offset, max),
        (offset + max, max),
        (offset + 2 * max, len - 2 * max),
    ];
    let want: Vec<_> = want.iter().map(|&(o, l)| (zero, o, l as u32)).collect();
    assert_eq!(got, want, "contiguous pieces with the request's flags");
    for (cmd, cookie) in [(Command::Trim, 2), (Command::Cache, 3)] {
        net.write(c, &ext_request_flagged(cmd, 0, cookie, 0, 16 << 30));
        let got = pieces(&mut net, c, None);
        assert_eq!(got.len(), 5, "{cmd:?}: 16 GiB in 4 GiB - 4 KiB pieces");
        let covered: u64 = got.iter().map(|p| u64::from(p.2)).sum();
        assert_eq!(covered, 16 << 30);
    }
    let chunks = ext_chunks(&net.clients[&c].from_server, 3);
    let kinds: Vec<_> = chunks.iter().map(|r| (r.0, r.1, r.2)).collect();
    let done = (proto::REPLY_TYPE_NONE, proto::REPLY_FLAG_DONE);
    assert_eq!(
        kinds,
        vec![
            (1, done.0, done.1),
            (2, done.0, done.1),
            (3, done.0, done.1)
        ]
    );
    assert_eq!(net.engine.requests_in_use(), 0);
}

#[test]
fn a_failed_piece_ends_its_request_with_the_first_error() {
    let mut net = Net::new(engine_over(BIG_NULL, "none", 8, TIMEOUTS));
    let c = net.connect();
    let mut b = ext_handshake_bytes();
    b.extend(ext_request_flagged(Command::WriteZeroes, 0, 1, 0, 12 << 30));
    net.write(c, &b);
    let got = pieces(&mut net, c, Some((1, proto::ENOTSUP)));
    assert_eq!(got.len(), 2, "no piece after the failed one");
    let chunks = ext_chunks(&net.clients[&c].from_server, 3);
    assert_eq!(chunks.len(), 1, "one reply");
    assert_eq!(chunks[0].1, proto::REPLY_TYPE_ERROR);
    assert_eq!(&chunks[0].3[..4], &proto::ENOTSUP.to_be_bytes());
    // A client gone mid-request: the piece at the device finishes, no more
    // start, and the slot frees.
    let c = net.connect();
    let mut b = ext_handshake_bytes();
    b.extend(ext_request_flagged(Command::Trim, 0, 2, 0, 12 << 30));
    net.write(c, &b);
    while net.ios.is_empty() {
        net.deliver(c, usize::MAX);
        net.take_sent(c, usize::MAX);
    }
    net.reset(c);
    let got = pieces(&mut net, c, None);
    assert!(got.len() <= 1, "{got:?}");
    net.run_to_quiet();
    assert_eq!(net.engine.requests_in_use(), 0);
}

/// A 1 MiB malloc export behind a fault bdev failing its first 4 KiB.
const FAULTY: &str = "[[bdev]]\nname = \"m0\"\nkind = \"malloc\"\nsize = \"1M\"\n\n\
    [[bdev]]\nname = \"flaky\"\nkind = \"fault\"\nbase = \"m0\"\nerrno = \"ENOSPC\"\n\
    fail_range = { offset = 0, length = 4096 }\n\n\
    [[export]]\nname = \"default\"\nbdev = \"flaky\"\n";

#[test]
fn a_fault_bdev_answers_its_errno_for_whole_requests_and_pieces() {
    let mut net = Net::new(engine_over(FAULTY, "auto", 8, TIMEOUTS));
    let c = ready_client(&mut net);
    let mut bytes = request_bytes(Command::Read, 1, 0, 512);
    bytes.extend(request_bytes(Command::Read, 2, 8192, 512));
    // Three pieces of a 4 KiB buffer; the first touches the range.
    bytes.extend(request_bytes(Command::Write, 3, 0, 10_000));
    bytes.extend(vec![7u8; 10_000]);
    bytes.extend(request_bytes(Command::Write, 4, 4096, 10_000));
    bytes.extend(vec![7u8; 10_000]);
    net.write(c, &bytes);
    net.run_to_quiet();
    let got = replies(&net.clients[&c].from_server, |cookie| {
        if cookie == 2 {
            512
        } else {
            0
        }
    });
    assert_eq!(
        got,
        vec![(proto::ENOSPC, 1), (0, 2), (proto::ENOSPC, 3), (0, 4)]
    );
    assert_eq!(net.engine.buffers_in_use(), 0);
    assert_eq!(net.engine.requests_in_use(), 0);
}

#[test]
fn a_stalled_fault_bdev_holds_completions_until_released() {
    let mut net = Net::new(engine_over(FAULTY, "auto", 8, TIMEOUTS));
    let c = ready_client(&mut net);
    let fault = net
        .engine
        .io
        .catalog()
        .bdevs
        .fault("flaky")
        .expect("fault layer");
    let held = bdev::FaultParams {
        stall: true,
        ..bdev::FaultParams::default()
    };
    fault.set(held, net.now, false);
    net.write(c, &request_bytes(Command::Read, 9, 8192, 512));
    let before = net.clients[&c].from_server.len();
    for _ in 0..50 {
        net.deliver(c, usize::MAX);
        while !net.ios.is_empty() {
            net.complete_io(0);
        }
        net.advance(bdev::STALL_RECHECK_NS);
        net.take_sent(c, usize::MAX);
    }
    assert_eq!(
        net.clients[&c].from_server.len(),
        before,
        "no reply while held"
    );
    assert_eq!(net.engine.requests_in_use(), 1);
    // The trace shows where it is and how it got there.
    let traced = net.engine.trace(TraceQuery::Oldest(5), net.now);
    assert_eq!(traced.len(), 1);
    let t = &traced[0];
    assert_eq!(
        (t.cookie, t.state.as_str(), t.command.as_str()),
        (9, "Delayed", "Read")
    );
    let states: Vec<&str> = t.states.iter().map(|s| s.state.as_str()).collect();
    let path = [
        "New", "Pacing", "Released", "Ready", "Device", "Executed", "Delayed",
    ];
    assert_eq!(states, path);
    assert!(t.age_us >= 490_000.0, "{t:?}");
    assert!(
        t.states.windows(2).all(|w| w[0].at_us <= w[1].at_us),
        "{t:?}"
    );
    assert_eq!(
        net.engine.trace(TraceQuery::Conn(c.index), net.now).len(),
        1
    );
    assert!(net
        .engine
        .trace(TraceQuery::Conn(c.index + 1), net.now)
        .is_empty());
    fault.set(bdev::FaultParams::default(), net.now, false);
    net.run_to_quiet();
    assert_eq!(net.clients[&c].from_server.len(), before + 16 + 512);
    assert_eq!(fault.status(net.now).held, 1);
    assert_eq!(net.engine.buffers_in_use(), 0);
}

#[test]
fn a_piece_failing_mid_stream_ends_a_chunked_reply_with_its_error() {
    let body = FAULTY.replace("offset = 0, length = 4096", "offset = 16384, length = 1");
    let mut net = Net::new(engine_over(&body, "auto", 24, TIMEOUTS));
    let c = net.connect();
    let mut b = ext_handshake_bytes();
    // Ten 4 KiB pieces, two at a time; the fifth fails.
    b.extend(ext_request_bytes(Command::Read, 3, 0, 40_000));
    b.extend(ext_request_bytes(Command::Read, 4, 0, 10));
    net.write(c, &b);
    net.run_to_quiet();
    let got = ext_chunks(&net.clients[&c].from_server, 3);
    let kinds: Vec<(u64, u16, u16)> = got.iter().map(|r| (r.0, r.1, r.2)).collect();
    use proto::REPLY_TYPE_OFFSET_DATA as DATA;
    use proto::{REPLY_FLAG_DONE as DONE, REPLY_TYPE_ERROR_OFFSET as ERR};
    let mut want = vec![(3, DATA, 0); 4];
    want.extend([(3, ERR, DONE), (4, DATA, DONE)]);
    assert_eq!(kinds, want);
    let err = &got[4].3;
    assert_eq!(&err[..4], &proto::ENOSPC.to_be_bytes());
    assert_eq!(
        &err[6..14],
        &16384u64.to_be_bytes(),
        "the failed piece's offset"
    );
    assert!(!net.clients[&c].closed, "the connection goes on");
    assert_eq!(net.engine.buffers_in_use(), 0);
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.io.pacer().queued(), 0);
}

/// A 1 MiB RAM export keeping a dirty bitmap of 4 KiB granularity.
const DIRTY: &str = "[[bdev]]\nname = \"m0\"\nkind = \"malloc\"\nsize = \"1M\"\n\n\
    [[export]]\nname = \"default\"\nbdev = \"m0\"\ndirty_bitmaps = [\"backup\"]\n\
    dirty_granularity = \"4K\"\n";

/// A BLOCK_STATUS_EXT payload's (context id, extents).
fn ext_status(p: &[u8]) -> (u32, Vec<(u64, u64)>) {
    let be = |at: usize| u64::from_be_bytes(p[at..at + 8].try_into().expect("8 bytes"));
    let n = u32::from_be_bytes(p[4..8].try_into().expect("count")) as usize;
    assert_eq!(p.len(), 8 + 16 * n);
    let extents = (0..n).map(|i| (be(8 + 16 * i), be(16 + 16 * i))).collect();
    (u32::from_be_bytes(p[..4].try_into().expect("id")), extents)
}

#[test]
fn writes_zeroes_and_trims_mark_the_dirty_bitmap_failed_or_not() {
    let mut net = Net::new(engine_over(DIRTY, "auto", 24, TIMEOUTS));
    let c = net.connect();
    let mut b = ext_handshake_with(&["qemu:dirty-bitmap:backup", "base:allocation"]);
    b.extend(ext_request_bytes(Command::Write, 1, 8192, 100));
    b.extend([7u8; 100]);
    b.extend(ext_request_bytes(Command::WriteZeroes, 2, 65536, 8192));
    b.extend(ext_request_bytes(Command::Trim, 3, 200_000, 1));
    net.write(c, &b);
    net.run_to_quiet();
    // A WRITE the device fails is dirty all the same.
    net.write(c, &ext_request_bytes(Command::Write, 4, 1 << 19, 4096));
    net.write(c, &[1u8; 4096]);
    for _ in 0..10 {
        net.deliver(c, usize::MAX);
        if !net.ios.is_empty() {
            net.complete_io_as(0, Some(proto::EIO));
        }
    }
    net.write(c, &ext_request_bytes(Command::BlockStatus, 5, 0, 1 << 20));
    net.run_to_quiet();
    let got = ext_chunks(&net.clients[&c].from_server, 3);
    let status: Vec<_> = got.iter().filter(|r| r.0 == 5).collect();
    assert_eq!(status.len(), 2, "one chunk per context");
    assert_eq!(status[0].2, 0, "the first chunk is not the last");
    assert_eq!(status[1].2, proto::REPLY_FLAG_DONE);
    let (id, _) = ext_status(&status[0].3);
    assert_eq!(id, 1, "base:allocation");
    let (id, dirty) = ext_status(&status[1].3);
    assert_eq!(id, 2, "qemu:dirty-bitmap:backup");
    let k = 1024;
    let want = [
        (8 * k, 0),
        (4 * k, 1),
        (52 * k, 0),
        (8 * k, 1),
        (120 * k, 0),
        (4 * k, 1),
        (316 * k, 0),
        (4 * k, 1),
        (508 * k, 0),
    ];
    assert_eq!(dirty, want);
    let bitmap = net.engine.io.catalog().exports[0]
        .dirty
        .get("backup")
        .expect("kept");
    assert_eq!(bitmap.dirty_bytes(), 20 * k);
    bitmap.clear();
    net.write(c, &ext_request_bytes(Command::BlockStatus, 6, 0, 1 << 20));
    net.run_to_quiet();
    let got = ext_chunks(&net.clients[&c].from_server, 3);
    let last = got.iter().rev().find(|r| r.0 == 6).expect("answered");
    assert_eq!(ext_status(&last.3).1, [(1 << 20, 0)]);
}
