//! WRITE payloads as the target's request engine takes them
//! (`server::engine`, `write.rs`): buffer-sized pieces, each paced, given
//! one buffer, filled in stream order across the links, and written on its
//! own; at most `PAYLOAD_CAP` pieces live per connection.

use pace::pool::BufId;
use pace::Nanos;
use server::engine::PAYLOAD_CAP;

use super::{Dir, Sim, Stage, Token};

/// Bytes of an NBD simple reply header: all a WRITE's reply carries.
const REPLY_HEADER: u32 = 16;

/// A WRITE's payload: its pieces and how far each has come.
#[derive(Debug, Clone, Default)]
pub(crate) struct Payload {
    /// Each piece's buffer while it holds one, and when its device write began.
    pieces: Vec<(Option<BufId>, Nanos)>,
    /// Pieces handed to the pacer.
    started: u32,
    /// Pieces whose bytes are in (they arrive in order).
    filled: u32,
    /// Pieces written to the device.
    written: u32,
    /// The next piece's bytes are crossing the links.
    crossing: bool,
}

impl Sim<'_> {
    fn payload(&mut self, id: u32) -> &mut Payload {
        // Only a WRITE's own pieces and events reach here, after start_write.
        self.ios[id as usize]
            .write
            .as_mut()
            .expect("a WRITE has its payload from its header on")
    }

    /// Bytes of piece `k` of IO `id`.
    fn piece_len(&self, id: u32, k: u32) -> u32 {
        let bs = self.sc.target.buffer_size;
        (self.ios[id as usize].bytes - k * bs).min(bs)
    }

    /// A WRITE's header is in: its payload holds the connection's stream.
    pub(super) fn start_write(&mut self, id: u32) {
        let conn = self.ios[id as usize].conn;
        self.conns[conn].blocked = Some(id);
        let n = self.ios[id as usize]
            .bytes
            .div_ceil(self.sc.target.buffer_size);
        self.ios[id as usize].write = Some(Box::new(Payload {
            pieces: vec![(None, 0); n as usize],
            ..Payload::default()
        }));
        self.set_stage(id, Stage::Payload);
        self.start_pieces(id);
    }

    /// Hands the pacer the next pieces while the connection has room.
    fn start_pieces(&mut self, id: u32) {
        let conn = self.ios[id as usize].conn;
        loop {
            let p = self.payload(id);
            let k = p.started;
            if k as usize >= p.pieces.len() || self.conns[conn].payload_pieces >= PAYLOAD_CAP {
                return;
            }
            self.payload(id).started += 1;
            self.conns[conn].payload_pieces += 1;
            let len = self.piece_len(id, k);
            self.enqueue(Token::piece(id, k), len);
        }
    }

    /// Piece `token` has its buffer: its bytes may cross once the pieces
    /// before it are in.
    pub(super) fn piece_granted(&mut self, token: Token, bufs: Vec<BufId>) {
        debug_assert_eq!(bufs.len(), 1, "a piece takes one buffer");
        let (id, k) = (token.id(), token.piece_index().unwrap_or(0));
        self.payload(id).pieces[k as usize].0 = bufs.first().copied();
        self.fill_next(id);
    }

    /// Starts the next piece's bytes across the links, in stream order.
    fn fill_next(&mut self, id: u32) {
        let p = self.payload(id);
        let k = p.filled;
        let ready = p
            .pieces
            .get(k as usize)
            .is_some_and(|(buf, _)| buf.is_some());
        if p.crossing || !ready {
            return;
        }
        p.crossing = true;
        let len = self.piece_len(id, k);
        let host = self.ios[id as usize].host;
        let port = self.hosts[host].port;
        self.ingress[port].push(host, Token::piece(id, k).0, len);
        self.kick(Dir::Ingress, port);
    }

    /// Piece `token`'s bytes are in its buffer: it goes to the device; with
    /// the whole payload in, the connection reads on.
    pub(super) fn piece_in(&mut self, token: Token) {
        let id = token.id();
        let p = self.payload(id);
        debug_assert!(p.crossing && token.piece_index() == Some(p.filled));
        p.crossing = false;
        p.filled += 1;
        let all_in = p.filled as usize == p.pieces.len();
        self.start_device(token);
        if !all_in {
            self.fill_next(id);
            return;
        }
        let conn = self.ios[id as usize].conn;
        debug_assert_eq!(self.conns[conn].blocked, Some(id));
        self.conns[conn].blocked = None;
        while self.conns[conn].blocked.is_none() {
            let Some(next) = self.conns[conn].backlog.pop_front() else {
                break;
            };
            self.arrive(next);
        }
    }

    /// Piece `k` of `id` goes to the device now; returns its bytes.
    pub(super) fn piece_started(&mut self, id: u32, k: u32) -> u32 {
        let now = self.now;
        self.payload(id).pieces[k as usize].1 = now;
        self.piece_len(id, k)
    }

    pub(super) fn piece_start_time(&mut self, id: u32, k: u32) -> Nanos {
        self.payload(id).pieces[k as usize].1
    }

    /// Piece `token` is written: its buffer and its place under the cap
    /// free; with every piece written, the reply goes.
    pub(super) fn piece_written(&mut self, token: Token) {
        let (id, k) = (token.id(), token.piece_index().unwrap_or(0));
        let r = self.reactor_of(id);
        self.pacers[r].on_complete(token.0, self.now);
        self.schedule_poll(r, self.now);
        let buf = self.payload(id).pieces[k as usize].0.take();
        self.free_buffers(id, buf.as_slice());
        let conn = self.ios[id as usize].conn;
        debug_assert!(self.conns[conn].payload_pieces > 0);
        self.conns[conn].payload_pieces -= 1;
        let p = self.payload(id);
        p.written += 1;
        if p.written as usize == p.pieces.len() {
            self.send_reply(id, REPLY_HEADER);
        }
        // Room under the cap: this payload's next pieces, or a later one's.
        self.start_pieces(id);
        if let Some(next) = self.conns[conn].blocked.filter(|&b| b != id) {
            self.start_pieces(next);
        }
    }
}
