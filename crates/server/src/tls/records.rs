//! TLS 1.3 records sealed and opened in place, once rustls has done the
//! handshake: the traffic secrets it extracts, with its `KernelConnection`
//! for key updates, as kTLS users do (RFC 8446 section 5). rustls's
//! unbuffered `encrypt` seals each record into a buffer of its own and then
//! copies it into the caller's; here the plaintext is copied once, into the
//! session's output, and sealed where it lies.
//!
//! What a record may carry after the handshake, from a client: application
//! data, an alert (close_notify ends the input; any other fails the
//! session), or one KeyUpdate (the receive key moves on, and the send key
//! too when the client asks). The send key also moves on, with a KeyUpdate
//! of our own, before it reaches the cipher suite's confidentiality limit.

use std::ops::Range;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{AlertDescription, ConnectionTrafficSecrets, Error, SupportedCipherSuite};

pub const HEADER: usize = 5;
const TAG: usize = 16;
/// Bytes a record adds to its plaintext: header, inner content type, tag.
pub const OVERHEAD: usize = HEADER + 1 + TAG;
/// Largest plaintext of one record.
pub const MAX_PLAIN: usize = 16 << 10;
/// Largest ciphertext of one record a peer may send (2^14 + 256).
const MAX_CIPHER: usize = MAX_PLAIN + 256;

pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const APPLICATION_DATA: u8 = 23;
const KEY_UPDATE: u8 = 24;

/// One direction's key, IV and record sequence number.
struct Keys {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Keys {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> Result<Keys, Error> {
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(Error::General("a cipher this record layer lacks".into())),
        };
        let key = UnboundKey::new(alg, key.as_ref())
            .map_err(|_| Error::General("a traffic key of the wrong length".into()))?;
        let iv = iv
            .as_ref()
            .try_into()
            .map_err(|_| Error::General("a traffic IV of the wrong length".into()))?;
        Ok(Keys {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The next record's nonce (the IV XOR the sequence number); the
    /// sequence number moves on, so no nonce is used twice.
    fn next_nonce(&mut self) -> Nonce {
        let mut n = self.iv;
        for (b, s) in n[NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(n)
    }
}

/// A fatal condition: rustls's error and the alert the peer gets, if any.
#[derive(Debug)]
pub struct Fatal {
    pub error: Error,
    pub alert: Option<AlertDescription>,
}

fn fatal(alert: AlertDescription, what: &str) -> Fatal {
    Fatal {
        error: Error::General(format!("TLS record: {what}")),
        alert: Some(alert),
    }
}

/// What one received record held.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Application data at this range of the record's bytes (maybe empty).
    Data(Range<usize>),
    /// close_notify: no more input.
    Closed,
    /// A KeyUpdate was applied; the peer asked for ours (to be sent).
    KeyUpdated { requested: bool },
}

pub struct Records {
    kernel: KernelConnection<ServerConnectionData>,
    tx: Keys,
    rx: Keys,
    /// Records sealed under one send key before a KeyUpdate.
    tx_limit: u64,
}

impl Records {
    /// The record layer of a TLS 1.3 session rustls has brought up.
    pub fn new(
        secrets: rustls::ExtractedSecrets,
        kernel: KernelConnection<ServerConnectionData>,
    ) -> Result<Records, Error> {
        let limit = match kernel.negotiated_cipher_suite() {
            SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            _ => return Err(Error::General("records are TLS 1.3's".into())),
        };
        Ok(Records {
            tx: Keys::new(secrets.tx)?,
            rx: Keys::new(secrets.rx)?,
            tx_limit: limit - limit / 8,
            kernel,
        })
    }

    #[cfg(test)]
    pub fn set_tx_limit(&mut self, records: u64) {
        self.tx_limit = records;
    }

    /// Whether the send key must move on before the next record.
    pub fn tx_exhausted(&self) -> bool {
        self.tx.seq >= self.tx_limit
    }

    /// Seals `plain` (at most [`MAX_PLAIN`] bytes) of content type `ct` as
    /// one record at the start of `out` (at least `plain.len() +
    /// OVERHEAD` bytes); returns the record's length.
    pub fn seal(&mut self, out: &mut [u8], plain: &[u8], ct: u8) -> usize {
        assert!(
            out.len() >= plain.len() + OVERHEAD,
            "no room for the record"
        );
        out[HEADER..HEADER + plain.len()].copy_from_slice(plain);
        self.seal_placed(out, plain.len(), ct)
    }

    /// Seals the record at the start of `out` whose `n` bytes of plaintext
    /// are already in place after the header's room: the header, content
    /// type and tag are written around them.
    pub fn seal_placed(&mut self, out: &mut [u8], n: usize, ct: u8) -> usize {
        assert!(n <= MAX_PLAIN, "a record of {n} bytes");
        let body = n + 1;
        let len = HEADER + body + TAG;
        assert!(out.len() >= len, "{} bytes of room for {len}", out.len());
        let header = [
            APPLICATION_DATA,
            3,
            3,
            ((body + TAG) >> 8) as u8,
            (body + TAG) as u8,
        ];
        out[..HEADER].copy_from_slice(&header);
        out[HEADER + n] = ct;
        let nonce = self.tx.next_nonce();
        let (text, tag) = out[HEADER..len].split_at_mut(body);
        let sealed = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), text);
        // Sealing fails only for plaintexts past the AEAD's limit (GiBs).
        let sealed = sealed.expect("a record is within the AEAD's limit");
        tag.copy_from_slice(sealed.as_ref());
        len
    }

