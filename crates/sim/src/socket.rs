//! One simulated TCP connection between a host and the target, as the
//! target's engine sees it through its actions: the bytes on their way in
//! (request headers that arrive half an RTT after the host sent them, and
//! WRITE payloads that cross the links only while the engine has a recv
//! posted for them, as TCP's window holds them), and the bytes on their way
//! out (the engine's sends, split into the replies the host reads).
//!
//! A send completes as the port carries its replies: after each reply (or
//! part of a streamed one) the engine hears of the bytes carried so far (a
//! partial send) and posts the rest with whatever it queued since. A
//! reply's buffers thus return when its last byte has left the port.

use std::collections::VecDeque;

use pace::Nanos;
use server::engine::ConnId;

pub use crate::chunk::Chunk;
use crate::nvme_host::HostQueue;

/// Bytes the host sent, in stream order.
enum Inbound {
    /// Request (or handshake) bytes: they arrive at the target at `at`.
    Bytes {
        at: Nanos,
        data: Vec<u8>,
        taken: usize,
    },
    /// A WRITE's payload: `left` bytes still to cross.
    Payload { left: u32 },
    /// The host hung up (arrives at `at`).
    Eof { at: Nanos },
}

/// What the engine's posted recv can take now.
pub enum Feed {
    /// Nothing yet (no recv, bytes not arrived, or payload crossing).
    Wait,
    /// Copied this many arrived bytes into the recv's buffer.
    Copied(usize),
    /// This many payload bytes must cross the links first.
    Cross(u32),
    /// The host hung up: the recv reads end of file.
    Eof,
}

/// The reply being read from the send stream.
#[derive(Default)]
struct ReplyParser {
    header: [u8; proto::SIMPLE_REPLY_LEN],
    have: usize,
    /// Bytes of the current reply read and not yet in a chunk.
    pending: u32,
    /// The reply whose header is read: its cookie, its data bytes and
    /// those still to come.
    body: Option<(u64, u32, u64)>,
}

pub struct Sock {
    pub reactor: usize,
    pub conn: ConnId,
    pub host: usize,
    /// The handshake is over: sends carry replies over the port.
    pub negotiated: bool,
    inbound: VecDeque<Inbound>,
    /// The engine's posted recv: where and how much.
    recv: Option<(*mut u8, usize)>,
    /// Payload bytes of the posted recv crossing the links.
    crossing: Option<u32>,
    /// Stream bytes handed to the port, carried by it, and reported to the
    /// engine as sent.
    queued: u64,
    carried: u64,
    reported: u64,
    /// The engine's posted send is in flight.
    sending: bool,
    parser: ReplyParser,
    /// Chunks on the port, in order.
    in_port: VecDeque<Chunk>,
    /// What faults did to it (`iopace sim --faults`).
    pub fate: Fate,
    /// The host stopped reading: new chunks wait here, not on the port.
    pub paused: bool,
    pub held: Vec<Chunk>,
    /// An NVMe/TCP I/O queue's host side (None: NBD, or an admin queue).
    pub nvme: Option<Box<HostQueue>>,
    /// An NVMe/TCP queue in setup: what the target sent, to decode.
    pub setup_rx: Option<Vec<u8>>,
}

/// A connection's state under faults: up, or on its way down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fate {
    /// The host reset it: operations fail with ECONNRESET.
    pub reset: bool,
    /// The engine shut it down: reads end (both ways: sends fail too).
    pub shut: Option<Shut>,
    /// The engine closed it.
    pub closed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shut {
    Read,
    Both,
}

impl Fate {
    /// Sends can no longer reach the host.
    pub fn down(&self) -> bool {
        self.reset || self.closed || self.shut == Some(Shut::Both)
    }

    /// Recvs can no longer read the host's bytes.
    pub fn deaf(&self) -> bool {
        self.down() || self.shut.is_some()
    }
}

impl Sock {
    pub fn new(reactor: usize, conn: ConnId, host: usize) -> Sock {
        Sock {
            reactor,
            conn,
            host,
            negotiated: false,
            inbound: VecDeque::new(),
            recv: None,
            crossing: None,
            queued: 0,
            carried: 0,
            reported: 0,
            sending: false,
            parser: ReplyParser::default(),
            in_port: VecDeque::new(),
            fate: Fate::default(),
            paused: false,
            held: Vec::new(),
            nvme: None,
            setup_rx: None,
        }
    }

