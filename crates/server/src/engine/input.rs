//! Received bytes: the handshake, request headers and WRITE payloads, and
//! the recv that brings the next ones.

use super::conn::{EndReason, Input, Life, RecvOp, Step};
use super::ids::ConnId;
use super::nbd::Header;
use super::nvme::NvmeFront;
use super::states::ReqStage;
use super::{Action, Engine, Received};

impl Engine {
    pub(super) fn recv_done(&mut self, id: ConnId, result: Received) {
        let now = self.io.now;
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let op = c.set_recv(RecvOp::Idle);
        self.io.touched.push(id);
        if let Received::Data(n) = result {
            self.io.stats.bytes_in += n as u64;
            c.traffic.bytes_in += n as u64;
        }
        if c.life == Life::Closing {
            if let RecvOp::Direct(r) = op {
                // Its piece's buffer was kept for this recv; now it may go.
                self.pieces(|s, c, p| s.abort_pieces(r, c, p));
            }
            return;
        }
        match result {
            Received::Error(errno) => {
                let e = std::io::Error::from_raw_os_error(errno);
                tracing::debug!(reactor = self.id, conn = id.index, "recv: {e}");
                c.ending(EndReason::RecvError);
                self.close(id);
            }
            Received::Eof | Received::Data(0) => {
                c.ending(EndReason::ClientClosed);
                self.input_ended(id);
            }
            Received::Data(n) => {
                c.active_at = now;
                match op {
                    RecvOp::Direct(r) => {
                        self.slots.reqs[r.index()].filled += n as u32;
                        (self.slots).payload_received(r, n, &mut self.conns, &mut self.io);
                    }
                    _ => {
                        c.rend += n;
                        debug_assert!(c.rend <= c.rbuf.len());
                    }
                }
            }
        }
    }

    /// No more input from this connection: serve what is in flight, then close.
    pub(super) fn input_ended(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let was = c.set_input(Input::Ended);
        match was {
            // A WRITE whose payload will never arrive: nothing to execute.
            Input::Payload(r) => self.pieces(|s, c, p| s.abort_pieces(r, c, p)),
            Input::WaitSlot => self.slots.waiters.retain(|&w| w != id),
            // NVMe WRITEs waiting for their data never get it.
            Input::Pdus => {
                for r in NvmeFront::requests_of(id, &mut self.conns) {
                    if self.slots.reqs[r.index()].state == ReqStage::Receiving {
                        self.abort(r);
                    }
                }
            }
            _ => {}
        }
        self.io.touched.push(id);
    }

    /// Consumes buffered input as far as it goes.
    pub(super) fn process_input(&mut self, id: ConnId) {
        loop {
            let Some(c) = self.conns.get(id) else { return };
            if c.life != Life::Open {
                return;
            }
            let step = match c.input {
                Input::Handshake => self.handshake_input(id),
                Input::StartTls => self.start_tls(id),
                Input::Headers => self.header_input(id),
                Input::Payload(r) => self.payload_input(id, r),
                Input::Discard(left) => self
                    .conns
                    .get_mut(id)
                    .map_or(Step::Stop, |c| c.discard_input(left)),
                Input::Pdus => self.nvme_input(id),
                Input::WaitSlot | Input::Ended => Step::Stop,
            };
            if let Step::Stop = step {
                break;
            }
        }
        if let Some(c) = self.conns.get_mut(id) {
            c.compact();
        }
    }

    /// Asks the driver to start TLS once the STARTTLS answer is sent.
    fn start_tls(&mut self, id: ConnId) -> Step {
        if self.conns.get_mut(id).is_some_and(|c| c.start_tls()) {
            self.io.actions.push(Action::StartTls { conn: id });
        }
        Step::Stop
    }

    fn handshake_input(&mut self, id: ConnId) -> Step {
        let Some(c) = self.conns.get_mut(id) else {
            return Step::Stop;
        };
        let (step, answered) = c.handshake_input(&self.io.catalog);
        if answered {
            self.conns.mark_send(id);
        }
        step
    }

    fn header_input(&mut self, id: ConnId) -> Step {
        let Some(c) = self.conns.get_mut(id) else {
            return Step::Stop;
        };
        let (request, header_len) = match c.next_header(self.conn_cap) {
            Header::Wait => return Step::Stop,
            Header::Bad(e) => {
                tracing::info!(
                    reactor = self.id,
                    conn = id.index,
                    "closing connection: {e:?}"
                );
                self.io.stats.protocol_errors += 1;
                self.close(id);
                return Step::Stop;
            }
            Header::Disc => {
                self.input_ended(id);
                return Step::Stop;
            }
            Header::Request(request, header_len) => (request, header_len),
        };
        let Some(slot) = self.slots.free.pop() else {
            c.set_input(Input::WaitSlot);
            self.slots.waiters.push_back(id);
            return Step::Stop;
        };
        c.rstart += header_len;
        self.accept_request(id, slot, request);
        Step::Again
    }

    fn payload_input(&mut self, id: ConnId, r: super::ReqId) -> Step {
        let bs = self.io.buf_size;
        let Some(c) = self.conns.get_mut(id) else {
            return Step::Stop;
        };
        if c.buffered() == 0 {
            return Step::Stop;
        }
        let n = self.slots.reqs[r.index()].fill_from(&c.rbuf[c.rstart..c.rend], bs);
        if n == 0 {
            // The filling piece waits for the pacer or a buffer.
            return Step::Stop;
        }
        c.rstart += n;
        (self.slots).payload_received(r, n, &mut self.conns, &mut self.io);
        Step::Again
    }

    /// Posts the connection's next recv if its input can take bytes: into
    /// the receive buffer, or straight into a WRITE piece's buffer.
    pub(super) fn post_recv(&mut self, id: ConnId) {
        let (bs, cap) = (self.io.buf_size, self.conn_cap);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if let Some((buf, len)) = c.next_recv(&self.slots.reqs, bs, cap) {
            self.io.actions.push(Action::Recv { conn: id, buf, len });
        }
    }
}
