//! Per-connection state owned by one engine: what its input parser expects,
//! whether a recv or send is in flight, and where it is in its life.

use pace::Nanos;
use proto::{Handshake, Negotiated};

use super::ids::{ConnId, ReqId};
use super::nvme_conn::NvmeConn;
use super::outbox::Outbox;
use super::slot::Req;
use super::states::PieceState;
use super::turns::Turns;
use super::{Sent, Timeouts};
use crate::exports::Catalog;

/// Receive buffer size: large enough to batch many request headers per recv
/// and to hold small write payloads without a second syscall.
pub const RECV_BUF: usize = 256 << 10;

/// Write payloads at least this large are received straight into the data
/// buffers instead of through the receive buffer (saves a copy).
pub const DIRECT_RECV_MIN: u32 = 16 << 10;

/// The connection's protocol and where it is in it.
pub enum Phase {
    /// NBD, negotiating.
    Handshake(Box<Handshake>),
    /// NBD, serving an export; `meta` are the sources of the metadata
    /// contexts it selected, with their ids.
    Transmission {
        export: u16,
        neg: Negotiated,
        meta: Vec<(u32, crate::exports::MetaSource)>,
    },
    /// NVMe/TCP, its queue in front (`engine/nvme.rs`).
    Nvme(Box<NvmeConn>),
}

/// What one pass over a connection's buffered input did next.
pub enum Step {
    /// Consumed something; look again.
    Again,
    /// Needs more bytes, or is waiting for something else.
    Stop,
}

/// What the connection's next input bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Handshake bytes.
    Handshake,
    /// STARTTLS was acknowledged: once the answer has left, the driver runs
    /// the TLS handshake (`Action::StartTls`), then handshake bytes again.
    StartTls,
    /// Request headers.
    Headers,
    /// Request headers, but no request slot is free: the connection waits in
    /// the engine's slot queue.
    WaitSlot,
    /// The payload of this WRITE.
    Payload(ReqId),
    /// This many payload bytes of a rejected WRITE, to be discarded.
    Discard(u64),
    /// NVMe/TCP PDUs, which its queue parses.
    Pdus,
    /// Nothing more: EOF, DISC, a failed handshake, or the server draining.
    Ended,
}

/// The receive side's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvOp {
    Idle,
    /// Into the receive buffer.
    Buffered,
    /// Straight into a WRITE's payload buffer.
    Direct(ReqId),
    /// The driver runs the TLS handshake; it reports with `Engine::on_tls`.
    Tls,
}

/// The send side's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Idle,
    /// In the engine's list of connections to send for.
    Ready,
    InFlight,
}

/// A connection's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Life {
    /// Serving.
    Open,
    /// Shut down: everything left is released as it completes, then the
    /// socket closes.
    Closing,
}

/// Why a connection ended, for its close log: the first cause seen stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The client closed its side (EOF).
    ClientClosed,
    /// The client sent NBD_CMD_DISC (or an NVMe/TCP H2CTermReq).
    Disconnect,
    /// The NVMe controller it served is gone (keep-alive expired, reset,
    /// shut down, or its admin queue closed).
    ControllerGone,
    /// The handshake ended without an export (aborted, refused or failed).
    HandshakeEnded,
    /// A request the protocol does not allow.
    ProtocolError,
    /// A rejected WRITE with more payload than is worth discarding.
    RejectedWrite,
    /// The handshake, idle or payload timeout.
    Timeout,
    /// A streamed READ failed at the device after its header promised the data.
    StreamFailed,
    RecvError,
    SendError,
    /// The TLS handshake failed (the driver logs why).
    TlsFailed,
    /// The server shut down and drained it.
    Draining,
    /// The server's drain timeout closed it.
    DrainTimeout,
}

