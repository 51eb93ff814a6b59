//! A request slot: everything one NBD command needs from header to reply.
//! Slots are preallocated per engine and reused, so their vectors keep their
//! capacity and the hot path does not allocate.

use bdev::{IoOp, IoRequest};
use pace::Nanos;
use pool::BufId;
use proto::Command;

use super::framing::{data_chunk_hdr_len, ReplyStyle, ReqOrigin};
use super::ids::{ConnId, Part};
use super::states::{Piece, PieceState, ReqStage};

#[path = "slot_reply.rs"]
mod reply;

pub struct Req {
    conn: ConnId,
    export: u16,
    cookie: u64,
    command: Command,
    flags: u16,
    offset: u64,
    /// Bytes of the IO: a READ's or WRITE's whole length; for TRIM,
    /// WRITE_ZEROES and CACHE the piece at the device (see `span`).
    len: u32,
    /// The request's whole length as the client sent it (64 bits with
    /// extended headers). TRIM, WRITE_ZEROES and CACHE longer than a device
    /// takes go to it in pieces of at most [`proto::MAX_EFFECT_LEN`], one
    /// after the other; `done` bytes of them are finished.
    span: u64,
    done: u64,
    /// NBD errno of the reply, 0 for success.
    error: u32,
    state: ReqStage,
    style: ReplyStyle,
    /// A READ's buffers.
    bufs: Vec<BufId>,
    /// Data segments: a READ's across `bufs`, a WRITE's one per piece.
    iov: Vec<libc::iovec>,
    /// A WRITE's data that came in its command (NVMe/TCP in-capsule
    /// data), when `iov` points at it (`lend_payload`).
    payload: Vec<u8>,
    /// A WRITE's pieces (empty for other commands).
    pieces: Vec<Piece>,
    /// Reply header bytes (and the whole reply when it carries no data).
    hdr: Vec<u8>,
    /// Reply bytes after the data (NVMe/TCP: a data digest, the completion).
    trailer: Vec<u8>,
    /// Byte ranges still to go to the device after this one (an NVMe
    /// Dataset Management's), last first.
    ranges: Vec<(u64, u64)>,
    /// The reply's NVMe status when the front end, not the device, decided
    /// it (a data digest failed).
    fault: Option<proto::nvme::Status>,
    /// WRITE payload bytes received so far.
    filled: u32,
    /// Pieces started (the next one to start is `started`).
    started: u32,
    /// Pieces started and not yet done.
    pieces_live: u32,
    /// A streamed READ's pieces whose data has wholly left (in order).
    sent_pieces: u32,
    /// Pieces in a streamed READ's reply: all, or up to the first failed
    /// one, whose error chunk ends a chunked reply.
    stream_end: u32,
    /// A chunked streamed READ's chunk header per piece (see `chunked`).
    chunk_hdrs: Vec<Vec<u8>>,
    t_start: Nanos,
    t_submit: Nanos,
    /// A READ that went through the pacer: it leaves it when its reply is sent.
    paced: bool,
    /// The reply carries `len` bytes of data after the header.
    data_reply: bool,
}

impl Default for Req {
    fn default() -> Self {
        Req {
            conn: ConnId { index: 0, gen: 0 },
            export: 0,
            cookie: 0,
            command: Command::Flush,
            flags: 0,
            offset: 0,
            len: 0,
            span: 0,
            done: 0,
            error: 0,
            state: ReqStage::Free,
            style: ReplyStyle::Simple,
            bufs: Vec::new(),
            iov: Vec::new(),
            payload: Vec::new(),
            pieces: Vec::new(),
            hdr: Vec::with_capacity(64),
            trailer: Vec::new(),
            ranges: Vec::new(),
            fault: None,
            filled: 0,
            started: 0,
            pieces_live: 0,
            sent_pieces: 0,
            stream_end: 0,
            chunk_hdrs: Vec::new(),
            t_start: 0,
            t_submit: 0,
            paced: false,
            data_reply: false,
        }
    }
}

/// What the engine's other parts read of a request slot, and the changes
/// they make to it as its IOs, pieces and reply move on.
impl Req {
    readers!(
        conn: ConnId, export: u16, cookie: u64, command: Command, flags: u16,
        offset: u64, len: u32, span: u64, error: u32, state: ReqStage,
        style: ReplyStyle, fault: Option<proto::nvme::Status>, filled: u32,
        started: u32, pieces_live: u32, sent_pieces: u32, stream_end: u32,
        t_start: Nanos, t_submit: Nanos, paced: bool;
        bufs: [BufId], iov: [libc::iovec], pieces: [Piece]
    );

