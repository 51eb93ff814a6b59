//! A request slot: everything one NBD command needs from header to reply.
//! Slots are preallocated per reactor and reused, so their vectors keep their
//! capacity and the hot path does not allocate.

use bdev::{IoOp, IoRequest};
use pace::pool::{BufId, SharedPool};
use pace::stats::ReqState;
use pace::Nanos;
use proto::Command;

pub struct Req {
    pub conn: u32,
    pub conn_gen: u32,
    pub export: u16,
    pub cookie: u64,
    pub command: Command,
    pub flags: u16,
    pub offset: u64,
    pub len: u32,
    /// NBD errno of the reply, 0 for success.
    pub error: u32,
    pub state: ReqState,
    pub structured: bool,
    pub meta_context: u32,
    pub bufs: Vec<BufId>,
    /// Data segments covering exactly `len` bytes of `bufs`.
    pub iov: Vec<libc::iovec>,
    /// Reply header bytes (and the whole reply when it carries no data).
    pub hdr: Vec<u8>,
    /// WRITE payload bytes received so far.
    pub filled: u32,
    pub t_start: Nanos,
    pub t_submit: Nanos,
    pub op: Option<IoOp>,
    /// Went through the pacer and has not yet told it it is done.
    pub paced: bool,
    /// Error from an earlier SQE of a linked chain.
    pub chain_error: Option<bdev::IoResult>,
    /// The reply carries `len` bytes of data after the header.
    pub data_reply: bool,
}

impl Default for Req {
    fn default() -> Self {
        Req {
            conn: 0,
            conn_gen: 0,
            export: 0,
            cookie: 0,
            command: Command::Flush,
            flags: 0,
            offset: 0,
            len: 0,
            error: 0,
            state: ReqState::Done,
            structured: false,
            meta_context: 0,
            bufs: Vec::new(),
            iov: Vec::new(),
            hdr: Vec::with_capacity(64),
            filled: 0,
            t_start: 0,
            t_submit: 0,
            op: None,
            chain_error: None,
            paced: false,
            data_reply: false,
        }
    }
}

impl Req {
    #[allow(clippy::too_many_arguments)]
    pub fn reset(
        &mut self,
        conn: u32,
        conn_gen: u32,
        export: u16,
        request: &proto::Request,
        now: Nanos,
        structured: bool,
        meta_context: u32,
    ) {
        self.conn = conn;
        self.conn_gen = conn_gen;
        self.export = export;
        self.cookie = request.cookie;
        self.command = request.command;
        self.flags = request.flags;
        self.offset = request.offset;
        self.len = request.length;
        self.error = 0;
        self.state = ReqState::New;
        self.structured = structured;
        self.meta_context = meta_context;
        self.filled = 0;
        self.t_start = now;
        self.t_submit = now;
        self.op = None;
        self.data_reply = false;
        self.paced = false;
        self.bufs.clear();
        self.iov.clear();
        self.hdr.clear();
    }

    pub fn clear(&mut self) {
        self.bufs.clear();
        self.iov.clear();
        self.hdr.clear();
        self.op = None;
        self.state = ReqState::Done;
        self.filled = 0;
        self.data_reply = false;
    }

    /// Takes ownership of `bufs` and lays `len` bytes of data across them.
    pub fn attach_buffers(&mut self, bufs: Vec<BufId>, pool: &SharedPool) {
        let size = pool.buffer_size() as usize;
        let mut left = self.len as usize;
        self.iov.clear();
        for &id in &bufs {
            let n = left.min(size);
            self.iov.push(libc::iovec {
                iov_base: pool.ptr(id).cast(),
                iov_len: n,
            });
            left -= n;
        }
        self.bufs = bufs;
    }

    /// Where the rest of a WRITE payload can be received directly: the rest
    /// of the current segment, if at least `min` payload bytes remain.
    pub fn payload_target(&self, min: u32) -> Option<(*mut u8, usize)> {
        if self.len - self.filled < min {
            return None;
        }
        let mut off = self.filled as usize;
        for seg in &self.iov {
            if off < seg.iov_len {
                // SAFETY: off < iov_len keeps the pointer inside the segment.
                let p = unsafe { seg.iov_base.cast::<u8>().add(off) };
                return Some((p, seg.iov_len - off));
            }
            off -= seg.iov_len;
        }
        None
    }

