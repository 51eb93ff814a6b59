//! The session against rustls's own client, in memory: handshake, data both
//! ways in pieces of every size, a client certificate that fails (its
//! alert), and input that is not TLS.

use std::io::{Read, Write};
use std::sync::Arc;

use config::tls::{ClientCerts, TlsConfig};
use proptest::prelude::*;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::{AlertDescription, ClientConfig, ClientConnection};

use super::{Phase, TlsSession};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/tls/testdata");

pub(crate) fn server_config() -> Arc<rustls::ServerConfig> {
    let c = TlsConfig {
        cert: format!("{DIR}/server-cert.pem"),
        key: format!("{DIR}/server-key.pem"),
        ca: Some(format!("{DIR}/ca-cert.pem")),
        client_certs: Some(ClientCerts::Require),
        max_sessions: None,
    };
    crate::tls::server_config(&c).expect("server config")
}

fn pem_certs(name: &str) -> Vec<CertificateDer<'static>> {
    let pem = std::fs::read(format!("{DIR}/{name}")).expect("read pem");
    rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .expect("certs")
}

/// A client presenting `cert`, preferring AES-256 (as GnuTLS does).
pub(crate) fn client(cert: &str) -> ClientConnection {
    client_of(cert, None)
}

/// [`client`], of only `version` if given.
fn client_of(cert: &str, version: Version) -> ClientConnection {
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs("ca-cert.pem") {
        roots.add(c).expect("root");
    }
    let pem = std::fs::read(format!("{DIR}/client-key.pem")).expect("key");
    let key: PrivateKeyDer = rustls_pemfile::private_key(&mut pem.as_slice())
        .expect("key pem")
        .expect("a key");
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| !format!("{:?}", s.suite()).contains("AES_256"));
    // Sent as it is, unchecked (rustls's client refuses a v1 certificate).
    let signer = provider
        .key_provider
        .load_private_key(key)
        .expect("signing key");
    let certified = Arc::new(CertifiedKey::new(pem_certs(cert), signer));
    let builder = ClientConfig::builder_with_provider(Arc::new(provider));
    let config = match version {
        Some(v) => builder.with_protocol_versions(&[v]),
        None => builder.with_safe_default_protocol_versions(),
    };
    let config = config
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(AlwaysResolvesClientCert(certified)));
    let name = ServerName::try_from("localhost").expect("name");
    let mut c = ClientConnection::new(Arc::new(config), name).expect("client");
    c.set_buffer_limit(None);
    c
}

#[derive(Debug)]
struct AlwaysResolvesClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for AlwaysResolvesClientCert {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The client and the session, with the plaintext each has received.
struct Pair {
    c: ClientConnection,
    s: TlsSession,
    /// Plaintext the session gave out.
    at_server: Vec<u8>,
    /// Plaintext the client read.
    at_client: Vec<u8>,
}

impl Pair {
    /// Moves the client's ciphertext into the session `step` bytes at a
    /// time, and the session's output to the client.
    fn pump(&mut self, step: usize) -> Result<(), super::TlsFailure> {
        let (c, s) = (&mut self.c, &mut self.s);
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).expect("client write_tls");
        }
        for chunk in wire.chunks(step.max(1)) {
            let space = s.recv_space();
            assert!(space.len() >= chunk.len());
            space[..chunk.len()].copy_from_slice(chunk);
            let mut dst = [0u8; 1000];
            let n = s.received(chunk.len(), &mut dst)?;
            self.at_server.extend_from_slice(&dst[..n]);
        }
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = s.read(&mut buf);
            if n == 0 {
                break;
            }
            self.at_server.extend_from_slice(&buf[..n]);
        }
        let out = s.output().to_vec();
        s.sent(out.len());
        let mut rd = out.as_slice();
        while !rd.is_empty() {
            c.read_tls(&mut rd).expect("client read_tls");
            c.process_new_packets().expect("client side");
            let _ = c.reader().read_to_end(&mut self.at_client);
        }
        Ok(())
    }
}

fn handshake(cert: &str, step: usize) -> Pair {
    handshake_of(cert, None, step)
}

type Version = Option<&'static rustls::SupportedProtocolVersion>;

/// A client (of only `version`, if given) and a session, handshaken.
fn handshake_with(cert: &str, version: Version) -> Pair {
    handshake_of(cert, version, usize::MAX)
}