/// What a connection did, for its close log.
#[derive(Debug, Clone, Copy, Default)]
pub struct Traffic {
    /// Replies sent.
    pub replies: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

pub struct Conn {
    pub id: ConnId,
    /// The client, as the acceptor describes it ("127.0.0.1:41234",
    /// "unix uid 1000"); empty when not told.
    pub peer: Box<str>,
    /// Why it ended, once it has.
    pub end: Option<EndReason>,
    pub traffic: Traffic,
    /// Unique over the engine's life: the pacer's flow id.
    pub flow: u64,
    pub phase: Phase,
    pub input: Input,
    pub recv: RecvOp,
    pub send: SendOp,
    pub life: Life,
    pub rbuf: Box<[u8]>,
    pub rstart: usize,
    pub rend: usize,
    /// The send side: raw bytes and replies queued in send order.
    pub out: Outbox,
    /// READ turns: a stream starts alone and nothing starts beside it, so
    /// no READ's data ever waits behind a stream holding buffers
    /// (`turns.rs`).
    pub turns: Turns,
    /// Requests of this connection holding a slot.
    pub requests: u32,
    /// Buffers this connection's requests hold or will take: the cap on one
    /// client's share of the pool.
    pub committed: u32,
    /// WRITE pieces of this connection started and not yet written.
    pub payload_pieces: u32,
    pub accepted_at: Nanos,
    /// Last time bytes arrived or a request finished.
    pub active_at: Nanos,
    /// Earliest time this connection's timeout entry is armed for.
    pub timer_at: Nanos,
}

impl Conn {
    pub fn new(id: ConnId, flow: u64, phase: Phase, now: Nanos) -> Conn {
        let input = match phase {
            Phase::Nvme(_) => Input::Pdus,
            _ => Input::Handshake,
        };
        Conn {
            id,
            peer: "".into(),
            end: None,
            traffic: Traffic::default(),
            flow,
            phase,
            input,
            recv: RecvOp::Idle,
            send: SendOp::Idle,
            life: Life::Open,
            rbuf: vec![0u8; RECV_BUF].into_boxed_slice(),
            rstart: 0,
            rend: 0,
            out: Outbox::new(),
            turns: Turns::default(),
            requests: 0,
            committed: 0,
            payload_pieces: 0,
            accepted_at: now,
            active_at: now,
            timer_at: Nanos::MAX,
        }
    }

    /// Moves the input parser to `to` and returns where it was: the one
    /// place its transitions are checked.
    pub fn set_input(&mut self, to: Input) -> Input {
        use Input::*;
        let from = std::mem::replace(&mut self.input, to);
        debug_assert!(
            matches!(
                (from, to),
                (_, Ended)
                    | (Handshake, Headers | StartTls)
                    | (StartTls, Handshake)
                    | (Headers, WaitSlot | Payload(_) | Discard(_))
                    | (WaitSlot | Payload(_) | Discard(_), Headers)
                    | (Discard(_), Discard(_))
            ),
            "{:?}: input {from:?} -> {to:?}",
            self.id
        );
        from
    }

    /// Moves the receive side to `to` and returns its previous operation:
    /// a recv is posted from idle, and completes back to idle.
    pub fn set_recv(&mut self, to: RecvOp) -> RecvOp {
        let from = std::mem::replace(&mut self.recv, to);
        debug_assert!(
            (from == RecvOp::Idle) != (to == RecvOp::Idle),
            "{:?}: recv {from:?} -> {to:?}",
            self.id
        );
        from
    }

    /// Moves the send side to `to`: idle, marked ready, posted, completed.
    pub fn set_send(&mut self, to: SendOp) {
        use SendOp::*;
        debug_assert!(
            matches!(
                (self.send, to),
                (Idle, Ready) | (Ready, Idle | InFlight) | (InFlight, Idle)
            ),
            "{:?}: send {:?} -> {to:?}",
            self.id,
            self.send
        );
        self.send = to;
    }

    /// The posted send finished: the send side is idle again, and the
    /// bytes it moved count.
    pub fn send_done(&mut self, result: Sent) {
        let id = self.id;
        debug_assert_eq!(
            self.send,
            SendOp::InFlight,
            "{id:?}: a send completed never posted"
        );
        self.set_send(SendOp::Idle);
        if let Sent::Bytes(n) = result {
            self.traffic.bytes_out += n as u64;
        }
    }

    /// Open to closing, once.
    pub fn set_closing(&mut self) {
        debug_assert_eq!(self.life, Life::Open, "{:?} closed twice", self.id);
        self.life = Life::Closing;
    }

    /// Closes: input ended, a send not yet posted dropped. Returns what the
    /// input was, and whether a send is still in flight.
    pub fn close(&mut self) -> (Input, bool) {
        self.set_closing();
        let input = self.set_input(Input::Ended);
        let sending = self.send == SendOp::InFlight;
        if self.send == SendOp::Ready {
            self.set_send(SendOp::Idle);
        }
        (input, sending)
    }

    /// Names the client; returns its host for the pacer when the address
    /// names it (NBD over IP: connections from one address share that
    /// host's link). An NVMe/TCP connection's host is its host NQN, known
    /// at Connect (`nvme.rs`); a Unix client is a host of its own.
    pub fn set_peer(&mut self, peer: &str) -> Option<u64> {
        self.peer = peer.into();
        if matches!(self.phase, Phase::Nvme(_)) {
            return None;
        }
        let addr = peer.parse::<std::net::SocketAddr>().ok()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&addr.ip(), &mut h);
        Some(std::hash::Hasher::finish(&h))
    }

    /// Records why the connection ends, unless a cause was already seen.
    pub fn ending(&mut self, reason: EndReason) {
        self.end.get_or_insert(reason);
    }

    pub fn buffered(&self) -> usize {
        self.rend - self.rstart
    }