    /// Moves the slot to `to` (`Slots::set_state` checks the arrow).
    pub fn enter(&mut self, to: ReqStage) {
        self.state = to;
    }

    /// The reply's NBD errno.
    pub fn set_error(&mut self, errno: u32) {
        self.error = errno;
    }

    /// The device failed an IO of it (piece `piece`, or the whole): the
    /// reply's error is the first one seen.
    pub fn io_failed(&mut self, piece: Option<u32>, errno: u32) {
        if self.error == 0 {
            self.error = errno;
        }
        if let Some(k) = piece {
            self.pieces[k as usize].error = errno;
        }
    }

    /// The front end, not the device, decides the reply's NVMe status.
    pub fn set_fault(&mut self, status: proto::nvme::Status) {
        self.fault = Some(status);
    }

    pub fn set_ranges(&mut self, ranges: Vec<(u64, u64)>) {
        self.ranges = ranges;
    }

    /// `n` more payload bytes arrived.
    pub fn payload_in(&mut self, n: u32) {
        self.filled += n;
    }

    /// The whole payload, `n` bytes, arrived with the command.
    pub fn set_filled(&mut self, n: u32) {
        self.filled = n;
    }

    /// The next piece starts.
    pub fn piece_started(&mut self) {
        self.started += 1;
        self.pieces_live += 1;
    }

    /// A started piece is done.
    pub fn piece_ended(&mut self) {
        debug_assert!(self.pieces_live > 0);
        self.pieces_live -= 1;
    }

    pub fn piece_mut(&mut self, k: u32) -> &mut Piece {
        &mut self.pieces[k as usize]
    }

    /// Piece `k` holds `buf`, whose `len` bytes at `base` are its data.
    pub fn piece_buffer(&mut self, k: u32, buf: BufId, base: *mut u8, len: u32) {
        self.pieces[k as usize].buf = Some(buf);
        self.iov[k as usize] = libc::iovec {
            iov_base: base.cast(),
            iov_len: len as usize,
        };
    }

    /// A streamed READ's reply ends after piece `k` (it failed).
    pub fn end_stream_at(&mut self, k: u32) {
        self.stream_end = self.stream_end.min(k + 1);
    }

    /// A streamed READ's next piece has wholly left.
    pub fn piece_sent(&mut self) {
        self.sent_pieces += 1;
    }

    /// It goes through the pacer.
    pub fn set_paced(&mut self) {
        self.paced = true;
    }

    /// It went to the device at `now`.
    pub fn submitted(&mut self, now: Nanos) {
        self.t_submit = now;
    }

    /// Its READ buffers went back to the pool.
    pub fn clear_bufs(&mut self) {
        self.bufs.clear();
    }