fn handshake_of(cert: &str, version: Version, step: usize) -> Pair {
    let mut p = Pair {
        c: client_of(cert, version),
        s: TlsSession::new(server_config()).expect("session"),
        at_server: Vec::new(),
        at_client: Vec::new(),
    };
    for _ in 0..10 {
        p.pump(step).expect("handshake");
        if p.s.phase() == Phase::Up && !p.c.is_handshaking() {
            break;
        }
    }
    assert_eq!(p.s.phase(), Phase::Up);
    assert!(p.at_server.is_empty());
    p
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn handshake_picks_aes_128_and_names_the_client_certificate() {
    let s = handshake("client-cert.pem", usize::MAX).s;
    let e = s.established().expect("established");
    let suite = e.suite.expect("suite");
    assert!(format!("{suite:?}").contains("AES_128_GCM"), "{suite:?}");
    let cert = e.peer_cert.as_ref().expect("client cert");
    let cn = crate::tls::common_name(cert);
    assert_eq!(cn.as_deref(), Some("client1"));
}

#[test]
fn data_goes_both_ways_in_records_of_any_cut() {
    for step in [1, 7, 5000, usize::MAX] {
        let mut p = handshake("client-cert.pem", step);
        let request = pattern(100_000, 3);
        p.c.writer().write_all(&request).expect("client write");
        p.pump(step).expect("requests");
        assert_eq!(p.at_server, request, "step {step}");
        // A reply header, a large READ's data, small ones gathered.
        let pieces = [
            pattern(16, 1),
            pattern(64 << 10, 2),
            pattern(16, 3),
            pattern(4096, 4),
            pattern(16, 5),
            pattern(40_000, 6),
        ];
        p.s.write(pieces.iter().map(Vec::as_slice)).expect("write");
        p.pump(step).expect("replies");
        assert_eq!(p.at_client, pieces.concat(), "step {step}");
    }
}

#[test]
fn small_pieces_share_records() {
    let mut p = handshake("client-cert.pem", usize::MAX);
    let headers: Vec<Vec<u8>> = (0..256).map(|i| pattern(16, i as u8)).collect();
    let before = p.s.queued_total();
    p.s.write(headers.iter().map(Vec::as_slice)).expect("write");
    let wire = p.s.queued_total() - before;
    // 4 KiB of plaintext: one record, not 256 (each 22 bytes of overhead).
    assert!(wire < 4096 + 100, "{wire} bytes of ciphertext");
    p.pump(usize::MAX).expect("pump");
    assert_eq!(p.at_client, headers.concat());
}

#[test]
fn a_v1_client_certificate_fails_with_its_reason_and_an_alert() {
    let mut c = client("client-v1-cert.pem");
    let mut s = TlsSession::new(server_config()).expect("session");
    let mut failure = None;
    for _ in 0..10 {
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).expect("client write_tls");
        }
        let space = s.recv_space();
        space[..wire.len()].copy_from_slice(&wire);
        if let Err(f) = s.received(wire.len(), &mut []) {
            failure = Some(f);
            break;
        }
        let out = s.output().to_vec();
        s.sent(out.len());
        c.read_tls(&mut out.as_slice()).expect("client read_tls");
        c.process_new_packets()
            .expect("client side, before the verdict");
    }
    let f = failure.expect("the server refuses the certificate");
    assert!(f.alerted, "{f:?}");
    assert!(format!("{f:?}").contains("UnsupportedCertVersion"), "{f:?}");
    assert_eq!(f.cert_alert(), Some(AlertDescription::CertificateUnknown));
    assert_eq!(s.phase(), Phase::Failed);
    // The alert reaches the client as what it is.
    let out = s.output().to_vec();
    assert!(!out.is_empty());
    c.read_tls(&mut out.as_slice()).expect("read alert");
    let e = c.process_new_packets().expect_err("alert");
    assert_eq!(
        e,
        rustls::Error::AlertReceived(AlertDescription::CertificateUnknown)
    );
}

#[test]
fn write_before_the_handshake_is_an_error() {
    let mut s = TlsSession::new(server_config()).expect("session");
    assert!(s.write([&b"early"[..]]).is_err());
    assert!(s.output().is_empty());
}

/// Data both ways, then the client's read of it all.
fn exchange(p: &mut Pair, seed: u8) {
    let (request, reply) = (pattern(50_000, seed), pattern(70_000, seed ^ 0x55));
    let (from, to) = (p.at_server.len(), p.at_client.len());
    p.c.writer().write_all(&request).expect("client write");
    p.pump(usize::MAX).expect("requests");
    assert_eq!(p.at_server[from..], request[..]);
    p.s.write([&reply[..]]).expect("write");
    p.pump(usize::MAX).expect("replies");
    assert_eq!(p.at_client[to..], reply[..]);
}

