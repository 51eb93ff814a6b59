//! Per-connection state owned by one reactor.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};

use proto::{Handshake, Negotiated};

/// Receive buffer size: large enough to batch many request headers per recv
/// and to hold small write payloads without a second syscall.
pub const RECV_BUF: usize = 256 << 10;

/// Write payloads at least this large are received straight into the data
/// buffers instead of through the receive buffer (saves a copy).
pub const DIRECT_RECV_MIN: u32 = 16 << 10;

/// Most iovecs in one sendmsg.
pub const MAX_SEND_IOV: usize = 512;

pub enum Phase {
    Handshake(Box<Handshake>),
    Transmission { export: u16, neg: Negotiated },
}

/// Why a connection has stopped parsing its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    None,
    /// No free request slot on this reactor.
    Slot,
    /// A WRITE waits for data buffers before its payload may be read.
    Buffers(u32),
}

pub struct Conn {
    pub fd: OwnedFd,
    pub gen: u32,
    pub phase: Phase,
    pub rbuf: Box<[u8]>,
    pub rstart: usize,
    pub rend: usize,
    pub recv_inflight: bool,
    /// The in-flight recv writes straight into this request's buffers.
    pub recv_direct: Option<u32>,
    /// Payload bytes of a rejected WRITE still to be discarded.
    pub skip: u64,
    /// WRITE request whose payload is being received.
    pub filling: Option<u32>,
    pub block: Block,
    /// Handshake bytes waiting to be sent, and those in the current send.
    pub raw_out: Vec<u8>,
    pub raw_sending: Vec<u8>,
    /// Requests whose replies are ready, in send order. While a send is in
    /// flight it covers a prefix of this queue.
    pub out: VecDeque<u32>,
    /// Bytes of `out[0]`'s reply already sent (partial sends).
    pub out_skip: usize,
    pub send_iov: Vec<libc::iovec>,
    pub msg: Box<libc::msghdr>,
    pub send_inflight: bool,
    pub send_queued: bool,
    /// Requests of this connection not yet released.
    pub inflight: u32,
    /// No more requests will be read (EOF, DISC, handshake over, draining).
    pub input_done: bool,
    /// Shut down: everything left is released as it completes.
    pub closing: bool,
}

impl Conn {
    pub fn new(fd: OwnedFd, gen: u32, handshake: Handshake) -> Conn {
        // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
        let msg: libc::msghdr = unsafe { std::mem::zeroed() };
        Conn {
            fd,
            gen,
            phase: Phase::Handshake(Box::new(handshake)),
            rbuf: vec![0u8; RECV_BUF].into_boxed_slice(),
            rstart: 0,
            rend: 0,
            recv_inflight: false,
            recv_direct: None,
            skip: 0,
            filling: None,
            block: Block::None,
            raw_out: Vec::new(),
            raw_sending: Vec::new(),
            out: VecDeque::new(),
            out_skip: 0,
            send_iov: Vec::with_capacity(MAX_SEND_IOV),
            msg: Box::new(msg),
            send_inflight: false,
            send_queued: false,
            inflight: 0,
            input_done: false,
            closing: false,
        }
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    pub fn buffered(&self) -> usize {
        self.rend - self.rstart
    }

    /// Moves unparsed bytes to the front so the next recv has room.
    pub fn compact(&mut self) {
        if self.rstart == self.rend {
            self.rstart = 0;
            self.rend = 0;
        } else if self.rstart > RECV_BUF / 2 || self.rend == RECV_BUF {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
    }

    /// Nothing left to wait for: every request released, nothing in flight.
    pub fn idle(&self) -> bool {
        self.inflight == 0 && !self.recv_inflight && !self.send_inflight
    }
}
