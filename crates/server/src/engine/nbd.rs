//! The NBD front end: what a connection's received bytes mean while it
//! speaks NBD. The handshake (`proto::Handshake`, with STARTTLS), request
//! headers, and a rejected WRITE's payload to discard are the connection's
//! own operations here; the engine acts on what they return (a request to
//! give a slot, a close, an answer to send). Replies are encoded by the
//! request slot (`slot.rs`).
//!
//! STARTTLS: the handshake answers it, the engine asks its driver to
//! start TLS once the answer has left, and the handshake goes on when the
//! driver reports the session up. The TLS session itself is the driver's
//! (`reactor::tls`): the engine's receives and sends are plaintext either
//! way.

use std::net::SocketAddr;

use config::access::{Client, Policy};
use proto::HandshakeStatus;

use super::conn::{Conn, EndReason, Input, Life, Phase, RecvOp, SendOp, Step};
use super::TlsOutcome;
use crate::exports::Catalog;

/// Rejected WRITE payloads up to this size are read and discarded, as the
/// spec prefers; larger ones close the connection instead.
pub(super) const MAX_DISCARD_PAYLOAD: u64 = 128 << 20;

/// What the next request header in a connection's buffer is.
pub enum Header {
    /// Not whole yet, or the connection holds its share of the pool.
    Wait,
    /// Not a request: the connection must close.
    Bad(proto::DecodeError),
    /// NBD_CMD_DISC (consumed): no reply; serve what is in flight, then close.
    Disc,
    /// A request, and its header's length (not consumed yet).
    Request(proto::Request, usize),
}

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
        self.out.raw.extend_from_slice(&out);
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

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::super::*;

    /// Client flags, then NBD_OPT_STARTTLS.
    fn starttls_bytes() -> Vec<u8> {
        let mut m = 3u32.to_be_bytes().to_vec();
        m.extend_from_slice(&0x4948_4156_454f_5054u64.to_be_bytes());
        m.extend_from_slice(&5u32.to_be_bytes());
        m.extend_from_slice(&0u32.to_be_bytes());
        m
    }

    fn tls_client(net: &mut Net) -> ConnId {
        let infos = net.engine.io.catalog.infos.clone();
        let hs = proto::Handshake::new(infos, Some(0)).with_tls(proto::Tls::Required);
        let c = net.connect_with(Some(Box::new(hs)));
        net.write(c, &starttls_bytes());
        c
    }

    #[test]
    fn tls_starts_once_the_answer_has_left_and_the_handshake_goes_on() {
        let mut net = Net::new(engine("none", 32, TIMEOUTS));
        let c = tls_client(&mut net);
        net.deliver(c, usize::MAX);
        assert!(!net.clients[&c].start_tls, "not before the answer is sent");
        while net.take_sent(c, 7) {}
        assert!(net.clients[&c].start_tls);
        assert!(net.clients[&c].recv.is_none(), "no receive during TLS");
        net.tls_done(c, TlsOutcome::Up { cert_name: None });
        // The rest of the handshake, then a request, as in plaintext.
        net.write(c, &handshake_bytes()[4..]);
        net.write(c, &request_bytes(proto::Command::Read, 9, 0, 4096));
        net.run_to_quiet();
        let out = &net.clients[&c].from_server;
        // Greeting, STARTTLS's ACK, GO's INFO and ACK, the READ's reply.
        assert!(out.len() > 18 + 20 + 4096, "{} bytes", out.len());
        assert_eq!(net.engine.buffers_in_use(), 0);
    }

    #[test]
    fn a_failed_tls_handshake_closes_and_bytes_before_it_break_the_protocol() {
        let mut net = Net::new(engine("none", 32, TIMEOUTS));
        let c = tls_client(&mut net);
        while net.deliver(c, usize::MAX) || net.take_sent(c, usize::MAX) {}
        net.tls_done(c, TlsOutcome::Failed);
        net.run_to_quiet();
        assert!(net.clients[&c].closed);
        // A client that sends past STARTTLS before TLS: closed, no TLS.
        let c = tls_client(&mut net);
        net.write(c, b"ClientHello too early");
        net.run_to_quiet();
        assert!(net.clients[&c].closed);
        assert!(!net.clients[&c].start_tls);
    }

    #[test]
    fn a_handshake_timeout_during_tls_closes_once_the_driver_reports() {
        let mut net = Net::new(engine("none", 32, TIMEOUTS));
        let c = tls_client(&mut net);
        while net.deliver(c, usize::MAX) || net.take_sent(c, usize::MAX) {}
        assert!(net.clients[&c].start_tls);
        net.advance(TIMEOUTS.handshake + 1);
        // The shutdown ended the driver's handshake (the fake reports it).
        assert!(net.clients[&c].closed);
    }
}
