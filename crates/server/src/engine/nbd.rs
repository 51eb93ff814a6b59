//! The NBD front end: what a connection's received bytes mean while it
//! speaks NBD. The handshake (`proto::Handshake`, with STARTTLS), request
//! headers, and a rejected WRITE's payload to discard are the connection's
//! own operations (`Conn::handshake_input`, `next_header`, `discard_input`,
//! `start_tls`, `tls_done` in `conn.rs`: they move its receive buffer, input
//! and phase); the engine acts on what they return (a request to give a
//! slot, a close, an answer to send). Replies are encoded by the request
//! slot (`slot.rs`).
//!
//! STARTTLS: the handshake answers it, the engine asks its driver to
//! start TLS once the answer has left, and the handshake goes on when the
//! driver reports the session up. The TLS session itself is the driver's
//! (`reactor::tls`): the engine's receives and sends are plaintext either
//! way.

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