    /// Keeps the bytes of `msg` for the host's setup to decode; returns
    /// how many (the send goes at once).
    pub fn capture(&mut self, msg: *const libc::msghdr) -> usize {
        // SAFETY: the engine keeps the msghdr and its iovecs in place until
        // the send completes.
        let iovs = unsafe { std::slice::from_raw_parts((*msg).msg_iov, (*msg).msg_iovlen) };
        let rx = self.setup_rx.get_or_insert_with(Vec::new);
        for v in iovs {
            // SAFETY: each iovec covers iov_len readable bytes.
            let b = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
            rx.extend_from_slice(b);
        }
        iovs.iter().map(|v| v.iov_len).sum()
    }

    /// A send posted on a connection that is down: it waits to fail.
    pub fn hold_send(&mut self) {
        debug_assert!(!self.sending, "two sends posted on {:?}", self.conn);
        self.sending = true;
    }

    /// The host hangs up after what it sent.
    pub fn send_eof(&mut self, at: Nanos) {
        self.inbound.push_back(Inbound::Eof { at });
    }

    /// A WRITE's payload is on its way in (still to send or crossing).
    pub fn mid_payload(&self) -> bool {
        self.crossing.is_some()
            || self
                .inbound
                .iter()
                .any(|i| matches!(i, Inbound::Payload { .. }))
    }

    /// Takes back the posted recv (it fails): true if one was posted.
    pub fn cancel_recv(&mut self) -> bool {
        self.crossing = None;
        self.recv.take().is_some()
    }

    /// Takes back the posted send (it fails): true if one was posted.
    pub fn cancel_send(&mut self) -> bool {
        std::mem::take(&mut self.sending)
    }

    /// The host sent `data` (and then `payload` bytes), arriving at `at`.
    pub fn send_in(&mut self, at: Nanos, data: Vec<u8>, payload: u32) {
        self.inbound
            .push_back(Inbound::Bytes { at, data, taken: 0 });
        if payload > 0 {
            self.inbound.push_back(Inbound::Payload { left: payload });
        }
    }

    pub fn post_recv(&mut self, buf: *mut u8, len: usize) {
        debug_assert!(self.recv.is_none(), "two recvs posted on {:?}", self.conn);
        self.recv = Some((buf, len));
    }

    /// Moves arrived bytes into the posted recv, or says what it waits for.
    /// Request bytes stop at a WRITE's payload, which only `Cross` brings.
    pub fn feed(&mut self, now: Nanos) -> Feed {
        let Some((buf, len)) = self.recv else {
            return Feed::Wait;
        };
        if self.crossing.is_some() {
            return Feed::Wait;
        }
        let mut n = 0;
        while n < len {
            match self.inbound.front_mut() {
                Some(Inbound::Bytes { at, data, taken }) if *at <= now => {
                    let k = (data.len() - *taken).min(len - n);
                    // SAFETY: the engine posted `len` writable bytes at `buf`
                    // and keeps them until this recv completes; n + k <= len.
                    unsafe {
                        std::ptr::copy_nonoverlapping(data[*taken..].as_ptr(), buf.add(n), k)
                    };
                    n += k;
                    *taken += k;
                    if *taken == data.len() {
                        self.inbound.pop_front();
                    }
                }
                Some(Inbound::Eof { at }) if n == 0 && *at <= now => {
                    self.recv = None;
                    return Feed::Eof;
                }
                Some(Inbound::Payload { left }) if n == 0 => {
                    let k = (*left).min(len.min(u32::MAX as usize) as u32);
                    self.crossing = Some(k);
                    return Feed::Cross(k);
                }
                _ => break,
            }
        }
        if n == 0 {
            return Feed::Wait;
        }
        self.recv = None;
        Feed::Copied(n)
    }

    /// The crossing payload bytes are in the recv's buffer; returns how many.
    pub fn crossed(&mut self) -> usize {
        let n = self.crossing.take().unwrap_or(0);
        match self.inbound.front_mut() {
            Some(Inbound::Payload { left }) if *left >= n => {
                *left -= n;
                if *left == 0 {
                    self.inbound.pop_front();
                }
            }
            _ => debug_assert!(false, "{:?}: payload crossed that was not sent", self.conn),
        }
        debug_assert!(self.recv.is_some());
        self.recv = None;
        n as usize
    }