    /// Appends received payload bytes at the fill position.
    pub fn fill_from(&mut self, mut src: &[u8]) {
        let mut off = self.filled as usize;
        for seg in &self.iov {
            if src.is_empty() {
                break;
            }
            if off >= seg.iov_len {
                off -= seg.iov_len;
                continue;
            }
            let n = src.len().min(seg.iov_len - off);
            // SAFETY: the segment is a pool buffer this request owns, and
            // off + n <= iov_len.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), seg.iov_base.cast::<u8>().add(off), n);
            }
            self.filled += n as u32;
            src = &src[n..];
            off = 0;
        }
    }

    pub fn io_request(&self, op: IoOp) -> IoRequest {
        IoRequest {
            op,
            offset: self.offset,
            len: self.len,
            iov: self.iov.as_ptr(),
            iovcnt: self.iov.len() as u32,
        }
    }

    /// Encodes a BLOCK_STATUS reply as the whole response.
    pub fn block_status(&mut self, extents: &[(u32, u32)]) {
        self.hdr.clear();
        proto::encode_block_status(&mut self.hdr, self.cookie, self.meta_context, extents, true);
    }

    /// Encodes the reply header, unless one was already encoded.
    pub fn encode_reply(&mut self) {
        if !self.hdr.is_empty() {
            return;
        }
        let is_read = self.command == Command::Read;
        if self.structured && is_read {
            if self.error != 0 {
                proto::encode_error_chunk(
                    &mut self.hdr,
                    self.cookie,
                    self.error,
                    "",
                    Some(self.offset),
                    true,
                );
            } else if self.len == 0 {
                proto::encode_done(&mut self.hdr, self.cookie);
            } else {
                proto::encode_offset_data_header(
                    &mut self.hdr,
                    self.cookie,
                    self.offset,
                    self.len,
                    true,
                );
                self.data_reply = true;
            }
        } else {
            proto::encode_simple_reply(&mut self.hdr, self.cookie, self.error);
            self.data_reply = is_read && self.error == 0 && self.len > 0;
        }
    }

    pub fn reply_len(&self) -> usize {
        self.hdr.len()
            + if self.data_reply {
                self.len as usize
            } else {
                0
            }
    }

    /// Adds this reply's iovecs, leaving out its first `skip` bytes (already sent).
    pub fn push_reply_iov(&self, out: &mut Vec<libc::iovec>, mut skip: usize) {
        let hdr = libc::iovec {
            iov_base: self.hdr.as_ptr() as *mut libc::c_void,
            iov_len: self.hdr.len(),
        };
        let data: &[libc::iovec] = if self.data_reply { &self.iov } else { &[] };
        for seg in std::iter::once(&hdr).chain(data) {
            if skip >= seg.iov_len {
                skip -= seg.iov_len;
                continue;
            }
            out.push(libc::iovec {
                // SAFETY: skip < iov_len keeps the pointer inside the segment.
                iov_base: unsafe { seg.iov_base.cast::<u8>().add(skip).cast() },
                iov_len: seg.iov_len - skip,
            });
            skip = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request whose data lives in plain vectors standing in for pool buffers.
    fn req_with_segments(segs: &mut [Vec<u8>]) -> Req {
        let mut r = Req {
            len: segs.iter().map(|s| s.len() as u32).sum(),
            command: Command::Write,
            ..Default::default()
        };
        for s in segs.iter_mut() {
            r.iov.push(libc::iovec {
                iov_base: s.as_mut_ptr().cast(),
                iov_len: s.len(),
            });
        }
        r
    }

    #[test]
    fn fill_spans_segments() {
        let mut segs = vec![vec![0u8; 4], vec![0u8; 4], vec![0u8; 2]];
        let mut r = req_with_segments(&mut segs);
        r.fill_from(&[1, 2, 3]);
        r.fill_from(&[4, 5, 6, 7, 8]);
        r.fill_from(&[9, 10, 11]); // one byte too many is ignored
        assert_eq!(r.filled, 10);
        drop(r);
        assert_eq!(segs, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9, 10]]);
    }

    #[test]
    fn payload_target_points_at_fill_position() {
        let mut segs = vec![vec![0u8; 8], vec![0u8; 8]];
        let base1 = segs[1].as_ptr() as usize;
        let mut r = req_with_segments(&mut segs);
        r.fill_from(&[0; 10]);
        let (p, len) = r.payload_target(4).expect("6 bytes left");
        assert_eq!(p as usize, base1 + 2);
        assert_eq!(len, 6);
        assert!(
            r.payload_target(7).is_none(),
            "below the direct-recv minimum"
        );
    }

    #[test]
    fn partial_send_skips_sent_bytes() {
        let mut segs = vec![vec![7u8; 8], vec![9u8; 8]];
        let mut r = req_with_segments(&mut segs);
        r.command = Command::Read;
        r.cookie = 42;
        r.encode_reply();
        assert!(r.data_reply);
        assert_eq!(r.reply_len(), 16 + 16);
        let mut iov = Vec::new();
        r.push_reply_iov(&mut iov, 20);
        let lens: Vec<usize> = iov.iter().map(|v| v.iov_len).collect();
        assert_eq!(lens, vec![4, 8]);
    }

    #[test]
    fn structured_read_error_has_no_data() {
        let mut r = Req {
            command: Command::Read,
            structured: true,
            len: 4096,
            error: proto::EIO,
            ..Default::default()
        };
        r.encode_reply();
        assert!(!r.data_reply);
        assert_eq!(r.reply_len(), r.hdr.len());
    }
}
