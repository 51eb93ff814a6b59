//! The NBD front end: what a connection's received bytes mean while it
//! speaks NBD. The handshake (`proto::Handshake`, with STARTTLS), request
//! headers, and a rejected WRITE's payload to discard are the connection's
//! own operations (`Conn::handshake_input`, `next_header`, `discard_input`,
//! `start_tls`, `tls_done` in `conn.rs`: they move its receive buffer, input
//! and phase); the functions here act on what they return over the request
//! machine (`Requests`): a request given a slot, a close, an answer to
//! send. Replies are encoded by the request slot (`slot.rs`).
//!
//! STARTTLS: the handshake answers it, the engine asks its driver to
//! start TLS once the answer has left, and the handshake goes on when the
//! driver reports the session up. The TLS session itself is the driver's
//! (`reactor::tls`): the engine's receives and sends are plaintext either
//! way.

use super::conn_state::{EndReason, Header, Input, Phase, Step};
use super::events::Action;
use super::framing::ReplyStyle;
use super::framing::ReqOrigin;
use super::ids::{ConnId, ReqId};
use super::request::Requests;
use super::states::ReqStage;

/// Rejected WRITE payloads up to this size are read and discarded, as the
/// spec prefers; larger ones close the connection instead.
pub(super) const MAX_DISCARD_PAYLOAD: u64 = 128 << 20;

/// Asks the driver to start TLS once the STARTTLS answer is sent.
pub(super) fn start_tls(r: &mut Requests, id: ConnId) -> Step {
    let (_, conns, io) = r.parts();
    if conns.get_mut(id).is_some_and(|c| c.start_tls()) {
        io.act(Action::StartTls { conn: id });
    }
    Step::Stop
}

/// Handshake bytes: the handshake's answer goes out.
pub(super) fn handshake_input(r: &mut Requests, id: ConnId) -> Step {
    let (_, conns, io) = r.parts();
    let Some(c) = conns.get_mut(id) else {
        return Step::Stop;
    };
    let (step, answered) = c.handshake_input(io.catalog());
    if answered {
        conns.mark_send(id);
    }
    step
}

/// The next request header, given a slot while the connection's requests
/// commit less than `cap` buffers; it waits in line when none is free.
pub(super) fn header_input(r: &mut Requests, id: ConnId, cap: u32) -> Step {
    let (slots, conns, io) = r.parts();
    let Some(c) = conns.get_mut(id) else {
        return Step::Stop;
    };
    let (request, header_len) = match c.next_header(cap) {
        Header::Wait => return Step::Stop,
        Header::Bad(e) => {
            tracing::info!(
                reactor = io.reactor(),
                conn = id.index,
                "closing connection: {e:?}"
            );
            io.stats_mut().protocol_errors += 1;
            r.close(id);
            return Step::Stop;
        }
        Header::Disc => {
            r.input_ended(id);
            return Step::Stop;
        }
        Header::Request(request, header_len) => (request, header_len),
    };
    let Some(slot) = slots.claim() else {
        c.set_input(Input::WaitSlot);
        slots.wait_for_slot(id);
        return Step::Stop;
    };
    c.consume(header_len);
    accept_request(r, id, slot, request);
    Step::Again
}

/// WRITE `req`'s payload from the receive buffer into its filling piece.
pub(super) fn payload_input(r: &mut Requests, id: ConnId, req: ReqId) -> Step {
    let (slots, conns, io) = r.parts();
    let bs = io.buf_size();
    let Some(c) = conns.get_mut(id) else {
        return Step::Stop;
    };
    if c.buffered() == 0 {
        return Step::Stop;
    }
    let n = slots[req].fill_from(c.unparsed(), bs);
    if n == 0 {
        // The filling piece waits for the pacer or a buffer.
        return Step::Stop;
    }
    c.consume(n);
    r.piece_ops().payload_received(req, n);
    Step::Again
}

/// A request header arrived on `conn`, and `slot` is free for it.
fn accept_request(r: &mut Requests, conn: ConnId, slot: ReqId, request: proto::Request) {
    let (slots, conns, io) = r.parts();
    let now = io.now();
    let Some(c) = conns.get_mut(conn) else {
        return;
    };
    let Phase::Transmission { export, neg, .. } = &c.phase() else {
        return;
    };
    let origin = ReqOrigin {
        conn,
        export: *export,
        style: ReplyStyle::of(neg),
    };
    let info = &io.catalog().exports[origin.export as usize].info;
    let verdict = proto::validate(&request, info, neg);
    let payload = request.payload_len(neg.extended_headers);
    c.request_began();
    slots.begin(slot, &origin, &request, io.stats_mut(), now);
    let Err(errno) = verdict else {
        r.advance(slot);
        return;
    };
    slots[slot].set_error(errno);
    io.stats_mut().rejected += 1;
    if payload > MAX_DISCARD_PAYLOAD {
        // Discarding gigabytes of junk is not worth it: drop the client.
        if let Some(c) = conns.get_mut(conn) {
            c.ending(EndReason::RejectedWrite);
        }
        r.close(conn);
    } else if payload > 0 {
        if let Some(c) = conns.get_mut(conn) {
            c.set_input(Input::Discard(payload));
        }
    }
    r.set_state(slot, ReqStage::Answered);
    r.advance(slot);
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
        let infos = net.engine.io.catalog().infos.clone();
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