    /// The engine posted `msg`: its bytes not yet handed to the port go
    /// into `out` as chunks, one per reply (or part of one: a streamed
    /// READ's data follows its header over several sends). `data_len` says
    /// how many data bytes follow a reply header (cookie, error).
    pub fn post_send(
        &mut self,
        msg: *const libc::msghdr,
        data_len: impl Fn(u64, u32) -> u32,
        out: &mut Vec<Chunk>,
    ) {
        debug_assert!(!self.sending, "two sends posted on {:?}", self.conn);
        self.sending = true;
        let first = out.len();
        // SAFETY: the engine keeps the msghdr and its iovecs in place until
        // the send completes.
        let iovs = unsafe { std::slice::from_raw_parts((*msg).msg_iov, (*msg).msg_iovlen) };
        if self.nvme.is_some() {
            self.post_pdu(iovs, out);
            return;
        }
        let mut skip = (self.queued - self.reported) as usize;
        for v in iovs {
            if skip >= v.iov_len {
                skip -= v.iov_len;
                continue;
            }
            // SAFETY: each iovec covers iov_len readable bytes.
            let bytes = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
            self.parse(&bytes[skip..], &data_len, out);
            skip = 0;
        }
        // What the send holds of a reply still being read goes too.
        if let Some((cookie, _, _)) = self.parser.body {
            if self.parser.pending > 0 {
                out.push(Chunk {
                    cookie,
                    bytes: self.parser.pending,
                    last: false,
                    nvme: None,
                });
                self.parser.pending = 0;
            }
        }
        debug_assert_eq!(
            self.parser.have, 0,
            "{:?}: a send ends inside a reply header",
            self.conn
        );
        for c in &out[first..] {
            self.queued += u64::from(c.bytes);
            self.in_port.push_back(*c);
        }
    }

    /// An NVMe/TCP queue's send: only its first PDU (or the part of one it
    /// holds) goes on the port, and the send completes with it, as a short
    /// send. The engine may put other PDUs (R2Ts, completions) before the
    /// rest of what it posted, and here the stream follows its order.
    fn post_pdu(&mut self, iovs: &[libc::iovec], out: &mut Vec<Chunk>) {
        debug_assert_eq!(
            self.queued, self.reported,
            "{:?}: a PDU not yet reported",
            self.conn
        );
        let Some(q) = self.nvme.as_deref_mut() else {
            return;
        };
        let first = out.len();
        for v in iovs {
            // SAFETY: each iovec covers iov_len readable bytes.
            let bytes = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
            if let Err(e) = q.parse_one(bytes, out) {
                debug_assert!(false, "{:?}: {e}", self.conn);
            }
            if out.len() > first {
                break;
            }
        }
        if out.len() == first {
            q.flush_part(out);
        }
        debug_assert!(
            q.between_headers(),
            "{:?}: a send ends inside a PDU header",
            self.conn
        );
        for c in &out[first..] {
            self.queued += u64::from(c.bytes);
            self.in_port.push_back(*c);
        }
    }

    /// Reads replies out of `bytes`, reading only their headers.
    fn parse(
        &mut self,
        mut bytes: &[u8],
        data_len: &impl Fn(u64, u32) -> u32,
        out: &mut Vec<Chunk>,
    ) {
        let p = &mut self.parser;
        while !bytes.is_empty() {
            if let Some((_, _, left)) = &mut p.body {
                let k = (bytes.len() as u64).min(*left);
                *left -= k;
                p.pending += k as u32;
                bytes = &bytes[k as usize..];
            } else {
                let k = (p.header.len() - p.have).min(bytes.len());
                p.header[p.have..p.have + k].copy_from_slice(&bytes[..k]);
                p.have += k;
                bytes = &bytes[k..];
                if p.have < p.header.len() {
                    continue;
                }
                p.have = 0;
                p.pending += p.header.len() as u32;
                match proto::decode_simple_reply(&p.header) {
                    Ok(Some((cookie, error))) => {
                        let data = data_len(cookie, error);
                        p.body = Some((cookie, data, u64::from(data)));
                    }
                    _ => debug_assert!(false, "{:?}: not a simple reply", self.conn),
                }
            }
            if let Some((cookie, _, 0)) = p.body {
                p.body = None;
                out.push(Chunk {
                    cookie,
                    bytes: p.pending,
                    last: true,
                    nvme: None,
                });
                p.pending = 0;
            }
        }
    }

    /// The port carried this socket's oldest chunk: it is returned, with
    /// the bytes the engine's send has seen go since it was posted (None if
    /// no send waits).
    pub fn carried(&mut self) -> (Option<Chunk>, Option<usize>) {
        let Some(chunk) = self.in_port.pop_front() else {
            debug_assert!(false, "{:?}: carried a chunk never queued", self.conn);
            return (None, None);
        };
        self.carried += u64::from(chunk.bytes);
        debug_assert!(self.carried <= self.queued);
        if !self.sending {
            debug_assert!(false, "{:?}: bytes carried with no send", self.conn);
            return (Some(chunk), None);
        }
        self.sending = false;
        let n = self.carried - self.reported;
        self.reported = self.carried;
        (Some(chunk), Some(n as usize))
    }
}

