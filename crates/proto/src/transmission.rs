//! Transmission phase: request decoding, validation and reply encoding.

use crate::consts::*;
use crate::handshake::Negotiated;
use crate::ExportInfo;

pub const REQUEST_HEADER_LEN: usize = 28;

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
    pub length: u32,
}

impl Request {
    /// Bytes of payload that follow the header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
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

/// Decodes one request header. `Ok(None)`: fewer than 28 bytes so far.
pub fn decode_request(buf: &[u8]) -> Result<Option<Request>, DecodeError> {
    if buf.len() < REQUEST_HEADER_LEN {
        // Reject garbage as early as its first four bytes allow.
        if buf.len() >= 4 && be32(buf, 0) != REQUEST_MAGIC {
            return Err(DecodeError::BadMagic(be32(buf, 0)));
        }
        return Ok(None);
    }
    let magic = be32(buf, 0);
    if magic != REQUEST_MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    Ok(Some(Request {
        flags: u16::from_be_bytes([buf[4], buf[5]]),
        command: Command::from_u16(u16::from_be_bytes([buf[6], buf[7]])),
        cookie: be64(buf, 8),
        offset: be64(buf, 16),
        length: be32(buf, 24),
    }))
}

/// Encodes a request header (for clients, tests and the fuzzer).
pub fn encode_request(out: &mut Vec<u8>, r: &Request) {
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&r.flags.to_be_bytes());
    out.extend_from_slice(&r.command.to_u16().to_be_bytes());
    out.extend_from_slice(&r.cookie.to_be_bytes());
    out.extend_from_slice(&r.offset.to_be_bytes());
    out.extend_from_slice(&r.length.to_be_bytes());
}