    /// Seals a KeyUpdate into `out` (at least `5 + OVERHEAD` bytes) and
    /// moves the send key on; returns the record's length.
    pub fn seal_key_update(&mut self, out: &mut [u8], request: bool) -> Result<usize, Error> {
        let msg = [KEY_UPDATE, 0, 0, 1, u8::from(request)];
        let n = self.seal(out, &msg, HANDSHAKE);
        self.tx = Keys::new(self.kernel.update_tx_secret()?)?;
        Ok(n)
    }

    /// The whole record at the start of `buf`: its length, once all of it
    /// is there (`Ok(None)`: more is needed).
    pub fn record_len(buf: &[u8]) -> Result<Option<usize>, Fatal> {
        let Some(h) = buf.get(..HEADER) else {
            return Ok(None);
        };
        if h[0] != APPLICATION_DATA {
            return Err(fatal(
                AlertDescription::UnexpectedMessage,
                "not an encrypted record",
            ));
        }
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if len > MAX_CIPHER {
            return Err(fatal(AlertDescription::RecordOverflow, "record too long"));
        }
        if len < TAG + 1 {
            return Err(fatal(AlertDescription::DecodeError, "record too short"));
        }
        Ok((buf.len() >= HEADER + len).then_some(HEADER + len))
    }

    /// Opens the whole record `rec` in place (as [`Records::record_len`]
    /// measured it) and acts on what it holds.
    pub fn open(&mut self, rec: &mut [u8]) -> Result<Opened, Fatal> {
        let (header, body) = rec.split_at_mut(HEADER);
        let nonce = self.rx.next_nonce();
        let plain = self
            .rx
            .key
            .open_in_place(nonce, Aad::from(&*header), body)
            .map_err(|_| Fatal {
                error: Error::DecryptError,
                alert: Some(AlertDescription::BadRecordMac),
            })?;
        // The content type is the last byte that is not padding.
        let Some(end) = plain.iter().rposition(|b| *b != 0) else {
            return Err(fatal(
                AlertDescription::UnexpectedMessage,
                "no content type",
            ));
        };
        let (ct, content) = (plain[end], &plain[..end]);
        if content.len() > MAX_PLAIN {
            return Err(fatal(
                AlertDescription::RecordOverflow,
                "plaintext too long",
            ));
        }
        match ct {
            APPLICATION_DATA => Ok(Opened::Data(HEADER..HEADER + end)),
            ALERT => match content {
                [_, 0] => Ok(Opened::Closed),
                [_, d] => Err(Fatal {
                    error: Error::AlertReceived(AlertDescription::from(*d)),
                    alert: None,
                }),
                _ => Err(fatal(AlertDescription::DecodeError, "a malformed alert")),
            },
            HANDSHAKE => match *content {
                [KEY_UPDATE, 0, 0, 1, r @ (0 | 1)] => {
                    let next = self.kernel.update_rx_secret().map_err(|error| Fatal {
                        error,
                        alert: Some(AlertDescription::InternalError),
                    })?;
                    self.rx = Keys::new(next).map_err(|error| Fatal {
                        error,
                        alert: Some(AlertDescription::InternalError),
                    })?;
                    Ok(Opened::KeyUpdated { requested: r == 1 })
                }
                _ => Err(fatal(
                    AlertDescription::UnexpectedMessage,
                    "a handshake message after the handshake",
                )),
            },
            _ => Err(fatal(
                AlertDescription::UnexpectedMessage,
                "an unexpected content type",
            )),
        }
    }

    /// Seals the alert `desc` (fatal, or a close_notify warning) into `out`
    /// (at least `2 + OVERHEAD` bytes); returns the record's length.
    pub fn seal_alert(&mut self, out: &mut [u8], desc: AlertDescription) -> usize {
        let level = if desc == AlertDescription::CloseNotify {
            1
        } else {
            2
        };
        self.seal(out, &[level, u8::from(desc)], ALERT)
    }
}