    pub fn unparsed(&self) -> &[u8] {
        &self.rbuf[self.rstart..self.rend]
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

    /// Free room at the end of the receive buffer.
    pub fn recv_window(&mut self) -> (*mut u8, usize) {
        self.compact();
        let len = self.rbuf.len() - self.rend;
        // SAFETY: rend <= rbuf.len(), so the pointer stays inside the buffer.
        (unsafe { self.rbuf.as_mut_ptr().add(self.rend) }, len)
    }

    /// Nothing left in flight: the socket may close.
    pub fn quiet(&self) -> bool {
        self.requests == 0 && self.recv == RecvOp::Idle && self.send != SendOp::InFlight
    }

    /// Nothing left to say: input over, every request answered and sent.
    pub fn finished(&self) -> bool {
        self.input == Input::Ended
            && self.requests == 0
            && self.send != SendOp::InFlight
            && !self.out.has_more()
    }

    /// When the connection's current timeout fires, if one applies: the
    /// handshake's from accept, a payload's and an idle connection's from the
    /// last bytes received (or request finished).
    pub fn deadline(&self, t: &Timeouts) -> Option<Nanos> {
        let c = self;
        match c.input {
            Input::Handshake | Input::StartTls => Some(c.accepted_at + t.handshake),
            // No ICReq yet; or a PDU half received (an idle queue has no
            // timeout here: NVMe's keep-alive is the host's to ask for).
            Input::Pdus => match &c.phase {
                Phase::Nvme(n) if !n.initialized() => Some(c.accepted_at + t.handshake),
                // Part of a PDU buffered, or an H2CData's data still due.
                Phase::Nvme(n) if n.queue.mid_pdu() => Some(c.active_at + t.payload),
                _ if c.buffered() > 0 => Some(c.active_at + t.payload),
                _ => None,
            },
            // Only while the client's bytes could land: a piece waiting for
            // the pacer or a buffer is not the client's stall.
            Input::Payload(_) | Input::Discard(_) if c.recv != RecvOp::Idle => {
                Some(c.active_at + t.payload)
            }
            Input::Headers if c.requests == 0 => Some(c.active_at + t.idle),
            _ => None,
        }
    }

    /// The connection's next recv, if its input can take bytes: into the
    /// receive buffer, or straight into a WRITE piece's buffer (`reqs`
    /// holds the WRITE; `cap` is the connection's share of the pool).
    pub fn next_recv(&mut self, reqs: &[Req], bs: u32, cap: u32) -> Option<(*mut u8, usize)> {
        let c = self;
        if c.life != Life::Open || c.recv != RecvOp::Idle {
            return None;
        }
        let direct = match c.input {
            Input::Handshake | Input::Discard(_) | Input::Pdus => None,
            Input::Headers if c.committed < cap => None,
            Input::Payload(r) => {
                let req = &reqs[r.index()];
                let k = req.filling_piece(bs) as usize;
                if req.pieces[k].state != PieceState::Filling {
                    return None;
                }
                let direct = c.buffered() == 0 && req.len - req.filled >= DIRECT_RECV_MIN;
                direct
                    .then(|| req.payload_target(bs).map(|t| (r, t)))
                    .flatten()
            }
            Input::Headers | Input::WaitSlot | Input::StartTls | Input::Ended => return None,
        };
        let (buf, len, op) = match direct {
            Some((r, (buf, len))) => (buf, len, RecvOp::Direct(r)),
            None => {
                let (buf, len) = c.recv_window();
                (buf, len, RecvOp::Buffered)
            }
        };
        if len == 0 {
            return None;
        }
        c.set_recv(op);
        Some((buf, len))
    }

    /// The connection's close log: who, which export, why, and what it did.
    pub fn log_closed(&self, catalog: &Catalog, reactor: usize, now: Nanos) {
        let c = self;
        let name =
            |i: u16| (catalog.exports.get(usize::from(i))).map_or("?", |e| e.info.name.as_str());
        let (export, what) = match &c.phase {
            Phase::Transmission { export, .. } => (name(*export), "connection closed"),
            Phase::Handshake(_) => ("-", "connection closed"),
            Phase::Nvme(n) => (n.export().map_or("-", name), "nvme/tcp: connection closed"),
        };
        let peer = if c.peer.is_empty() { "-" } else { &c.peer };
        debug_assert!(c.end.is_some(), "{:?} closed with no reason recorded", c.id);
        let reason = c.end.map_or_else(|| "unknown".into(), |r| format!("{r:?}"));
        tracing::info!(
            reactor,
            conn = c.id.index,
            peer,
            export,
            reason,
            replies = c.traffic.replies,
            bytes_in = c.traffic.bytes_in,
            bytes_out = c.traffic.bytes_out,
            seconds = (now - c.accepted_at) as f64 / 1e9,
            "{what}"
        );
    }
}