/// Checks a request against its export and the negotiated options.
/// `Err` carries the error value the spec asks for.
pub fn validate(req: &Request, export: &ExportInfo, neg: &Negotiated) -> Result<(), u32> {
    let f = req.flags;
    let cmd = req.command;
    // "The server SHOULD return NBD_EINVAL if it receives an unknown command."
    let advertised = match cmd {
        Command::Read | Command::Write | Command::Disc => true,
        Command::Flush => export.can_flush,
        Command::Trim => export.can_trim,
        Command::Cache => export.can_cache,
        Command::WriteZeroes => export.can_write_zeroes,
        Command::BlockStatus => neg.base_allocation.is_some(),
        Command::Unknown(_) => false,
    };
    if !advertised {
        return Err(EINVAL);
    }
    // "...SHOULD return NBD_EINVAL if it receives an unknown command flag [or]
    // a flag not explicitly documented as applicable to the given request."
    if f & !CMD_FLAGS_KNOWN != 0 {
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
    if f & CMD_FLAG_DF != 0 && (cmd != Command::Read || !neg.structured_replies) {
        return Err(EINVAL);
    }
    if f & CMD_FLAG_REQ_ONE != 0 && cmd != Command::BlockStatus {
        return Err(EINVAL);
    }
    if f & CMD_FLAG_FAST_ZERO != 0 && (cmd != Command::WriteZeroes || !export.can_fast_zero) {
        return Err(EINVAL);
    }
    let writes = matches!(cmd, Command::Write | Command::Trim | Command::WriteZeroes);
    // "SHOULD return NBD_EPERM if it receives a write or trim request on a read-only export."
    if writes && (export.read_only || neg.read_only) {
        return Err(EPERM);
    }
    if matches!(cmd, Command::Flush | Command::Disc) {
        return Ok(());
    }
    // Payload-carrying requests over the advertised maximum.
    if matches!(cmd, Command::Read | Command::Write) && req.length > export.max_block {
        return Err(EOVERFLOW);
    }
    let min = u64::from(export.min_block.max(1));
    if !req.offset.is_multiple_of(min) || u64::from(req.length) % min != 0 {
        return Err(EINVAL);
    }
    if cmd == Command::BlockStatus && req.length == 0 {
        return Err(EINVAL);
    }
    let end = req.offset.checked_add(u64::from(req.length));
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

/// Simple reply header: 16 bytes; a successful READ's data follows it.
pub fn encode_simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

fn chunk_header(out: &mut Vec<u8>, flags: u16, typ: u16, cookie: u64, len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&typ.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

fn done_flag(done: bool) -> u16 {
    if done {
        REPLY_FLAG_DONE
    } else {
        0
    }
}

/// OFFSET_DATA chunk header (28 bytes); `data_len` bytes of data follow it.
pub fn encode_offset_data_header(
    out: &mut Vec<u8>,
    cookie: u64,
    offset: u64,
    data_len: u32,
    done: bool,
) {
    chunk_header(
        out,
        done_flag(done),
        REPLY_TYPE_OFFSET_DATA,
        cookie,
        data_len.saturating_add(8),
    );
    out.extend_from_slice(&offset.to_be_bytes());
}

/// The final NONE chunk of a structured reply.
pub fn encode_done(out: &mut Vec<u8>, cookie: u64) {
    chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0);
}

/// ERROR (or ERROR_OFFSET, when `offset` is given) chunk.
pub fn encode_error_chunk(
    out: &mut Vec<u8>,
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
    chunk_header(out, done_flag(done), typ, cookie, len as u32);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    if let Some(o) = offset {
        out.extend_from_slice(&o.to_be_bytes());
    }
}

/// BLOCK_STATUS chunk for one metadata context: (length, flags) extents.
pub fn encode_block_status(
    out: &mut Vec<u8>,
    cookie: u64,
    context_id: u32,
    extents: &[(u32, u32)],
    done: bool,
) {
    let len = 4 + 8 * extents.len();
    chunk_header(
        out,
        done_flag(done),
        REPLY_TYPE_BLOCK_STATUS,
        cookie,
        len as u32,
    );
    out.extend_from_slice(&context_id.to_be_bytes());
    for (l, f) in extents {
        out.extend_from_slice(&l.to_be_bytes());
        out.extend_from_slice(&f.to_be_bytes());
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
            base_allocation: ctx.then_some(1),
            no_zeroes: true,
            read_only: false,
        }
    }

    fn req(command: Command, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    fn check(r: Request) -> Result<(), u32> {
        validate(&r, &ExportInfo::simple("e", 1 << 20), &neg(true, true))
    }

    #[test]
    fn decode_needs_whole_header_and_right_magic() {
        let mut b = Vec::new();
        encode_request(&mut b, &req(Command::Write, CMD_FLAG_FUA, 4096, 512));
        assert_eq!(decode_request(&b[..27]), Ok(None));
        let r = decode_request(&b).expect("valid").expect("complete");
        assert_eq!(r.command, Command::Write);
        assert_eq!(
            (r.flags, r.cookie, r.offset, r.length),
            (CMD_FLAG_FUA, 7, 4096, 512)
        );
        assert_eq!(r.payload_len(), 512);
        b[0] ^= 0xff;
        assert!(matches!(
            decode_request(&b[..4]),
            Err(DecodeError::BadMagic(_))
        ));
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
        assert_eq!(
            validate(&req(Command::Read, 0, 0, 4096), &e, &neg(true, true)),
            Ok(())
        );
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
        let mut b = Vec::new();
        encode_simple_reply(&mut b, 0x1122, EIO);
        assert_eq!(b.len(), 16);
        assert_eq!(&b[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&b[4..8], &EIO.to_be_bytes());
        b.clear();
        encode_offset_data_header(&mut b, 1, 4096, 512, true);
        assert_eq!(b.len(), 28);
        assert_eq!(&b[16..20], &520u32.to_be_bytes());
        b.clear();
        encode_error_chunk(&mut b, 1, EINVAL, "bad", Some(9), true);
        assert_eq!(b.len(), 20 + 6 + 3 + 8);
        b.clear();
        encode_block_status(
            &mut b,
            1,
            1,
            &[(4096, 0), (8192, STATE_HOLE | STATE_ZERO)],
            true,
        );
        assert_eq!(b.len(), 20 + 4 + 16);
    }

    proptest! {
        #[test]
        fn request_roundtrip(flags: u16, cmd: u16, cookie: u64, offset: u64, length: u32) {
            let r = Request { flags, command: Command::from_u16(cmd), cookie, offset, length };
            let mut b = Vec::new();
            encode_request(&mut b, &r);
            prop_assert_eq!(decode_request(&b), Ok(Some(r)));
        }

        #[test]
        fn validate_never_panics(flags: u16, cmd: u16, offset: u64, length: u32, ro: bool, st: bool) {
            let mut e = ExportInfo::simple("e", 1 << 30);
            e.read_only = ro;
            let r = Request { flags, command: Command::from_u16(cmd), cookie: 0, offset, length };
            if validate(&r, &e, &neg(st, st)).is_ok() && cmd <= CMD_BLOCK_STATUS && cmd != CMD_FLUSH && cmd != CMD_DISC {
                prop_assert!(offset + u64::from(length) <= e.size);
            }
        }
    }
}