/// Bytes of a posted send: a handshake send goes at once, all of it.
pub fn send_len(msg: *const libc::msghdr) -> usize {
    // SAFETY: the engine keeps the msghdr and its iovecs in place until the
    // send completes.
    let iovs = unsafe { std::slice::from_raw_parts((*msg).msg_iov, (*msg).msg_iovlen) };
    iovs.iter().map(|v| v.iov_len).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sock() -> Sock {
        Sock::new(0, ConnId { index: 0, gen: 1 }, 0)
    }

    fn chunk(cookie: u64, bytes: u32, last: bool) -> Chunk {
        Chunk {
            cookie,
            bytes,
            last,
            nvme: None,
        }
    }

    fn msg(iovs: &mut [libc::iovec]) -> libc::msghdr {
        // SAFETY: plain old data; all-zero is a valid empty header.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = iovs.as_mut_ptr();
        m.msg_iovlen = iovs.len();
        m
    }

    fn iov(b: &mut [u8]) -> libc::iovec {
        libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        }
    }

    #[test]
    fn sends_split_into_replies_and_complete_as_carried() {
        // A READ's reply (header, 8 data bytes in two iovecs), then a
        // WRITE's (header only); then a second send repeating the WRITE's
        // reply and adding a third.
        let (mut h1, mut h2, mut h3) = (Vec::new(), Vec::new(), Vec::new());
        proto::encode_simple_reply(&mut h1, 1, 0);
        proto::encode_simple_reply(&mut h2, 2, 0);
        proto::encode_simple_reply(&mut h3, 3, 0);
        let (mut d1, mut d2) = ([0u8; 3], [0u8; 5]);
        let data_len = |cookie: u64, _| if cookie == 1 { 8 } else { 0 };
        let mut s = sock();
        let mut out = Vec::new();
        let mut first = [iov(&mut h1), iov(&mut d1), iov(&mut d2), iov(&mut h2)];
        s.post_send(&msg(&mut first), data_len, &mut out);
        assert_eq!(out, vec![chunk(1, 24, true), chunk(2, 16, true)]);
        assert_eq!(s.carried(), (Some(chunk(1, 24, true)), Some(24)));
        out.clear();
        let mut second = [iov(&mut h2), iov(&mut h3)];
        s.post_send(&msg(&mut second), data_len, &mut out);
        let on_port = "the WRITE's reply is on the port already";
        assert_eq!(out, vec![chunk(3, 16, true)], "{on_port}");
        assert_eq!(s.carried(), (Some(chunk(2, 16, true)), Some(16)));
    }

    #[test]
    fn a_streamed_reply_goes_in_chunks_over_sends() {
        let mut h = Vec::new();
        proto::encode_simple_reply(&mut h, 5, 0);
        let (mut d1, mut d2) = ([0u8; 6], [0u8; 4]);
        let data_len = |_, _| 10;
        let mut s = sock();
        let mut out = Vec::new();
        let mut first = [iov(&mut h), iov(&mut d1)];
        s.post_send(&msg(&mut first), data_len, &mut out);
        assert_eq!(out, vec![chunk(5, 22, false)]);
        assert_eq!(s.carried(), (Some(chunk(5, 22, false)), Some(22)));
        out.clear();
        let mut second = [iov(&mut d2)];
        s.post_send(&msg(&mut second), data_len, &mut out);
        assert_eq!(out, vec![chunk(5, 4, true)]);
        assert_eq!(s.carried(), (Some(chunk(5, 4, true)), Some(4)));
    }

    #[test]
    fn headers_arrive_in_time_and_payloads_cross_into_a_recv() {
        let mut s = sock();
        let header = vec![7u8; proto::REQUEST_HEADER_LEN];
        s.send_in(100, header.clone(), 4096);
        s.send_in(100, header, 0);
        let mut buf = vec![0u8; 1 << 16];
        s.post_recv(buf.as_mut_ptr(), buf.len());
        assert!(matches!(s.feed(99), Feed::Wait), "not arrived yet");
        assert!(
            matches!(s.feed(100), Feed::Copied(28)),
            "stops at the payload"
        );
        assert_eq!(buf[..28], [7u8; 28]);
        s.post_recv(buf.as_mut_ptr(), 1000);
        assert!(matches!(s.feed(100), Feed::Cross(1000)));
        assert!(matches!(s.feed(100), Feed::Wait), "one crossing at a time");
        assert_eq!(s.crossed(), 1000);
        s.post_recv(buf.as_mut_ptr(), buf.len());
        assert!(matches!(s.feed(100), Feed::Cross(3096)));
        assert_eq!(s.crossed(), 3096);
        s.post_recv(buf.as_mut_ptr(), buf.len());
        assert!(matches!(s.feed(100), Feed::Copied(28)));
    }
}
