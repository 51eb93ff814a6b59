//! One NVMe/TCP connection of the NVMe/TCP thread: its socket, receive and
//! send buffers, and the sans-IO queue that runs its protocol.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

use pace::Nanos;
use proto::nvme::ctrl::Limits;
use proto::nvme::queue::Queue;

/// Bytes read per receive call at least.
const RECV_CHUNK: usize = 64 << 10;
/// Output waiting to be sent past which the connection stops reading.
pub(crate) const OUT_HIGH_WATER: usize = 4 << 20;

pub(crate) struct Conn {
    pub sock: TcpStream,
    pub peer: SocketAddr,
    pub queue: Queue,
    inbuf: Vec<u8>,
    inlen: usize,
    out: Vec<u8>,
    out_pos: usize,
    /// Bytes sent and queued over the connection's life.
    pub sent: u64,
    pub queued: u64,
    /// Pacer ids whose data leaves once `sent` reaches the offset.
    pub leaving: VecDeque<(u64, u64)>,
    /// Pacer ids of this connection's admitted commands, by command id.
    pub paced: HashMap<u16, u64>,
    /// Bytes of this connection's data commands admitted and not yet gone.
    pub admitted: u64,
    /// Data commands waiting for the connection's cap: (cid, bytes, write).
    pub waiting: VecDeque<(u16, u32, bool)>,
    pub flow: u64,
    /// (cntlid, qid) once its Connect succeeded.
    pub bound: Option<(u16, u16)>,
    pub accepted_at: Nanos,
    pub last_rx: Nanos,
}

/// What a receive did.
pub(crate) enum Rx {
    /// Bytes arrived (and were fed to the queue).
    Data,
    /// Nothing to read now.
    Idle,
    /// The peer closed, or the socket failed.
    Gone,
}

impl Conn {
    pub(crate) fn new(
        sock: TcpStream,
        peer: SocketAddr,
        limits: Limits,
        flow: u64,
        now: Nanos,
    ) -> Conn {
        Conn {
            sock,
            peer,
            queue: Queue::new(limits, false),
            inbuf: vec![0; RECV_CHUNK],
            inlen: 0,
            out: Vec::new(),
            out_pos: 0,
            sent: 0,
            queued: 0,
            leaving: VecDeque::new(),
            paced: HashMap::new(),
            admitted: 0,
            waiting: VecDeque::new(),
            flow,
            bound: None,
            accepted_at: now,
            last_rx: now,
        }
    }

    /// Reads what the socket has (once) and feeds whole PDUs to the queue.
    pub(crate) fn receive(&mut self, now: Nanos) -> Rx {
        if self.inbuf.len() - self.inlen < RECV_CHUNK / 4 {
            let grow = self.inbuf.len() + RECV_CHUNK;
            self.inbuf.resize(grow, 0);
        }
        match self.sock.read(&mut self.inbuf[self.inlen..]) {
            Ok(0) => Rx::Gone,
            Ok(n) => {
                self.inlen += n;
                self.last_rx = now;
                self.feed();
                Rx::Data
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Rx::Idle,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Rx::Idle,
            Err(_) => Rx::Gone,
        }
    }

    fn feed(&mut self) {
        let (used, want) = self.queue.receive(&self.inbuf[..self.inlen]);
        self.inbuf.copy_within(used..self.inlen, 0);
        self.inlen -= used;
        if want > self.inbuf.len() {
            self.inbuf.resize(want, 0);
        } else if self.inlen == 0 && self.inbuf.len() > 2 * RECV_CHUNK {
            // A large PDU passed: give its memory back.
            self.inbuf = vec![0; RECV_CHUNK];
        }
    }

    /// Part of a PDU is buffered.
    pub(crate) fn partial(&self) -> bool {
        self.inlen > 0
    }

    /// Moves the queue's output to the send buffer.
    pub(crate) fn collect_output(&mut self) {
        if self.queue.has_output() {
            let o = self.queue.take_output();
            self.queued += o.len() as u64;
            if self.out_pos == self.out.len() {
                // Nothing pending: take the queue's buffer, no copy.
                self.out = o;
                self.out_pos = 0;
            } else {
                self.out.extend_from_slice(&o);
            }
        }
    }

    pub(crate) fn pending_output(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Sends what it can; false when the socket failed.
    pub(crate) fn send(&mut self) -> bool {
        while self.out_pos < self.out.len() {
            match self.sock.write(&self.out[self.out_pos..]) {
                Ok(0) => return false,
                Ok(n) => {
                    self.out_pos += n;
                    self.sent += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
            if self.out.capacity() > OUT_HIGH_WATER {
                self.out = Vec::new();
            }
        }
        true
    }

    /// Pacer ids whose bytes have all been sent.
    pub(crate) fn left(&mut self) -> Vec<u64> {
        let mut done = Vec::new();
        while let Some(&(end, id)) = self.leaving.front() {
            if end > self.sent {
                break;
            }
            done.push(id);
            self.leaving.pop_front();
        }
        done
    }
}
