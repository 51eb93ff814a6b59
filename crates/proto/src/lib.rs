//! NBD wire protocol: sans-IO handshake and transmission codecs.
//! Knows nothing of sockets or threads; the target and the fuzzer drive it
//! with bytes. Numbers and rules follow NetworkBlockDevice/nbd `doc/proto.md`.

pub mod consts;
pub mod fuzzing;
mod handshake;
mod meta;
pub mod nvme;
mod transmission;

pub use consts::*;
pub use handshake::{
    Access, BitmapNames, Handshake, HandshakeStatus, Negotiated, Tls, MAX_OPTION_LEN,
};
pub use meta::{MetaContext, SelectedContext, DIRTY_BITMAP_PREFIX, QEMU_NAMESPACE};
pub use transmission::{
    decode_request, decode_simple_reply, encode_block_status, encode_done, encode_error_chunk,
    encode_offset_data_header, encode_request, encode_simple_reply, request_header_len, validate,
    Command, DecodeError, Framing, Request, EXTENDED_REQUEST_HEADER_LEN, MAX_EFFECT_LEN,
    REQUEST_HEADER_LEN, SIMPLE_REPLY_LEN,
};

/// One export as the protocol describes it to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size: u64,
    pub read_only: bool,
    pub can_flush: bool,
    pub can_fua: bool,
    pub can_trim: bool,
    pub can_write_zeroes: bool,
    pub can_fast_zero: bool,
    pub can_multi_conn: bool,
    pub can_cache: bool,
    pub rotational: bool,
    pub min_block: u32,
    pub pref_block: u32,
    pub max_block: u32,
}

impl ExportInfo {
    /// A plain writable export with every feature, for tests and the fuzzer.
    pub fn simple(name: &str, size: u64) -> ExportInfo {
        ExportInfo {
            name: name.to_string(),
            description: String::new(),
            size,
            read_only: false,
            can_flush: true,
            can_fua: true,
            can_trim: true,
            can_write_zeroes: true,
            can_fast_zero: true,
            can_multi_conn: true,
            can_cache: true,
            rotational: false,
            min_block: 1,
            pref_block: 4096,
            max_block: 32 << 20,
        }
    }

    /// Transmission flags; DF is only offered with structured replies (or
    /// extended headers), as the spec requires.
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = FLAG_HAS_FLAGS;
        let bits = [
            (self.read_only, FLAG_READ_ONLY),
            (self.can_flush, FLAG_SEND_FLUSH),
            (self.can_fua, FLAG_SEND_FUA),
            (self.rotational, FLAG_ROTATIONAL),
            (self.can_trim, FLAG_SEND_TRIM),
            (self.can_write_zeroes, FLAG_SEND_WRITE_ZEROES),
            (structured, FLAG_SEND_DF),
            (self.can_multi_conn, FLAG_CAN_MULTI_CONN),
            (self.can_cache, FLAG_SEND_CACHE),
            (
                self.can_write_zeroes && self.can_fast_zero,
                FLAG_SEND_FAST_ZERO,
            ),
        ];
        for (on, bit) in bits {
            if on {
                f |= bit;
            }
        }
        f
    }
}
