//! STARTTLS: the engine answers it in the handshake (`input.rs`), asks its
//! driver to start TLS once the answer has left, and goes on with the
//! handshake when the driver reports the session up. The TLS session itself
//! is the driver's (`reactor::tls`): the engine's receives and sends are
//! plaintext either way.

use std::net::SocketAddr;

use config::access::{Client, Policy};

use super::conn::{Conn, EndReason, Input, Life, Phase, RecvOp, SendOp};
use super::TlsOutcome;

impl Conn {
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
