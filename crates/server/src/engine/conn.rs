//! Per-connection state owned by one engine: what its input parser expects,
//! whether a recv or send is in flight, and where it is in its life.

use std::net::SocketAddr;

use config::access::{Client, Policy};
use pace::Nanos;
use proto::HandshakeStatus;

use super::conn_state::{EndReason, Header, Input, Life, Phase, RecvOp, SendOp, Step, Traffic};
use super::ids::ConnId;
use super::outbox::Outbox;
use super::slot::Req;
use super::states::PieceState;
use super::turns::Turns;
use super::{Sent, Timeouts, TlsOutcome};
use crate::exports::Catalog;

/// Receive buffer size: large enough to batch many request headers per recv
/// and to hold small write payloads without a second syscall.
pub const RECV_BUF: usize = 256 << 10;

/// Write payloads at least this large are received straight into the data
/// buffers instead of through the receive buffer (saves a copy).
pub const DIRECT_RECV_MIN: u32 = 16 << 10;

/// At most this much goes into the receive buffer per recv while an
/// NVMe/TCP WRITE's data is due (`NvmeConn::data_due`): enough for the
/// commands before it and its H2CData header, so that the rest of its data
/// is received straight into its buffers. A 256 KiB recv took most of a
/// 128 KiB PDU's data with its header: 8-12% of SPDK perf's written bytes
/// landed in buffers without it (docs/evidence.md#nvme-h2c-direct).
pub const H2C_HEAD_RECV: usize = 4 << 10;

/// One client connection: its protocol phase, input parser, receive
/// buffer, send queue, READ turns and the counts that bound its share.
pub struct Conn {
    id: ConnId,
    /// The client, as the acceptor describes it ("127.0.0.1:41234",
    /// "unix uid 1000"); empty when not told.
    peer: Box<str>,
    /// Why it ended, once it has.
    end: Option<EndReason>,
    traffic: Traffic,
    /// Unique over the engine's life: the pacer's flow id.
    flow: u64,
    phase: Phase,
    input: Input,
    recv: RecvOp,
    send: SendOp,
    life: Life,
    rbuf: Box<[u8]>,
    rstart: usize,
    rend: usize,
    /// The send side: raw bytes and replies queued in send order.
    out: Outbox,
    /// READ turns: a stream starts alone and nothing starts beside it, so
    /// no READ's data ever waits behind a stream holding buffers
    /// (`turns.rs`).
    turns: Turns,
    /// Requests of this connection holding a slot.
    requests: u32,
    /// Buffers this connection's requests hold or will take: the cap on one
    /// client's share of the pool.
    committed: u32,
    /// WRITE pieces of this connection started and not yet written.
    payload_pieces: u32,
    accepted_at: Nanos,
    /// Last time bytes arrived or a request finished.
    active_at: Nanos,
    /// Earliest time this connection's timeout entry is armed for.
    timer_at: Nanos,
}

/// What the engine's other parts read of a connection, and the counts they
/// move as its requests, pieces and bytes come and go.
impl Conn {
    readers!(
        id: ConnId, flow: u64, input: Input, recv: RecvOp, send: SendOp, life: Life,
        requests: u32, committed: u32, payload_pieces: u32;
    );

    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    pub fn phase_mut(&mut self) -> &mut Phase {
        &mut self.phase
    }

    pub fn out(&self) -> &Outbox {
        &self.out
    }

    pub fn out_mut(&mut self) -> &mut Outbox {
        &mut self.out
    }

    pub fn turns(&self) -> &Turns {
        &self.turns
    }

    pub fn turns_mut(&mut self) -> &mut Turns {
        &mut self.turns
    }

    /// A request of this connection took a slot.
    pub fn request_began(&mut self) {
        self.requests += 1;
    }

    /// A request took `need` more buffers of the connection's share.
    pub fn commit(&mut self, need: u32) {
        self.committed += need;
    }

    /// A request of this connection freed its slot and the `need` buffers
    /// it committed; the connection was active.
    pub fn request_ended(&mut self, need: u32, now: Nanos) {
        let id = self.id;
        debug_assert!(
            self.requests > 0,
            "connection {id:?} releases more than it took"
        );
        debug_assert!(
            self.committed >= need,
            "connection {id:?} uncommits too much"
        );
        self.requests -= 1;
        self.committed -= need;
        self.active_at = now;
    }

    pub fn payload_piece_started(&mut self) {
        self.payload_pieces += 1;
    }

    /// A WRITE piece no longer waits for its payload.
    pub fn payload_piece_done(&mut self) {
        let id = self.id;
        debug_assert!(
            self.payload_pieces > 0,
            "{id:?} frees a payload slot it never took"
        );
        self.payload_pieces -= 1;
    }

    /// Bytes arrived or a request finished at `now`.
    pub fn active(&mut self, now: Nanos) {
        self.active_at = now;
    }

    /// A reply left.
    pub fn replied(&mut self) {
        self.traffic.replies += 1;
    }

    /// `n` bytes arrived, by any route.
    pub fn bytes_in(&mut self, n: usize) {
        self.traffic.bytes_in += n as u64;
    }