    /// A READ IO (`part` of it) sends `data`, a bdev's own memory, instead
    /// of its buffer; false when the lengths do not match.
    pub fn lend(&mut self, part: Part, data: libc::iovec) -> bool {
        match part {
            Part::Whole if !self.streamed() && data.iov_len == self.len as usize => {
                self.iov.clear();
                self.iov.push(data);
                true
            }
            Part::Piece(k) => match self.iov.get_mut(k as usize) {
                Some(seg) if seg.iov_len == data.iov_len => {
                    *seg = data;
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// A one-piece WRITE whose data came whole in its command goes to the
    /// device from `data`, not copied into its buffer first (which it
    /// keeps, as a lent READ does, so the pool's books do not change);
    /// `data` back when it cannot.
    pub fn lend_payload(&mut self, data: Vec<u8>) -> Result<(), Vec<u8>> {
        if self.command != Command::Write || self.iov.len() != 1 || data.len() != self.len as usize
        {
            return Err(data);
        }
        self.iov[0] = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        self.payload = data;
        self.filled = self.len;
        Ok(())
    }

    /// Empties the reply's header and trailer for the front end to encode.
    pub fn clear_reply(&mut self) {
        self.hdr.clear();
        self.trailer.clear();
    }

    pub fn hdr_mut(&mut self) -> &mut Vec<u8> {
        &mut self.hdr
    }

    /// The reply carries the data, with this data digest after it if any.
    pub fn data_reply_with(&mut self, digest: Option<u32>) {
        self.data_reply = true;
        if let Some(crc) = digest {
            self.trailer.extend_from_slice(&crc.to_le_bytes());
        }
    }

    pub fn reset(&mut self, origin: &ReqOrigin, request: &proto::Request, now: Nanos) {
        debug_assert_eq!(self.state, ReqStage::Free, "slot reused while live");
        debug_assert!(self.bufs.is_empty() && self.pieces.is_empty());
        self.conn = origin.conn;
        self.export = origin.export;
        self.style = origin.style;
        self.cookie = request.cookie;
        self.command = request.command;
        self.flags = request.flags;
        self.offset = request.offset;
        // Validation bounds READs and WRITEs by the maximum payload; a
        // BLOCK_STATUS may ask about more than devices take, and is answered
        // for less, as the spec allows; TRIM, WRITE_ZEROES and CACHE go to
        // the device piece by piece (`next_piece`).
        self.len = request.length.min(proto::MAX_EFFECT_LEN) as u32;
        self.span = request.length;
        self.done = 0;
        self.error = 0;
        self.filled = 0;
        self.started = 0;
        self.pieces_live = 0;
        self.sent_pieces = 0;
        self.t_start = now;
        self.t_submit = now;
        self.paced = false;
        self.data_reply = false;
        self.iov.clear();
        self.hdr.clear();
        self.trailer.clear();
        self.ranges.clear();
        self.fault = None;
        self.state = ReqStage::New;
    }

    /// Empties the slot; the caller has returned every buffer.
    pub fn clear(&mut self) {
        debug_assert!(self.bufs.is_empty(), "slot freed holding buffers");
        debug_assert!(
            self.pieces.iter().all(|p| p.buf.is_none()),
            "slot freed holding payload buffers"
        );
        self.iov.clear();
        // Only now: the device may read it until the IO is over.
        self.payload = Vec::new();
        self.pieces.clear();
        self.hdr.clear();
        self.state = ReqStage::Free;
        self.paced = false;
        self.data_reply = false;
    }

    /// What the statistics count of this request once its reply has left.
    pub fn served(&self) -> crate::stats::Served {
        crate::stats::Served {
            command: self.command,
            export: self.export,
            error: self.error,
            len: self.len,
            started: self.t_start,
        }
    }

    pub fn fua(&self) -> bool {
        self.flags & proto::CMD_FLAG_FUA != 0
    }

    /// Takes ownership of a READ's granted `bufs` and lays `len` bytes
    /// across them.
    pub fn attach_buffers(
        &mut self,
        bufs: Vec<BufId>,
        buf_size: u32,
        ptr: impl Fn(BufId) -> *mut u8,
    ) {
        self.bufs = bufs;
        self.lay_out_buffers(buf_size, ptr);
    }

    /// The empty vector a READ's buffers are allocated into
    /// (`ReactorBufs::alloc_into`): kept with its capacity between requests,
    /// so taking buffers allocates nothing.
    pub fn bufs_mut(&mut self) -> &mut Vec<BufId> {
        debug_assert!(self.bufs.is_empty(), "buffers taken twice");
        &mut self.bufs
    }

    /// Lays `len` bytes across the buffers the READ holds.
    pub fn lay_out_buffers(&mut self, buf_size: u32, ptr: impl Fn(BufId) -> *mut u8) {
        let mut left = self.len as usize;
        self.iov.clear();
        for &id in &self.bufs {
            let n = left.min(buf_size as usize);
            self.iov.push(libc::iovec {
                iov_base: ptr(id).cast(),
                iov_len: n,
            });
            left -= n;
        }
    }

    /// A READ served piece by piece.
    pub fn streamed(&self) -> bool {
        self.command == Command::Read && !self.pieces.is_empty()
    }

    /// Lays out a WRITE's or streamed READ's pieces, none started. `iov` gets its final length
    /// now, so the iovecs handed to the device never move.
    pub fn plan_pieces(&mut self, buf_size: u32) {
        let n = self.len.div_ceil(buf_size) as usize;
        self.pieces.clear();
        self.pieces.resize(
            n,
            Piece {
                state: PieceState::Idle,
                buf: None,
                t_submit: 0,
                error: 0,
            },
        );
        self.stream_end = n as u32;
        self.iov.clear();
        self.iov.resize(
            n,
            libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
        );
    }

    /// Payload bytes of piece `k`.
    pub fn piece_len(&self, k: u32, buf_size: u32) -> u32 {
        let start = k * buf_size;
        (self.len - start).min(buf_size)
    }

    /// The piece the next payload byte belongs to.
    pub fn filling_piece(&self, buf_size: u32) -> u32 {
        self.filled / buf_size
    }

    /// Where the next payload bytes go: the rest of the filling piece, if
    /// that piece holds its buffer.
    pub fn payload_target(&self, buf_size: u32) -> Option<(*mut u8, usize)> {
        let k = self.filling_piece(buf_size);
        let piece = self.pieces.get(k as usize)?;
        if piece.state != PieceState::Filling {
            return None;
        }
        let seg = self.iov[k as usize];
        let off = (self.filled - k * buf_size) as usize;
        debug_assert!(off < seg.iov_len);
        // SAFETY: off < iov_len keeps the pointer inside the piece's buffer.
        let p = unsafe { seg.iov_base.cast::<u8>().add(off) };
        Some((p, seg.iov_len - off))
    }

    /// Byte `at` of the request's data in its buffers (`iov`), and the room
    /// from there to the end of that buffer; None past its data.
    pub fn data_at(&self, at: u32) -> Option<(*mut u8, usize)> {
        let mut at = at as usize;
        for seg in &self.iov {
            if at < seg.iov_len {
                // SAFETY: at < iov_len keeps the pointer inside the buffer.
                let p = unsafe { seg.iov_base.cast::<u8>().add(at) };
                return Some((p, seg.iov_len - at));
            }
            at -= seg.iov_len;
        }
        None
    }

    /// Copies received payload bytes into the filling piece; returns how many
    /// it took (0 when that piece has no buffer yet).
    pub fn fill_from(&mut self, src: &[u8], buf_size: u32) -> usize {
        let Some((dst, room)) = self.payload_target(buf_size) else {
            return 0;
        };
        let n = src.len().min(room);
        // SAFETY: dst points at `room` writable bytes of a buffer this
        // request owns, and n <= room.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, n) };
        self.filled += n as u32;
        n
    }

    /// The device IO for the whole request, or for one WRITE piece.
    pub fn io_request(&self, op: IoOp, piece: Option<u32>, buf_size: u32) -> IoRequest {
        match piece {
            None => IoRequest {
                op,
                // A piece of a TRIM, WRITE_ZEROES or CACHE starts where the
                // pieces before it ended (`done` is 0 for everything else).
                offset: self.offset + self.done,
                len: self.len,
                iov: self.iov.as_ptr(),
                iovcnt: self.iov.len() as u32,
            },
            Some(k) => IoRequest {
                op,
                offset: self.offset + u64::from(k) * u64::from(buf_size),
                len: self.piece_len(k, buf_size),
                // The piece's one iovec; `iov` never grows while pieces live.
                iov: &self.iov[k as usize],
                iovcnt: 1,
            },
        }
    }

    /// Moves a TRIM, WRITE_ZEROES or CACHE longer than one device IO on to
    /// its next piece: true if there is one, false when the piece just
    /// done was its last (or the command is not split).
    pub fn next_piece(&mut self) -> bool {
        if !matches!(
            self.command,
            Command::Trim | Command::WriteZeroes | Command::Cache
        ) {
            return false;
        }
        let done = self.done + u64::from(self.len);
        debug_assert!(done <= self.span, "pieces past the request's end");
        if done >= self.span {
            // The next range, if the command has several.
            let Some((offset, span)) = self.ranges.pop() else {
                return false;
            };
            self.offset = offset;
            self.span = span;
            self.done = 0;
            self.len = span.min(proto::MAX_EFFECT_LEN) as u32;
            return true;
        }
        self.done = done;
        self.len = (self.span - done).min(proto::MAX_EFFECT_LEN) as u32;
        debug_assert!(self.len > 0);
        true
    }

    /// The device operation of this command; None for those answered
    /// without the device.
    pub fn io_op(&self) -> Option<IoOp> {
        let flag = |f: u16| self.flags & f != 0;
        Some(match self.command {
            Command::Read => IoOp::Read,
            Command::Write => IoOp::Write { fua: self.fua() },
            Command::Flush => IoOp::Flush,
            Command::Trim => IoOp::Trim { fua: self.fua() },
            Command::WriteZeroes => IoOp::WriteZeroes {
                may_trim: !flag(proto::CMD_FLAG_NO_HOLE),
                fua: self.fua(),
                fast: flag(proto::CMD_FLAG_FAST_ZERO),
            },
            Command::Cache => IoOp::Cache,
            Command::BlockStatus | Command::Disc | Command::Unknown(_) => return None,
        })
    }

    /// Encodes a BLOCK_STATUS reply as the whole response: one chunk of
    /// extents per metadata context `(id, extents)`, the last one done.
    pub fn block_status(&mut self, chunks: &[(u32, Vec<(u32, u32)>)]) {
        self.hdr.clear();
        let framing = self.framing().unwrap_or(proto::Framing::Structured);
        for (k, (context, extents)) in chunks.iter().enumerate() {
            let done = k + 1 == chunks.len();
            proto::encode_block_status(
                &mut self.hdr,
                framing,
                self.cookie,
                *context,
                extents,
                done,
            );
        }
    }

    /// The chunk framing of this reply; None for a simple reply.
    fn framing(&self) -> Option<proto::Framing> {
        match self.style {
            ReplyStyle::Simple | ReplyStyle::Nvme => None,
            // Structured replies are for READs; the rest may stay simple.
            ReplyStyle::Structured if self.command == Command::Read => {
                Some(proto::Framing::Structured)
            }
            ReplyStyle::Structured => None,
            ReplyStyle::Extended => Some(proto::Framing::Extended {
                request_offset: self.offset,
            }),
        }
    }

    /// Encodes the reply header, unless one was already encoded.
    pub fn encode_reply(&mut self) {
        if !self.hdr.is_empty() {
            return;
        }
        if self.chunked() {
            // Each piece's chunk carries its own header (`encode_piece_chunk`).
            self.data_reply = true;
            return;
        }
        let is_read = self.command == Command::Read;
        let (cookie, error) = (self.cookie, self.error);
        let Some(framing) = self.framing() else {
            proto::encode_simple_reply(&mut self.hdr, cookie, error);
            self.data_reply = is_read && error == 0 && self.len > 0;
            return;
        };
        if self.streamed() {
            // Unfragmented (DF): one data chunk, whatever its pieces do.
            self.encode_unfragmented(framing);
            return;
        }
        if error != 0 {
            // ERROR_OFFSET's offset must lie within the requested range; a
            // zero-length READ has none (libnbd hangs up on such a reply).
            let at = (is_read && self.len > 0).then_some(self.offset);
            proto::encode_error_chunk(&mut self.hdr, framing, cookie, error, "", at, true);
        } else if is_read && self.len > 0 {
            let (offset, len) = (self.offset, self.len);
            proto::encode_offset_data_header(&mut self.hdr, framing, cookie, offset, len, true);
            self.data_reply = true;
        } else {
            proto::encode_done(&mut self.hdr, framing, cookie);
        }
    }

    /// Bytes of a streamed READ's reply up to the end of piece `k`'s data:
    /// the header, then the pieces in order.
    pub fn piece_end(&self, k: u32, buf_size: u32) -> usize {
        let data_end = |k: u32| (u64::from(k) * u64::from(buf_size)).min(u64::from(self.len));
        let Some(framing) = self.framing().filter(|_| self.chunked()) else {
            return self.hdr.len() + data_end(k + 1) as usize;
        };
        let hdrs = u64::from(k) * data_chunk_hdr_len(framing) as u64;
        match self.pieces[k as usize].error {
            0 => (hdrs + data_chunk_hdr_len(framing) as u64 + data_end(k + 1)) as usize,
            _ => (hdrs + data_end(k)) as usize + self.chunk_hdrs[k as usize].len(),
        }
    }

    /// A streamed READ answered in chunks, one per piece, so that a piece
    /// the device fails ends the reply with its error (structured replies
    /// and extended headers); with simple replies the header promised all
    /// the data, and with NBD_CMD_FLAG_DF the client wants one data chunk.
    pub fn chunked(&self) -> bool {
        self.streamed() && self.framing().is_some() && !self.unfragmented()
    }

    /// Encodes piece `k`'s chunk header: its data, or the error that ends
    /// the reply when the device failed it.
    pub fn encode_piece_chunk(&mut self, k: u32, buf_size: u32) {
        let Some(framing) = self.framing() else {
            return;
        };
        if self.chunk_hdrs.len() < self.pieces.len() {
            self.chunk_hdrs.resize(self.pieces.len(), Vec::new());
        }
        let offset = self.offset + u64::from(k) * u64::from(buf_size);
        let (len, error) = (self.piece_len(k, buf_size), self.pieces[k as usize].error);
        let (cookie, last) = (self.cookie, k as usize + 1 == self.pieces.len());
        let out = &mut self.chunk_hdrs[k as usize];
        out.clear();
        if error != 0 {
            proto::encode_error_chunk(out, framing, cookie, error, "", Some(offset), true);
        } else {
            proto::encode_offset_data_header(out, framing, cookie, offset, len, last);
        }
    }

    /// Whether this READ, being released, still counts as pending on its
    /// connection: started, and its data not yet queued (a stream's: not
    /// yet all sent).
    pub fn read_pending(&self) -> bool {
        match self.state {
            ReqStage::Deferred => false,
            _ if self.streamed() => true,
            ReqStage::Reply | ReqStage::Sent => false,
            _ => self.paced && self.command == Command::Read,
        }
    }
}

#[cfg(test)]
#[path = "slot_tests.rs"]
mod tests;
