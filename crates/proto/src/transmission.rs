//! Transmission phase: request decoding, validation and reply encoding.

use crate::consts::*;
use crate::handshake::Negotiated;
use crate::ExportInfo;

pub const REQUEST_HEADER_LEN: usize = 28;
/// A request header with extended headers (NBD_OPT_EXTENDED_HEADERS).
pub const EXTENDED_REQUEST_HEADER_LEN: usize = 32;

/// Bytes of one request header in the negotiated style.
pub fn request_header_len(extended: bool) -> usize {
    if extended {
        EXTENDED_REQUEST_HEADER_LEN
    } else {
        REQUEST_HEADER_LEN
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Unknown(u16),
}

impl Command {
    pub fn from_u16(v: u16) -> Command {
        match v {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disc,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_CACHE => Command::Cache,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            CMD_BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    pub fn to_u16(self) -> u16 {
        match self {
            Command::Read => CMD_READ,
            Command::Write => CMD_WRITE,
            Command::Disc => CMD_DISC,
            Command::Flush => CMD_FLUSH,
            Command::Trim => CMD_TRIM,
            Command::Cache => CMD_CACHE,
            Command::WriteZeroes => CMD_WRITE_ZEROES,
            Command::BlockStatus => CMD_BLOCK_STATUS,
            Command::Unknown(v) => v,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    /// 32 bits on the wire, unless extended headers were negotiated.
    pub length: u64,
}

impl Request {
    /// Bytes of payload that follow the header on the wire: a WRITE's; with
    /// extended headers also any request that says so
    /// (NBD_CMD_FLAG_PAYLOAD_LEN), valid or not. A WRITE carries its payload
    /// with or without that flag (the spec wants it set; qemu 10 does not
    /// set it), as qemu's own server reads it.
    pub fn payload_len(&self, extended: bool) -> u64 {
        let flagged = extended && self.flags & CMD_FLAG_PAYLOAD_LEN != 0;
        let has_payload = self.command == Command::Write || flagged;
        if has_payload {
            self.length
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Not a request: the stream is out of sync and the connection must close.
    BadMagic(u32),
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

/// Decodes one request header, compact (28 bytes) or `extended` (32).
/// `Ok(None)`: not the whole header yet.
pub fn decode_request(buf: &[u8], extended: bool) -> Result<Option<Request>, DecodeError> {
    let (magic, len) = if extended {
        (EXTENDED_REQUEST_MAGIC, EXTENDED_REQUEST_HEADER_LEN)
    } else {
        (REQUEST_MAGIC, REQUEST_HEADER_LEN)
    };
    // Reject garbage as early as its first four bytes allow.
    if buf.len() >= 4 && be32(buf, 0) != magic {
        return Err(DecodeError::BadMagic(be32(buf, 0)));
    }
    if buf.len() < len {
        return Ok(None);
    }
    Ok(Some(Request {
        flags: u16::from_be_bytes([buf[4], buf[5]]),
        command: Command::from_u16(u16::from_be_bytes([buf[6], buf[7]])),
        cookie: be64(buf, 8),
        offset: be64(buf, 16),
        length: if extended {
            be64(buf, 24)
        } else {
            u64::from(be32(buf, 24))
        },
    }))
}

/// Encodes a request header (for clients, tests and the fuzzer); a compact
/// one keeps the low 32 bits of the length.
pub fn encode_request(out: &mut Vec<u8>, r: &Request, extended: bool) {
    let magic = if extended {
        EXTENDED_REQUEST_MAGIC
    } else {
        REQUEST_MAGIC
    };
    out.extend_from_slice(&magic.to_be_bytes());
    out.extend_from_slice(&r.flags.to_be_bytes());
    out.extend_from_slice(&r.command.to_u16().to_be_bytes());
    out.extend_from_slice(&r.cookie.to_be_bytes());
    out.extend_from_slice(&r.offset.to_be_bytes());
    if extended {
        out.extend_from_slice(&r.length.to_be_bytes());
    } else {
        out.extend_from_slice(&(r.length as u32).to_be_bytes());
    }
}

/// Largest effect length one device IO takes (devices take 32-bit lengths,
/// and this keeps pieces 4 KiB aligned). BLOCK_STATUS answers for less, as
/// the spec allows; the server serves longer TRIM, WRITE_ZEROES and CACHE
/// in pieces of at most this, so they take any length the export holds.
pub const MAX_EFFECT_LEN: u64 = 0xffff_f000;

/// Checks a request against its export and the negotiated options.
/// `Err` carries the error value the spec asks for.
pub fn validate(req: &Request, export: &ExportInfo, neg: &Negotiated) -> Result<(), u32> {
    let cmd = req.command;
    let writes = matches!(cmd, Command::Write | Command::Trim | Command::WriteZeroes);
    // "SHOULD return NBD_EPERM if it receives a write or trim request on a
    // read-only export." Before the advertised-command and flag checks: a
    // read-only export advertises no TRIM, WRITE_ZEROES or FUA, and a client
    // sending them should still learn why (nbdkit answers EPERM too).
    if writes && (export.read_only || neg.read_only) {
        return Err(EPERM);
    }
    // "The server SHOULD return NBD_EINVAL if it receives an unknown command."
    let advertised = match cmd {
        Command::Read | Command::Write | Command::Disc => true,
        // A read-only export advertises no FLUSH, yet clients send one on
        // close (nbdkit and qemu-nbd answer it): with nothing written by
        // this client there is nothing to lose by honouring it.
        Command::Flush => export.can_flush || export.read_only || neg.read_only,
        Command::Trim => export.can_trim,
        Command::Cache => export.can_cache,
        Command::WriteZeroes => export.can_write_zeroes,
        Command::BlockStatus => !neg.contexts.is_empty(),
        Command::Unknown(_) => false,
    };
    if !advertised {
        return Err(EINVAL);
    }
    check_flags(req, export, neg)?;
    // "For a flush request, length and offset are reserved, and MUST be set
    // to all-zero." A nonzero range may mean a client that expects a ranged
    // flush, which this server would silently widen (nbdkit says EINVAL too).
    if cmd == Command::Flush && (req.offset != 0 || req.length != 0) {
        return Err(EINVAL);
    }
    if matches!(cmd, Command::Flush | Command::Disc) {
        return Ok(());
    }
    // Payload-carrying requests over the advertised maximum. Commands
    // without payload are bounded only by the export's end (below): the
    // maximum block size is about payloads.
    if matches!(cmd, Command::Read | Command::Write) && req.length > u64::from(export.max_block) {
        return Err(EOVERFLOW);
    }
    let min = u64::from(export.min_block.max(1));
    if !req.offset.is_multiple_of(min) || !req.length.is_multiple_of(min) {
        return Err(EINVAL);
    }
    if cmd == Command::BlockStatus && req.length == 0 {
        return Err(EINVAL);
    }
    let end = req.offset.checked_add(req.length);
    if end.is_none_or(|e| e > export.size) {
        // ENOSPC for writes (and write-zeroes) past the end; EINVAL for
        // reads, trims and the rest.
        return Err(match cmd {
            Command::Write | Command::WriteZeroes => ENOSPC,
            _ => EINVAL,
        });
    }
    Ok(())
}

/// The request's flags are known, negotiated and apply to its command.
fn check_flags(req: &Request, export: &ExportInfo, neg: &Negotiated) -> Result<(), u32> {
    let (f, cmd) = (req.flags, req.command);
    let ext = neg.extended_headers;
    let known = CMD_FLAGS_KNOWN | if ext { CMD_FLAG_PAYLOAD_LEN } else { 0 };
    // "...SHOULD return NBD_EINVAL if it receives an unknown command flag [or]
    // a flag not explicitly documented as applicable to the given request."
    if f & !known != 0 {
        return Err(EINVAL);
    }
    // With extended headers, "for other commands [than WRITE], the flag will
    // trigger an NBD_EINVAL error" (BLOCK_STATUS's payload form is not offered).
    if f & CMD_FLAG_PAYLOAD_LEN != 0 && cmd != Command::Write {
        return Err(EINVAL);
    }
    // FUA "is valid for all commands, provided NBD_FLAG_SEND_FUA has been negotiated".
    if f & CMD_FLAG_FUA != 0 && !export.can_fua {
        return Err(EINVAL);
    }
    if f & CMD_FLAG_NO_HOLE != 0 && cmd != Command::WriteZeroes {
        return Err(EINVAL);
    }
    // DF: valid during READ; "MUST NOT be set unless the transmission flags include NBD_FLAG_SEND_DF".
    if f & CMD_FLAG_DF != 0 && (cmd != Command::Read || !(neg.structured_replies || ext)) {
        return Err(EINVAL);
    }
    if f & CMD_FLAG_REQ_ONE != 0 && cmd != Command::BlockStatus {
        return Err(EINVAL);
    }
    if f & CMD_FLAG_FAST_ZERO != 0 && (cmd != Command::WriteZeroes || !export.can_fast_zero) {
        return Err(EINVAL);
    }
    Ok(())
}

/// Simple reply header: 16 bytes; a successful READ's data follows it.
pub fn encode_simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;

/// Decodes a simple reply header (for clients): `(cookie, error)`.
/// `Ok(None)`: fewer than 16 bytes so far.
pub fn decode_simple_reply(buf: &[u8]) -> Result<Option<(u64, u32)>, DecodeError> {
    if buf.len() < SIMPLE_REPLY_LEN {
        return Ok(None);
    }
    let magic = be32(buf, 0);
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    Ok(Some((be64(buf, 8), be32(buf, 4))))
}

/// How reply chunks are framed: structured replies (20-byte header, 32-bit
/// length) or extended headers (32 bytes, with the request's offset and a
/// 64-bit length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Structured,
    Extended { request_offset: u64 },
}

fn chunk_header(out: &mut Vec<u8>, framing: Framing, head: (u16, u16, u64), len: u64) {
    let (flags, typ, cookie) = head;
    let magic = match framing {
        Framing::Structured => STRUCTURED_REPLY_MAGIC,
        Framing::Extended { .. } => EXTENDED_REPLY_MAGIC,
    };
    out.extend_from_slice(&magic.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&typ.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    match framing {
        Framing::Structured => {
            debug_assert!(len <= u64::from(u32::MAX), "chunk of {len} bytes");
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
        Framing::Extended { request_offset } => {
            out.extend_from_slice(&request_offset.to_be_bytes());
            out.extend_from_slice(&len.to_be_bytes());
        }
    }
}

fn done_flag(done: bool) -> u16 {
    if done {
        REPLY_FLAG_DONE
    } else {
        0
    }
}

/// OFFSET_DATA chunk header (28 or 40 bytes); `data_len` bytes of data follow it.
pub fn encode_offset_data_header(
    out: &mut Vec<u8>,
    framing: Framing,
    cookie: u64,
    offset: u64,
    data_len: u32,
    done: bool,
) {
    let head = (done_flag(done), REPLY_TYPE_OFFSET_DATA, cookie);
    chunk_header(out, framing, head, u64::from(data_len) + 8);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// The final NONE chunk of a structured reply; with extended headers, the
/// whole reply to a request without data.
pub fn encode_done(out: &mut Vec<u8>, framing: Framing, cookie: u64) {
    chunk_header(out, framing, (REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie), 0);
}

/// ERROR (or ERROR_OFFSET, when `offset` is given) chunk.
pub fn encode_error_chunk(
    out: &mut Vec<u8>,
    framing: Framing,
    cookie: u64,
    error: u32,
    message: &str,
    offset: Option<u64>,
    done: bool,
) {
    // Strings are at most 4096 bytes; cut on a char boundary.
    let mut end = message.len().min(4096);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let msg = &message.as_bytes()[..end];
    let typ = if offset.is_some() {
        REPLY_TYPE_ERROR_OFFSET
    } else {
        REPLY_TYPE_ERROR
    };
    let len = 6 + msg.len() + if offset.is_some() { 8 } else { 0 };
    chunk_header(out, framing, (done_flag(done), typ, cookie), len as u64);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    if let Some(o) = offset {
        out.extend_from_slice(&o.to_be_bytes());
    }
}

/// Block status chunk for one metadata context: (length, flags) extents;
/// BLOCK_STATUS, or BLOCK_STATUS_EXT (64-bit extents, with their count)
/// under extended headers.
pub fn encode_block_status(
    out: &mut Vec<u8>,
    framing: Framing,
    cookie: u64,
    context_id: u32,
    extents: &[(u32, u32)],
    done: bool,
) {
    let flags = done_flag(done);
    match framing {
        Framing::Structured => {
            let len = 4 + 8 * extents.len() as u64;
            chunk_header(out, framing, (flags, REPLY_TYPE_BLOCK_STATUS, cookie), len);
            out.extend_from_slice(&context_id.to_be_bytes());
            for (l, f) in extents {
                out.extend_from_slice(&l.to_be_bytes());
                out.extend_from_slice(&f.to_be_bytes());
            }
        }
        Framing::Extended { .. } => {
            let len = 8 + 16 * extents.len() as u64;
            let head = (flags, REPLY_TYPE_BLOCK_STATUS_EXT, cookie);
            chunk_header(out, framing, head, len);
            out.extend_from_slice(&context_id.to_be_bytes());
            out.extend_from_slice(&(extents.len() as u32).to_be_bytes());
            for (l, f) in extents {
                out.extend_from_slice(&u64::from(*l).to_be_bytes());
                out.extend_from_slice(&u64::from(*f).to_be_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn neg(structured: bool, ctx: bool) -> Negotiated {
        Negotiated {
            export_index: 0,
            structured_replies: structured,
            extended_headers: false,
            contexts: if ctx {
                vec![crate::SelectedContext {
                    id: 1,
                    context: crate::MetaContext::Allocation,
                }]
            } else {
                Vec::new()
            },
            no_zeroes: true,
            read_only: false,
        }
    }

    fn req(command: Command, flags: u16, offset: u64, length: u64) -> Request {
        Request {
            flags,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn simple_reply_round_trips() {
        let mut out = Vec::new();
        encode_simple_reply(&mut out, 0xfeed, EIO);
        assert_eq!(out.len(), SIMPLE_REPLY_LEN);
        assert_eq!(decode_simple_reply(&out[..15]), Ok(None));
        assert_eq!(decode_simple_reply(&out), Ok(Some((0xfeed, EIO))));
        out[0] ^= 1;
        assert!(decode_simple_reply(&out).is_err());
    }

    fn check(r: Request) -> Result<(), u32> {
        validate(&r, &ExportInfo::simple("e", 1 << 20), &neg(true, true))
    }

    #[test]
    fn decode_needs_whole_header_and_right_magic() {
        let mut b = Vec::new();
        encode_request(&mut b, &req(Command::Write, CMD_FLAG_FUA, 4096, 512), false);
        assert_eq!(decode_request(&b[..27], false), Ok(None));
        let r = decode_request(&b, false).expect("valid").expect("complete");
        assert_eq!(r.command, Command::Write);
        assert_eq!(
            (r.flags, r.cookie, r.offset, r.length),
            (CMD_FLAG_FUA, 7, 4096, 512)
        );
        assert_eq!(r.payload_len(false), 512);
        // A compact header where an extended one is due is out of sync.
        assert!(decode_request(&b, true).is_err());
        b[0] ^= 0xff;
        assert!(matches!(
            decode_request(&b[..4], false),
            Err(DecodeError::BadMagic(_))
        ));
    }

    #[test]
    fn flush_with_a_range_is_invalid() {
        assert_eq!(check(req(Command::Flush, 0, 4096, 0)), Err(EINVAL));
        assert_eq!(check(req(Command::Flush, 0, 0, 4096)), Err(EINVAL));
    }

    #[test]
    fn in_range_requests_pass() {
        assert_eq!(check(req(Command::Read, 0, 0, 4096)), Ok(()));
        assert_eq!(
            check(req(Command::Write, CMD_FLAG_FUA, (1 << 20) - 4096, 4096)),
            Ok(())
        );
        assert_eq!(check(req(Command::Flush, 0, 0, 0)), Ok(()));
        assert_eq!(
            check(req(
                Command::WriteZeroes,
                CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                0,
                8192
            )),
            Ok(())
        );
        assert_eq!(
            check(req(Command::BlockStatus, CMD_FLAG_REQ_ONE, 0, 4096)),
            Ok(())
        );
        assert_eq!(check(req(Command::Read, CMD_FLAG_DF, 0, 4096)), Ok(()));
    }

    #[test]
    fn read_past_end_is_einval_write_is_enospc() {
        // "SHOULD return NBD_EINVAL if it receives a read or trim request including
        // one or more sectors beyond the size of the device" / "NBD_ENOSPC ... write".
        assert_eq!(check(req(Command::Read, 0, 1 << 20, 1)), Err(EINVAL));
        assert_eq!(check(req(Command::Trim, 0, 1 << 20, 4096)), Err(EINVAL));
        assert_eq!(check(req(Command::Write, 0, (1 << 20) - 1, 2)), Err(ENOSPC));
        assert_eq!(
            check(req(Command::WriteZeroes, 0, 1 << 20, 4096)),
            Err(ENOSPC)
        );
        // Offset + length overflowing u64 is out of range, not a wrap-around.
        assert_eq!(check(req(Command::Read, 0, u64::MAX, 4096)), Err(EINVAL));
    }

    #[test]
    fn oversize_payload_is_eoverflow() {
        let mut e = ExportInfo::simple("e", 1 << 30);
        e.max_block = 1 << 20;
        let r = validate(
            &req(Command::Read, 0, 0, (1 << 20) + 1),
            &e,
            &neg(false, false),
        );
        assert_eq!(r, Err(EOVERFLOW));
        let w = validate(
            &req(Command::Write, 0, 0, (1 << 20) + 1),
            &e,
            &neg(false, false),
        );
        assert_eq!(w, Err(EOVERFLOW));
        // Commands without payload may exceed the maximum payload.
        let t = validate(&req(Command::Trim, 0, 0, 8 << 20), &e, &neg(false, false));
        assert_eq!(t, Ok(()));
    }

    #[test]
    fn read_only_rejects_writes_with_eperm() {
        let mut e = ExportInfo::simple("e", 1 << 20);
        e.read_only = true;
        for c in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(
                validate(&req(c, 0, 0, 4096), &e, &neg(true, true)),
                Err(EPERM),
                "{c:?}"
            );
        }
        // As the server advertises a read-only export: no TRIM, WRITE_ZEROES
        // or FUA. Still EPERM, not EINVAL for the unadvertised command or flag.
        e.can_trim = false;
        e.can_write_zeroes = false;
        e.can_fast_zero = false;
        e.can_fua = false;
        e.can_flush = false;
        for (c, f) in [
            (Command::Trim, 0),
            (Command::WriteZeroes, 0),
            (Command::WriteZeroes, CMD_FLAG_FAST_ZERO),
            (Command::Write, CMD_FLAG_FUA),
        ] {
            assert_eq!(
                validate(&req(c, f, 0, 4096), &e, &neg(true, true)),
                Err(EPERM),
                "{c:?} flags {f}"
            );
        }
        for c in [Command::Read, Command::Flush] {
            assert_eq!(
                validate(
                    &req(c, 0, 0, 4096 * u64::from(c == Command::Read)),
                    &e,
                    &neg(true, true)
                ),
                Ok(()),
                "{c:?}"
            );
        }
        // A writable export, read-only for this client (access control).
        e.read_only = false;
        let client = Negotiated {
            read_only: true,
            ..neg(true, true)
        };
        assert_eq!(
            validate(&req(Command::Write, 0, 0, 4096), &e, &client),
            Err(EPERM)
        );
        assert_eq!(validate(&req(Command::Flush, 0, 0, 0), &e, &client), Ok(()));
        // A writable export without FLUSH (a null device) still refuses it.
        assert_eq!(
            validate(&req(Command::Flush, 0, 0, 0), &e, &neg(true, true)),
            Err(EINVAL)
        );
    }

    #[test]
    fn unknown_commands_and_flags_are_einval() {
        assert_eq!(check(req(Command::Unknown(42), 0, 0, 0)), Err(EINVAL));
        assert_eq!(check(req(Command::Read, 1 << 9, 0, 4096)), Err(EINVAL));
        // Flags on commands they do not apply to.
        assert_eq!(
            check(req(Command::Write, CMD_FLAG_NO_HOLE, 0, 4096)),
            Err(EINVAL)
        );
        assert_eq!(
            check(req(Command::Write, CMD_FLAG_DF, 0, 4096)),
            Err(EINVAL)
        );
        assert_eq!(
            check(req(Command::Read, CMD_FLAG_REQ_ONE, 0, 4096)),
            Err(EINVAL)
        );
        assert_eq!(
            check(req(Command::Trim, CMD_FLAG_FAST_ZERO, 0, 4096)),
            Err(EINVAL)
        );
        // FUA is fine on any command once SEND_FUA was advertised...
        assert_eq!(check(req(Command::Read, CMD_FLAG_FUA, 0, 4096)), Ok(()));
        // ...and not without it.
        let mut e = ExportInfo::simple("e", 1 << 20);
        e.can_fua = false;
        assert_eq!(
            validate(
                &req(Command::Write, CMD_FLAG_FUA, 0, 4096),
                &e,
                &neg(true, true)
            ),
            Err(EINVAL)
        );
    }

    #[test]
    fn df_needs_structured_and_block_status_needs_context() {
        let e = ExportInfo::simple("e", 1 << 20);
        assert_eq!(
            validate(
                &req(Command::Read, CMD_FLAG_DF, 0, 4096),
                &e,
                &neg(false, false)
            ),
            Err(EINVAL)
        );
        assert_eq!(
            validate(
                &req(Command::BlockStatus, 0, 0, 4096),
                &e,
                &neg(true, false)
            ),
            Err(EINVAL)
        );
        assert_eq!(check(req(Command::BlockStatus, 0, 0, 0)), Err(EINVAL));
    }

    #[test]
    fn misalignment_is_einval() {
        let mut e = ExportInfo::simple("e", 1 << 20);
        e.min_block = 512;
        assert_eq!(
            validate(&req(Command::Read, 0, 100, 512), &e, &neg(false, false)),
            Err(EINVAL)
        );
        assert_eq!(
            validate(&req(Command::Write, 0, 512, 100), &e, &neg(false, false)),
            Err(EINVAL)
        );
    }

    #[test]
    fn reply_encodings() {
        let st = Framing::Structured;
        let mut b = Vec::new();
        encode_simple_reply(&mut b, 0x1122, EIO);
        assert_eq!(b.len(), 16);
        assert_eq!(&b[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&b[4..8], &EIO.to_be_bytes());
        b.clear();
        encode_offset_data_header(&mut b, st, 1, 4096, 512, true);
        assert_eq!(b.len(), 28);
        assert_eq!(&b[16..20], &520u32.to_be_bytes());
        b.clear();
        encode_error_chunk(&mut b, st, 1, EINVAL, "bad", Some(9), true);
        assert_eq!(b.len(), 20 + 6 + 3 + 8);
        b.clear();
        let extents = [(4096, 0), (8192, STATE_HOLE | STATE_ZERO)];
        encode_block_status(&mut b, st, 1, 1, &extents, true);
        assert_eq!(b.len(), 20 + 4 + 16);
    }

    #[test]
    fn extended_reply_encodings() {
        let ext = Framing::Extended {
            request_offset: 1 << 40,
        };
        let mut b = Vec::new();
        encode_offset_data_header(&mut b, ext, 7, (1 << 40) + 512, 4096, false);
        assert_eq!(b.len(), 32 + 8);
        assert_eq!(&b[..4], &EXTENDED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&b[4..6], &0u16.to_be_bytes(), "not done");
        assert_eq!(
            &b[16..24],
            &(1u64 << 40).to_be_bytes(),
            "the request's offset"
        );
        assert_eq!(&b[24..32], &4104u64.to_be_bytes());
        assert_eq!(&b[32..40], &((1u64 << 40) + 512).to_be_bytes());
        b.clear();
        encode_done(&mut b, ext, 7);
        assert_eq!(b.len(), 32);
        assert_eq!(&b[4..8], &[0, 1, 0, 0], "DONE, NONE");
        b.clear();
        encode_block_status(&mut b, ext, 7, 1, &[(4096, 0), (8192, STATE_HOLE)], true);
        assert_eq!(b.len(), 32 + 8 + 2 * 16);
        assert_eq!(&b[6..8], &REPLY_TYPE_BLOCK_STATUS_EXT.to_be_bytes());
        assert_eq!(&b[24..32], &40u64.to_be_bytes());
        assert_eq!(&b[36..40], &2u32.to_be_bytes(), "descriptor count");
        assert_eq!(&b[40..48], &4096u64.to_be_bytes());
        assert_eq!(&b[64..72], &u64::from(STATE_HOLE).to_be_bytes());
    }

    #[test]
    fn extended_requests_carry_64_bit_lengths_and_payload_flag() {
        let mut e = ExportInfo::simple("e", 1 << 40);
        e.max_block = 64 << 20;
        let ext = Negotiated {
            extended_headers: true,
            ..neg(false, true)
        };
        let w = req(Command::Write, CMD_FLAG_PAYLOAD_LEN, 0, 64 << 20);
        let mut b = Vec::new();
        encode_request(&mut b, &w, true);
        assert_eq!(b.len(), EXTENDED_REQUEST_HEADER_LEN);
        assert_eq!(decode_request(&b[..31], true), Ok(None));
        let r = decode_request(&b, true).expect("valid").expect("complete");
        assert_eq!(r, w);
        assert_eq!(r.payload_len(true), 64 << 20);
        assert_eq!(validate(&r, &e, &ext), Ok(()));
        // WRITE carries its payload even when it does not say so (qemu 10);
        // nothing else may carry one.
        let bare = req(Command::Write, 0, 0, 4096);
        assert_eq!(validate(&bare, &e, &ext), Ok(()));
        assert_eq!(bare.payload_len(true), 4096);
        let odd = req(Command::Trim, CMD_FLAG_PAYLOAD_LEN, 0, 16);
        assert_eq!(validate(&odd, &e, &ext), Err(EINVAL));
        assert_eq!(odd.payload_len(true), 16, "consumed before the error");
        // The flag is unknown without extended headers.
        assert_eq!(validate(&w, &e, &neg(true, true)), Err(EINVAL));
        // 64-bit effect lengths: block status answers, TRIM, WRITE_ZEROES
        // and CACHE past the devices' 32 bits are served (in pieces) up to
        // the export's end; READ past the maximum payload overflows.
        let bs = req(Command::BlockStatus, 0, 0, 1 << 36);
        assert_eq!(validate(&bs, &e, &ext), Ok(()));
        let past_end = [(Command::Trim, EINVAL), (Command::WriteZeroes, ENOSPC)];
        for (cmd, errno) in past_end.into_iter().chain([(Command::Cache, EINVAL)]) {
            assert_eq!(validate(&req(cmd, 0, 0, 1 << 36), &e, &ext), Ok(()));
            let whole = req(cmd, 0, 0, 1 << 40);
            assert_eq!(validate(&whole, &e, &ext), Ok(()), "{cmd:?} of the export");
            let past = req(cmd, 0, 4096, 1 << 40);
            assert_eq!(
                validate(&past, &e, &ext),
                Err(errno),
                "{cmd:?} past its end"
            );
        }
        let read = req(Command::Read, 0, 0, (64 << 20) + 4096);
        assert_eq!(validate(&read, &e, &ext), Err(EOVERFLOW));
        // DF needs structured replies or extended headers.
        let df = req(Command::Read, CMD_FLAG_DF, 0, 4096);
        assert_eq!(validate(&df, &e, &ext), Ok(()));
    }

    proptest! {
        #[test]
        fn request_roundtrip(flags: u16, cmd: u16, cookie: u64, offset: u64, length: u64, ext: bool) {
            let length = if ext { length } else { length & 0xffff_ffff };
            let r = Request { flags, command: Command::from_u16(cmd), cookie, offset, length };
            let mut b = Vec::new();
            encode_request(&mut b, &r, ext);
            prop_assert_eq!(b.len(), request_header_len(ext));
            prop_assert_eq!(decode_request(&b, ext), Ok(Some(r)));
        }

        #[test]
        fn validate_never_panics(flags: u16, cmd: u16, offset: u64, length: u64, ro: bool, st: bool, ext: bool) {
            let mut e = ExportInfo::simple("e", 1 << 30);
            e.read_only = ro;
            let r = Request { flags, command: Command::from_u16(cmd), cookie: 0, offset, length };
            let n = Negotiated { extended_headers: ext, ..neg(st, st) };
            if validate(&r, &e, &n).is_ok() && cmd <= CMD_BLOCK_STATUS && cmd != CMD_FLUSH && cmd != CMD_DISC {
                prop_assert!(offset.checked_add(length).is_some_and(|end| end <= e.size));
            }
        }
    }
}