#[test]
fn a_tls13_session_seals_in_place_and_follows_key_updates_both_ways() {
    let mut p = handshake("client-cert.pem", usize::MAX);
    assert!(p.s.in_place(), "TLS 1.3 leaves rustls's records");
    exchange(&mut p, 1);
    // The client moves its key on and asks for ours: answered, then both
    // directions go on under the new keys.
    p.c.refresh_traffic_keys().expect("client key update");
    exchange(&mut p, 2);
    p.c.refresh_traffic_keys().expect("again");
    exchange(&mut p, 3);
    // Our own key moves on every 2 records: a KeyUpdate before the third.
    p.s.set_tx_limit(2);
    let before = p.s.queued_total();
    exchange(&mut p, 4);
    let wire = p.s.queued_total() - before;
    assert!(
        wire > 70_000 + 5 * 22 + 2 * 27,
        "{wire} bytes: records and key updates"
    );
    exchange(&mut p, 5);
    // close_notify both ways.
    p.c.send_close_notify();
    p.pump(usize::MAX).expect("close");
    assert_eq!(p.s.phase(), Phase::PeerClosed);
    p.s.close_notify();
    let out = p.s.output().to_vec();
    p.c.read_tls(&mut out.as_slice())
        .expect("read close_notify");
    let state = p.c.process_new_packets().expect("a clean close");
    assert!(state.peer_has_closed());
}

#[test]
fn a_close_notify_right_after_the_finished_is_an_established_close() {
    let mut p = Pair {
        c: client("client-cert.pem"),
        s: TlsSession::new(server_config()).expect("session"),
        at_server: Vec::new(),
        at_client: Vec::new(),
    };
    // ClientHello, then the client's Finished and close_notify together.
    p.pump(usize::MAX).expect("hello");
    p.c.send_close_notify();
    p.pump(usize::MAX).expect("finished and close");
    assert_eq!(p.s.phase(), Phase::PeerClosed);
    assert!(p.s.established().is_some());
}

#[test]
fn a_tls12_session_stays_with_rustls() {
    let mut p = handshake_with("client-cert.pem", Some(&rustls::version::TLS12));
    assert!(!p.s.in_place());
    let e = p.s.established().expect("established");
    assert_eq!(e.version, Some(rustls::ProtocolVersion::TLSv1_2));
    exchange(&mut p, 6);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever arrives, in whatever cuts, the session answers or fails:
    /// it never panics, and once failed it takes no more plaintext.
    #[test]
    fn arbitrary_input_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..3000),
        cut in 1usize..600,
        tls_header in any::<bool>(),
    ) {
        let mut s = TlsSession::new(server_config()).expect("session");
        let mut input = bytes;
        if tls_header && input.len() > 5 {
            // A plausible handshake record header, so the parser goes deeper.
            input[..3].copy_from_slice(&[22, 3, 1]);
        }
        for chunk in input.chunks(cut) {
            let space = s.recv_space();
            space[..chunk.len()].copy_from_slice(chunk);
            let mut dst = [0u8; 64];
            if s.received(chunk.len(), &mut dst).is_err() {
                prop_assert_eq!(s.phase(), Phase::Failed);
                break;
            }
        }
        let n = s.output().len();
        s.sent(n);
        prop_assert!(s.output().is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// After the handshake, a client's records with a byte of a record's
    /// protected body changed, cut anywhere: the session fails with an
    /// alert, having given at most the records before it; it never panics.
    /// (The header's version is ignored in TLS 1.3, and a longer length
    /// only waits for more bytes, so the header is not flipped.)
    #[test]
    fn corrupted_records_fail_cleanly(flip in any::<prop::sample::Index>(), xor in 1u8..=255, cut in 1usize..5000) {
        let mut p = handshake("client-cert.pem", usize::MAX);
        let request = pattern(20_000, 9);
        p.c.writer().write_all(&request).expect("client write");
        let mut wire = Vec::new();
        while p.c.wants_write() {
            p.c.write_tls(&mut wire).expect("client write_tls");
        }
        let body = record_bodies(&wire);
        let i = body[flip.index(body.len())];
        wire[i] ^= xor;
        let mut got = Vec::new();
        let mut failed = false;
        for chunk in wire.chunks(cut) {
            let space = p.s.recv_space();
            space[..chunk.len()].copy_from_slice(chunk);
            let mut dst = [0u8; 4096];
            match p.s.received(chunk.len(), &mut dst) {
                Ok(n) => got.extend_from_slice(&dst[..n]),
                Err(f) => {
                    prop_assert!(f.alerted, "{:?}", f);
                    failed = true;
                    break;
                }
            }
        }
        prop_assert!(failed, "a changed byte of an AEAD record is always caught");
        prop_assert!(request.starts_with(&got));
    }
}

/// The offsets of the protected bytes of each TLS record in `wire` (all
/// but the 5-byte record headers).
fn record_bodies(wire: &[u8]) -> Vec<usize> {
    let mut body = Vec::new();
    let mut at = 0;
    while at + 5 <= wire.len() {
        let len = usize::from(u16::from_be_bytes([wire[at + 3], wire[at + 4]]));
        body.extend(at + 5..(at + 5 + len).min(wire.len()));
        at += 5 + len;
    }
    body
}