    /// The server's drain timeout closes it: the cause it ends with,
    /// whatever was seen before.
    pub fn drain_timed_out(&mut self) {
        self.end = Some(EndReason::DrainTimeout);
    }

    /// Arms the connection's timer entry for `deadline` if it fires before
    /// the one armed; true if the caller must queue the new entry.
    pub fn arm_timer(&mut self, deadline: Nanos) -> bool {
        if deadline < self.timer_at {
            self.timer_at = deadline;
            return true;
        }
        false
    }

    /// A timer entry for `t` fired: true (and the connection unarmed) if it
    /// is the current one, false if an earlier entry superseded it.
    pub fn timer_fired(&mut self, t: Nanos) -> bool {
        if self.timer_at != t {
            return false;
        }
        self.timer_at = Nanos::MAX;
        true
    }
}

impl Conn {
    /// A new connection; an NBD handshake's greeting is its first output.
    pub fn new(id: ConnId, flow: u64, mut phase: Phase, now: Nanos) -> Conn {
        let input = match phase {
            Phase::Nvme(_) => Input::Pdus,
            _ => Input::Handshake,
        };
        let mut out = Outbox::new();
        if let Phase::Handshake(h) = &mut phase {
            out.push_raw(&h.take_output());
        }
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
            out,
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

    /// `len` bytes of the receive buffer from `at` past its unparsed start,
    /// if the buffer holds that range.
    pub fn unparsed_at(&self, at: usize, len: usize) -> Option<&[u8]> {
        let from = self.rstart + at;
        self.rbuf.get(from..from + len)
    }

    /// `n` unparsed bytes were used.
    pub fn consume(&mut self, n: usize) {
        self.rstart += n;
    }

    /// A recv put `n` bytes into the receive window.
    pub fn landed(&mut self, n: usize) {
        self.rend += n;
        debug_assert!(self.rend <= self.rbuf.len());
    }

    /// Feeds the unparsed bytes to the connection's NVMe/TCP queue and
    /// returns how many it used (None unless it speaks NVMe/TCP). The
    /// engine lets them go once it has carried out the queue's actions
    /// (their data ranges point into those bytes).
    pub fn nvme_receive(&mut self) -> Option<usize> {
        let Phase::Nvme(n) = &mut self.phase else {
            return None;
        };
        Some(n.queue_mut().receive(&self.rbuf[self.rstart..self.rend]).0)
    }

    /// Moves what the NVMe/TCP queue wrote (ICResp, R2Ts, admin
    /// completions) to the send side; true if there was any.
    pub fn nvme_output(&mut self) -> bool {
        let Phase::Nvme(n) = &mut self.phase else {
            return false;
        };
        if !n.queue().has_output() {
            return false;
        }
        self.out.push_raw(&n.queue_mut().take_output());
        true
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
                Phase::Nvme(n) if n.queue().mid_pdu() => Some(c.active_at + t.payload),
                _ if c.buffered() > 0 => Some(c.active_at + t.payload),
                _ => None,
            },
            // Only while the client's bytes could land: a piece waiting for
            // the pacer or a buffer is not the client's stall.
            Input::Payload(_) | Input::Discard(_) if c.recv != RecvOp::Idle => {
                Some(c.active_at + t.payload)
            }
            // 0: no idle limit (the default; see `idle_timeout_s`).
            Input::Headers if c.requests == 0 && t.idle > 0 => Some(c.active_at + t.idle),
            _ => None,
        }
    }

    /// The connection's next recv, if its input can take bytes: into the
    /// receive buffer, or straight into a WRITE piece's buffer, or into an
    /// NVMe/TCP WRITE's buffers when its H2CData PDU's data is arriving and
    /// nothing is buffered before it (`reqs` holds the WRITE; `cap` is the
    /// connection's share of the pool).
    pub fn next_recv(&mut self, reqs: &[Req], bs: u32, cap: u32) -> Option<(*mut u8, usize)> {
        let c = self;
        if c.life != Life::Open || c.recv != RecvOp::Idle {
            return None;
        }
        let mut most = usize::MAX;
        let direct = match (c.input, &c.phase) {
            (Input::Pdus, Phase::Nvme(n)) => {
                let target = (c.buffered() == 0)
                    .then(|| n.h2c_target(reqs, DIRECT_RECV_MIN))
                    .flatten();
                if target.is_none() && n.data_due(reqs, DIRECT_RECV_MIN) {
                    most = H2C_HEAD_RECV;
                }
                target.map(|(r, buf, len)| (buf, len, RecvOp::H2c(r)))
            }
            (Input::Handshake | Input::Discard(_) | Input::Pdus, _) => None,
            (Input::Headers, _) if c.committed < cap => None,
            (Input::Payload(r), _) => {
                let req = &reqs[r.index()];
                let k = req.filling_piece(bs) as usize;
                if req.pieces()[k].state != PieceState::Filling {
                    return None;
                }
                let direct = c.buffered() == 0 && req.len() - req.filled() >= DIRECT_RECV_MIN;
                direct
                    .then(|| req.payload_target(bs))
                    .flatten()
                    .map(|(buf, len)| (buf, len, RecvOp::Direct(r)))
            }
            (Input::Headers | Input::WaitSlot | Input::StartTls | Input::Ended, _) => return None,
        };
        let (buf, len, op) = match direct {
            Some(target) => target,
            None => {
                let (buf, len) = c.recv_window();
                (buf, len.min(most), RecvOp::Buffered)
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

/// The NBD front end (`nbd.rs`): the handshake, request headers, a
/// rejected WRITE's payload to discard, and STARTTLS.
impl Conn {
    /// Feeds the buffered bytes to the handshake; the bool is true when
    /// it wrote an answer to send.
    pub fn handshake_input(&mut self, catalog: &Catalog) -> (Step, bool) {
        let Phase::Handshake(h) = &mut self.phase else {
            self.set_input(Input::Headers);
            return (Step::Again, false);
        };
        let consumed = h.feed(&self.rbuf[self.rstart..self.rend]);
        self.rstart += consumed;
        let out = h.take_output();
        let has_output = !out.is_empty();
        self.out.push_raw(&out);
        let status = h.status().clone();
        let step = match status {
            HandshakeStatus::Negotiating => Step::Stop,
            HandshakeStatus::Done(neg) => {
                // The config holds at most MAX_EXPORTS exports.
                debug_assert!(neg.export_index < config::MAX_EXPORTS);
                let Ok(export) = u16::try_from(neg.export_index) else {
                    self.ending(EndReason::HandshakeEnded);
                    self.set_input(Input::Ended);
                    return (Step::Stop, has_output);
                };
                let meta = catalog.exports[export as usize].meta_sources(&neg.contexts);
                self.phase = Phase::Transmission { export, neg, meta };
                self.set_input(Input::Headers);
                Step::Again
            }
            // TLS starts once the answer has left; a byte the client sent
            // after STARTTLS and before TLS breaks the protocol.
            HandshakeStatus::StartTls if self.buffered() == 0 => {
                self.set_input(Input::StartTls);
                Step::Again
            }
            HandshakeStatus::Closed | HandshakeStatus::StartTls => {
                self.ending(EndReason::HandshakeEnded);
                self.set_input(Input::Ended);
                Step::Stop
            }
        };
        (step, has_output)
    }

    /// The next request header, while the connection's requests commit
    /// less than `cap` buffers.
    pub fn next_header(&mut self, cap: u32) -> Header {
        if self.committed >= cap {
            // This client holds its share of the pool: it waits for its own
            // requests (and replies) to finish, and TCP holds the rest back.
            return Header::Wait;
        }
        let extended =
            matches!(&self.phase, Phase::Transmission { neg, .. } if neg.extended_headers);
        let header_len = proto::request_header_len(extended);
        let request = match proto::decode_request(self.unparsed(), extended) {
            Ok(Some(r)) => r,
            Ok(None) => return Header::Wait,
            Err(e) => {
                self.ending(EndReason::ProtocolError);
                return Header::Bad(e);
            }
        };
        if request.command == proto::Command::Disc {
            self.rstart += header_len;
            self.ending(EndReason::Disconnect);
            return Header::Disc;
        }
        Header::Request(request, header_len)
    }

    /// Drops up to `left` bytes of a rejected WRITE's payload.
    pub fn discard_input(&mut self, left: u64) -> Step {
        let n = (self.buffered() as u64).min(left);
        if n == 0 {
            return Step::Stop;
        }
        self.rstart += n as usize;
        self.set_input(match left - n {
            0 => Input::Headers,
            rest => Input::Discard(rest),
        });
        Step::Again
    }

    /// Once the STARTTLS answer is sent (and no recv is posted), the
    /// receive side waits for the driver's TLS handshake: true when the
    /// driver should start it now.
    pub fn start_tls(&mut self) -> bool {
        let answered = self.send == SendOp::Idle && !self.out.has_raw();
        if answered && self.recv == RecvOp::Idle {
            self.set_recv(RecvOp::Tls);
            return true;
        }
        false
    }

    /// The driver's TLS handshake ended: the NBD handshake goes on inside
    /// the session, with the access rules of the client's certificate.
    pub fn tls_done(&mut self, outcome: TlsOutcome, access: &Policy) {
        let op = self.set_recv(RecvOp::Idle);
        debug_assert_eq!(
            op,
            RecvOp::Tls,
            "{:?}: a TLS handshake never started",
            self.id
        );
        if self.life == Life::Closing {
            return;
        }
        let (TlsOutcome::Up { cert_name }, Phase::Handshake(h)) = (outcome, &mut self.phase) else {
            self.ending(EndReason::TlsFailed);
            self.set_input(Input::Ended);
            return;
        };
        if !access.is_open() {
            let client = Client {
                addr: self.peer.parse::<SocketAddr>().ok().map(|a| a.ip()),
                cert_name,
                hostnqn: None,
            };
            h.set_access(access.for_client(&client, &self.peer));
        }
        h.tls_started();
        self.set_input(Input::Handshake);
    }
}
