//! One TLS server session without IO: ciphertext in, plaintext out, and the
//! other way round, in buffers of its own, over rustls's unbuffered
//! connection API. It knows no socket and no protocol above it: the reactor
//! moves its ciphertext (`reactor::tls`), and NBD (or, later, NVMe/TCP with
//! its PSK configuration) reads and writes its plaintext.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::server::ServerConnectionData;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, InsufficientSizeError, WriteTraffic,
};
use rustls::{AlertDescription, CipherSuite, ProtocolVersion, ServerConfig};

use super::records::{self, Fatal, Opened, Records};

/// Largest plaintext of one TLS record.
pub const RECORD: usize = 16 << 10;

/// Pieces up to this size are gathered into shared records (a 16-byte NBD
/// reply header, a 4 KiB READ's data); larger ones are encrypted where they
/// lie, record by record, as copying them costs more than a record's
/// overhead.
const GATHER_MAX: usize = 4 << 10;

/// Room a receive gets at least: one whole record with its overhead.
const RECV_MIN: usize = RECORD + 512;

/// Ciphertext one receive may bring, when the buffer is empty.
pub const RECV_SIZE: usize = 256 << 10;

/// Where the session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The TLS handshake is under way.
    Handshaking,
    /// Application data flows both ways.
    Up,
    /// The peer sent close_notify: no more plaintext comes.
    PeerClosed,
    /// A fatal error: only the alert (in the output) is left to send.
    Failed,
}

/// Why the session failed: rustls's error, and the alert the peer gets.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFailure {
    pub error: rustls::Error,
    /// Whether an alert was queued for the peer.
    pub alerted: bool,
}

impl TlsFailure {
    /// The alert a certificate that failed verification earns, as rustls
    /// chooses it (RFC 8446's: `unknown_ca`, `certificate_expired`,
    /// `certificate_unknown` for other faults such as a v1 certificate).
    pub fn cert_alert(&self) -> Option<rustls::AlertDescription> {
        match &self.error {
            rustls::Error::InvalidCertificate(e) if self.alerted => Some(e.clone().into()),
            _ => None,
        }
    }
}

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error)
    }
}

/// A byte range of a fully initialized buffer: `buf[start..end]` is live.
#[derive(Debug, Default)]
struct Window {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Window {
    fn len(&self) -> usize {
        self.end - self.start
    }

    fn live(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        assert!(n <= self.len(), "consumed {n} of {} bytes", self.len());
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// At least `min` bytes of room after the live bytes: the live bytes
    /// move to the front when that makes the room (and they are fewer than
    /// the bytes freed before them), else the buffer doubles (at least to
    /// `want`). It is never shrunk, so it is zeroed only as it grows.
    fn room(&mut self, min: usize, want: usize) -> &mut [u8] {
        if self.buf.len() - self.end < min {
            let live = self.len();
            if self.start > 0 && self.buf.len() - live >= min && live <= self.start {
                self.buf.copy_within(self.start..self.end, 0);
                self.start = 0;
                self.end = live;
            } else {
                let len = (self.buf.len() * 2).max(self.end + min).max(want);
                self.buf.resize(len, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    fn extend(&mut self, bytes: &[u8]) {
        self.room(bytes.len(), 0)[..bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }
}

/// What the handshake agreed, kept past it (the record layer has no
/// rustls connection to ask).
#[derive(Debug, Clone)]
pub struct Established {
    pub version: Option<ProtocolVersion>,
    pub suite: Option<CipherSuite>,
    /// The client's certificate, if it gave one.
    pub peer_cert: Option<CertificateDer<'static>>,
}

/// Who does the records: rustls through the handshake (and for a whole
/// TLS 1.2 session), then, for TLS 1.3, [`Records`] in place.
enum Layer {
    Rustls(Box<UnbufferedServerConnection>),
    Records(Box<Records>),
    /// Only while one becomes the other, or after that failed.
    Gone,
}

/// A TLS server session's state and buffers.
pub struct TlsSession {
    layer: Layer,
    established: Option<Established>,
    phase: Phase,
    /// Ciphertext received, not yet processed.
    incoming: Window,
    /// Plaintext decrypted that no read has taken yet.
    plain: Window,
    /// Ciphertext to send, in order.
    outgoing: Window,
    /// Ciphertext queued and sent since the start, for [`Self::queued_total`].
    queued_total: u64,
    /// Small plaintext pieces waiting to share a record.
    gather: Vec<u8>,
}

impl TlsSession {
    pub fn new(config: Arc<ServerConfig>) -> Result<TlsSession, rustls::Error> {
        Ok(TlsSession {
            layer: Layer::Rustls(Box::new(UnbufferedServerConnection::new(config)?)),
            established: None,
            phase: Phase::Handshaking,
            incoming: Window::default(),
            plain: Window::default(),
            outgoing: Window::default(),
            queued_total: 0,
            gather: Vec::with_capacity(RECORD),
        })
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the records are sealed and opened in place (TLS 1.3, once
    /// the handshake is done), not by rustls.
    pub fn in_place(&self) -> bool {
        matches!(self.layer, Layer::Records(_))
    }

    /// Records sealed under one send key before a KeyUpdate (tests).
    #[cfg(test)]
    pub fn set_tx_limit(&mut self, records: u64) {
        if let Layer::Records(r) = &mut self.layer {
            r.set_tx_limit(records);
        }
    }

    /// What the handshake agreed, once it is done (in phases `Up` and
    /// `PeerClosed`): for logs and access rules.
    pub fn established(&self) -> Option<&Established> {
        self.established.as_ref()
    }

    /// Room to receive ciphertext into; report what came with [`Self::received`].
    pub fn recv_space(&mut self) -> &mut [u8] {
        let space = self.incoming.room(RECV_MIN, RECV_SIZE);
        let n = space.len().min(RECV_SIZE);
        &mut space[..n]
    }

    /// `n` bytes of ciphertext arrived in [`Self::recv_space`]. Every whole
    /// record is processed at once: plaintext into `dst` as far as it
    /// holds, the rest kept for [`Self::read`]; handshake answers and
    /// alerts into the output. Returns the bytes put into `dst`.
    pub fn received(&mut self, n: usize, dst: &mut [u8]) -> Result<usize, TlsFailure> {
        assert!(
            self.incoming.end + n <= self.incoming.buf.len(),
            "received {n} bytes past the receive space"
        );
        self.incoming.end += n;
        let filled = self.read(dst);
        if self.phase == Phase::Failed {
            return Ok(filled);
        }
        self.process(&mut dst[filled..]).map(|n| filled + n)
    }

    /// Whether plaintext is waiting for a read.
    pub fn readable(&self) -> bool {
        self.plain.len() > 0
    }

    /// Takes decrypted plaintext (records are decrypted as they arrive).
    pub fn read(&mut self, dst: &mut [u8]) -> usize {
        let n = self.plain.len().min(dst.len());
        dst[..n].copy_from_slice(&self.plain.live()[..n]);
        self.plain.consume(n);
        n
    }

    /// Processes every whole record received: plaintext into `dst`, then
    /// into `plain`. A TLS 1.3 session leaves rustls for [`Records`] as
    /// soon as its handshake is done.
    fn process(&mut self, dst: &mut [u8]) -> Result<usize, TlsFailure> {
        let mut filled = 0;
        if matches!(self.layer, Layer::Rustls(_)) {
            filled = self.process_rustls(dst)?;
            // PeerClosed too: a close_notify may come with the Finished.
            let done = matches!(self.phase, Phase::Up | Phase::PeerClosed);
            if done && self.established.is_none() {
                self.establish()?;
            }
        }
        if matches!(self.layer, Layer::Records(_)) && self.phase == Phase::Up {
            filled += self.process_records(&mut dst[filled..])?;
        }
        Ok(filled)
    }

    /// The handshake is done: keep what it agreed, and move a TLS 1.3
    /// session to [`Records`] (its secrets extracted from rustls).
    fn establish(&mut self) -> Result<(), TlsFailure> {
        let c = rustls(&mut self.layer);
        self.established = Some(Established {
            version: c.protocol_version(),
            suite: c.negotiated_cipher_suite().map(|s| s.suite()),
            peer_cert: c.peer_certificates().and_then(|p| p.first()).cloned(),
        });
        let tls13 = self.established.as_ref().and_then(|e| e.version);
        if tls13 != Some(ProtocolVersion::TLSv1_3) || self.phase != Phase::Up {
            return Ok(());
        }
        let Layer::Rustls(c) = std::mem::replace(&mut self.layer, Layer::Gone) else {
            unreachable!("checked above");
        };
        let records = c
            .dangerous_into_kernel_connection()
            .and_then(|(secrets, kernel)| Records::new(secrets, kernel));
        match records {
            Ok(r) => {
                self.layer = Layer::Records(Box::new(r));
                Ok(())
            }
            Err(error) => {
                self.phase = Phase::Failed;
                Err(TlsFailure {
                    error,
                    alerted: false,
                })
            }
        }
    }

    /// Opens every whole record received, in place: application data into
    /// `dst`, then into `plain`; a KeyUpdate applied (and answered when
    /// asked); close_notify ends the input.
    fn process_records(&mut self, dst: &mut [u8]) -> Result<usize, TlsFailure> {
        let Layer::Records(r) = &mut self.layer else {
            unreachable!("records only once they have the session");
        };
        let mut filled = 0;
        loop {
            let live = &mut self.incoming.buf[self.incoming.start..self.incoming.end];
            let len = match Records::record_len(live) {
                Ok(Some(len)) => len,
                Ok(None) => return Ok(filled),
                Err(f) => return Err(self.fail_records(f)),
            };
            match r.open(&mut live[..len]) {
                Ok(Opened::Data(range)) => {
                    let payload = &live[range];
                    let n = payload.len().min(dst.len() - filled);
                    dst[filled..filled + n].copy_from_slice(&payload[..n]);
                    filled += n;
                    self.plain.extend(&payload[n..]);
                }
                Ok(Opened::KeyUpdated { requested }) => {
                    if requested {
                        let out = self.outgoing.room(5 + records::OVERHEAD, 0);
                        match r.seal_key_update(out, false) {
                            Ok(n) => {
                                self.outgoing.end += n;
                                self.queued_total += n as u64;
                            }
                            Err(error) => return Err(self.fail_records(internal(error))),
                        }
                    }
                }
                Ok(Opened::Closed) => {
                    self.phase = Phase::PeerClosed;
                    self.incoming.consume(len);
                    return Ok(filled);
                }
                Err(f) => return Err(self.fail_records(f)),
            }
            self.incoming.consume(len);
        }
    }

    /// `n` bytes were written at the output's end.
    fn queued(&mut self, n: usize) {
        self.outgoing.end += n;
        self.queued_total += n as u64;
    }

    /// The record layer met a fatal condition: its alert goes out, sealed.
    fn fail_records(&mut self, f: Fatal) -> TlsFailure {
        self.phase = Phase::Failed;
        let mut alerted = false;
        if let (Some(alert), Layer::Records(r)) = (f.alert, &mut self.layer) {
            let out = self.outgoing.room(2 + records::OVERHEAD, 0);
            let n = r.seal_alert(out, alert);
            self.queued(n);
            alerted = true;
        }
        TlsFailure {
            error: f.error,
            alerted,
        }
    }

    /// Processes every whole record received with rustls: plaintext into
    /// `dst`, then into `plain`; until it needs more input or may encrypt.
    fn process_rustls(&mut self, dst: &mut [u8]) -> Result<usize, TlsFailure> {
        let mut filled = 0;
        loop {
            let (i, end) = (self.incoming.start, self.incoming.end);
            let Layer::Rustls(conn) = &mut self.layer else {
                unreachable!("rustls's records only while rustls has the session");
            };
            let status = conn.process_tls_records(&mut self.incoming.buf[i..end]);
            let mut discard = status.discard;
            let mut failed = None;
            let more = match status.state {
                Err(error) => {
                    failed = Some(error);
                    false
                }
                Ok(ConnectionState::ReadTraffic(mut traffic)) => {
                    while let Some(record) = traffic.next_record() {
                        match record {
                            Ok(r) => {
                                discard += r.discard;
                                let n = r.payload.len().min(dst.len() - filled);
                                dst[filled..filled + n].copy_from_slice(&r.payload[..n]);
                                filled += n;
                                self.plain.extend(&r.payload[n..]);
                            }
                            Err(error) => {
                                failed = Some(error);
                                break;
                            }
                        }
                    }
                    failed.is_none()
                }
                Ok(ConnectionState::EncodeTlsData(mut data)) => {
                    encode(&mut self.outgoing, &mut self.queued_total, |out| {
                        data.encode(out).map_err(|e| match e {
                            EncodeError::InsufficientSize(s) => Some(s),
                            EncodeError::AlreadyEncoded => None,
                        })
                    });
                    true
                }
                // What is encoded goes out in order with what follows it.
                Ok(ConnectionState::TransmitTlsData(data)) => {
                    data.done();
                    true
                }
                Ok(ConnectionState::PeerClosed) => {
                    self.phase = Phase::PeerClosed;
                    true
                }
                Ok(ConnectionState::WriteTraffic(_)) => {
                    if self.phase == Phase::Handshaking {
                        self.phase = Phase::Up;
                    }
                    false
                }
                // BlockedHandshake and Closed wait for more input (early
                // data is not enabled).
                Ok(_) => false,
            };
            self.incoming.consume(discard);
            if let Some(error) = failed {
                return Err(self.fail(error));
            }
            if !more {
                return Ok(filled);
            }
        }
    }

    /// The session failed: queue the alert rustls prepared for the peer.
    /// It is the next data to encode, ahead of any input: one call gets it
    /// without deframing more (which could fail again and alert twice).
    /// Without an alert, that call meets the failed state and ends.
    fn fail(&mut self, error: rustls::Error) -> TlsFailure {
        self.phase = Phase::Failed;
        let before = self.queued_total;
        let (i, end) = (self.incoming.start, self.incoming.end);
        let Layer::Rustls(conn) = &mut self.layer else {
            unreachable!("rustls fails only while it has the session");
        };
        let status = conn.process_tls_records(&mut self.incoming.buf[i..end]);
        if let Ok(ConnectionState::EncodeTlsData(mut data)) = status.state {
            encode(&mut self.outgoing, &mut self.queued_total, |out| {
                data.encode(out).map_err(|e| match e {
                    EncodeError::InsufficientSize(s) => Some(s),
                    EncodeError::AlreadyEncoded => None,
                })
            })
        }
        TlsFailure {
            error,
            alerted: self.queued_total > before,
        }
    }

    /// Encrypts `pieces` in order into the output, small ones gathered into
    /// shared records.
    pub fn write<'a>(
        &mut self,
        pieces: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<(), TlsFailure> {
        if !matches!(self.phase, Phase::Up | Phase::PeerClosed) {
            return Err(not_up("write"));
        }
        if matches!(self.layer, Layer::Records(_)) {
            return self
                .write_records(pieces)
                .map_err(|e| self.fail_records(internal(e)));
        }
        // Brings rustls to where it may encrypt: anything it has to say
        // first (a key update's answer) is encoded ahead of the data.
        let none = self.process(&mut [])?;
        debug_assert_eq!(none, 0, "no plaintext into an empty buffer");
        let (i, end) = (self.incoming.start, self.incoming.end);
        let status = rustls(&mut self.layer).process_tls_records(&mut self.incoming.buf[i..end]);
        debug_assert_eq!(status.discard, 0, "all records were processed");
        let mut traffic = match status.state {
            Ok(ConnectionState::WriteTraffic(t)) => t,
            Ok(other) => return Err(not_up(&format!("write in state {other:?}"))),
            Err(error) => return Err(self.fail(error)),
        };
        let (out, total, gather) = (&mut self.outgoing, &mut self.queued_total, &mut self.gather);
        let mut ok = true;
        for piece in pieces {
            if piece.len() <= GATHER_MAX {
                if gather.len() + piece.len() > RECORD {
                    ok &= seal(&mut traffic, out, total, gather);
                    gather.clear();
                }
                gather.extend_from_slice(piece);
                continue;
            }
            if !gather.is_empty() {
                ok &= seal(&mut traffic, out, total, gather);
                gather.clear();
            }
            ok &= seal(&mut traffic, out, total, piece);
        }
        if !gather.is_empty() {
            ok &= seal(&mut traffic, out, total, gather);
            gather.clear();
        }
        if !ok {
            return Err(self.fail(rustls::Error::EncryptError));
        }
        Ok(())
    }

    /// Encrypts `pieces` in order into the output with [`Records`]: each
    /// byte is copied once, into the record open at the output's end, and
    /// each full record sealed where it lies.
    fn write_records<'a>(
        &mut self,
        pieces: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<(), rustls::Error> {
        let Layer::Records(r) = &mut self.layer else {
            unreachable!("records only once they have the session");
        };
        let full = records::MAX_PLAIN + records::OVERHEAD;
        let mut open = 0;
        for piece in pieces {
            let mut rest = piece;
            while !rest.is_empty() {
                if open == 0 {
                    if r.tx_exhausted() {
                        let out = self.outgoing.room(5 + records::OVERHEAD, 0);
                        let n = r.seal_key_update(out, false)?;
                        self.outgoing.end += n;
                        self.queued_total += n as u64;
                    }
                    // Room for a whole record, reserved before any byte of
                    // it: the room is not asked for again while it is open.
                    self.outgoing.room(full, 0);
                }
                let n = rest.len().min(records::MAX_PLAIN - open);
                let at = self.outgoing.end + records::HEADER + open;
                self.outgoing.buf[at..at + n].copy_from_slice(&rest[..n]);
                (open, rest) = (open + n, &rest[n..]);
                if open == records::MAX_PLAIN {
                    let out = &mut self.outgoing.buf[self.outgoing.end..];
                    let n = r.seal_placed(out, open, records::APPLICATION_DATA);
                    self.outgoing.end += n;
                    self.queued_total += n as u64;
                    open = 0;
                }
            }
        }
        if open > 0 {
            let out = &mut self.outgoing.buf[self.outgoing.end..];
            let n = r.seal_placed(out, open, records::APPLICATION_DATA);
            self.outgoing.end += n;
            self.queued_total += n as u64;
        }
        Ok(())
    }

    /// Queues close_notify, when the session is up.
    pub fn close_notify(&mut self) {
        if !matches!(self.phase, Phase::Up | Phase::PeerClosed) || self.process(&mut []).is_err() {
            return;
        }
        if let Layer::Records(r) = &mut self.layer {
            let out = self.outgoing.room(2 + records::OVERHEAD, 0);
            let n = r.seal_alert(out, AlertDescription::CloseNotify);
            self.queued(n);
            return;
        }
        let (i, end) = (self.incoming.start, self.incoming.end);
        let status = rustls(&mut self.layer).process_tls_records(&mut self.incoming.buf[i..end]);
        if let Ok(ConnectionState::WriteTraffic(mut t)) = status.state {
            encode(&mut self.outgoing, &mut self.queued_total, |out| {
                t.queue_close_notify(out).map_err(|e| match e {
                    EncryptError::InsufficientSize(s) => Some(s),
                    EncryptError::EncryptExhausted => None,
                })
            });
        }
    }

    /// Ciphertext waiting to be sent.
    pub fn output(&self) -> &[u8] {
        self.outgoing.live()
    }

    /// `n` bytes of [`Self::output`] were sent.
    pub fn sent(&mut self, n: usize) {
        self.outgoing.consume(n);
    }

    /// Ciphertext bytes queued for the peer since the session began: the
    /// output's end, counted from the first byte.
    pub fn queued_total(&self) -> u64 {
        self.queued_total
    }
}

/// An error of rustls's key schedule, inside the record layer.
fn internal(error: rustls::Error) -> Fatal {
    Fatal {
        error,
        alert: Some(AlertDescription::InternalError),
    }
}

/// The rustls connection, while it has the session.
fn rustls(layer: &mut Layer) -> &mut UnbufferedServerConnection {
    match layer {
        Layer::Rustls(c) => c,
        _ => unreachable!("rustls's records only while rustls has the session"),
    }
}

fn not_up(what: &str) -> TlsFailure {
    TlsFailure {
        error: rustls::Error::General(format!("{what}: the TLS session is not up")),
        alerted: false,
    }
}

/// Encrypts one plaintext into the output; false: the keys are exhausted.
fn seal(
    traffic: &mut WriteTraffic<'_, ServerConnectionData>,
    out: &mut Window,
    total: &mut u64,
    plain: &[u8],
) -> bool {
    let mut exhausted = false;
    // Each record adds a header, its content type and the AEAD tag.
    let room = plain.len() + (plain.len() / RECORD + 1) * 64;
    encode_into(out, total, room, &mut |o| {
        traffic.encrypt(plain, o).map_err(|e| match e {
            EncryptError::InsufficientSize(s) => Some(s),
            EncryptError::EncryptExhausted => {
                exhausted = true;
                None
            }
        })
    });
    !exhausted
}

/// Runs an encoder of rustls into the output's room, growing it as the
/// encoder asks; `Err(None)` from the encoder is an error it reports itself.
fn encode(
    out: &mut Window,
    total: &mut u64,
    mut f: impl FnMut(&mut [u8]) -> Result<usize, Option<InsufficientSizeError>>,
) {
    encode_into(out, total, RECORD + 256, &mut f)
}

/// [`encode`], starting with `min` bytes of room.
fn encode_into(
    out: &mut Window,
    total: &mut u64,
    mut min: usize,
    f: &mut impl FnMut(&mut [u8]) -> Result<usize, Option<InsufficientSizeError>>,
) {
    loop {
        match f(out.room(min, 0)) {
            Ok(n) => {
                out.end += n;
                *total += n as u64;
                return;
            }
            // It had at least `min`: ask for more each time.
            Err(Some(s)) => min = s.required_size.max(min + 1),
            Err(None) => return,
        }
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
pub(crate) mod tests;
