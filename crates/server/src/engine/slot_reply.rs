//! A request slot's reply as iovecs: the header, the data (whole, or a
//! streamed READ's pieces read so far, chunked or not) and the trailer.

use super::Req;
use crate::engine::framing::push_skipping;
use crate::engine::states::PieceState;

/// The largest piece (`[buffers] buffer_size` is at most 16 MiB).
const MAX_PIECE: usize = 16 << 20;

/// What an unfragmented READ sends for a piece the device failed: the
/// spec has the chunk completed with padding that "SHOULD be zero", and
/// the failed buffer may hold another client's data. A read-only anonymous
/// mapping, made on first use: the kernel's zero page backs all of it, so
/// it costs no memory (a static array of zeros put 16 MiB into the binary).
/// None if it cannot be mapped, or `len` is past it.
fn padding(len: usize) -> Option<*mut libc::c_void> {
    static ZEROS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let base = *ZEROS.get_or_init(|| {
        let (prot, flags) = (libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        // SAFETY: a new anonymous mapping, never unmapped, only read.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), MAX_PIECE, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            0
        } else {
            p as usize
        }
    });
    (base != 0 && len <= MAX_PIECE).then_some(base as *mut libc::c_void)
}

impl Req {
    /// Most iovecs [`Req::push_reply_iov`] adds (a WRITE's piece iovecs
    /// are not part of its reply).
    pub fn reply_iov_len(&self) -> usize {
        1 + usize::from(!self.trailer.is_empty())
            + match (self.data_reply, self.streamed()) {
                (false, _) => 0,
                (true, true) => 2 * self.pieces_live as usize,
                (true, false) => self.iov.len(),
            }
    }

    pub fn reply_len(&self, buf_size: u32) -> usize {
        if self.chunked() && self.stream_end > 0 {
            return self.piece_end(self.stream_end - 1, buf_size);
        }
        self.hdr.len()
            + if self.data_reply {
                self.len as usize
            } else {
                0
            }
            + self.trailer.len()
    }

    /// Adds this reply's iovecs, leaving out its first `skip` bytes (already
    /// sent). A streamed READ adds only its pieces read so far, in order:
    /// false when the rest of its reply is still to come.
    pub fn push_reply_iov(&self, out: &mut Vec<libc::iovec>, skip: usize, buf_size: u32) -> bool {
        let hdr = libc::iovec {
            iov_base: self.hdr.as_ptr() as *mut libc::c_void,
            iov_len: self.hdr.len(),
        };
        if !self.streamed() {
            let data: &[libc::iovec] = if self.data_reply { &self.iov } else { &[] };
            let trailer = libc::iovec {
                iov_base: self.trailer.as_ptr() as *mut libc::c_void,
                iov_len: self.trailer.len(),
            };
            if skip == 0 {
                // Nothing of it sent yet (every reply but one a short send
                // cut): what `push_skipping` does with no skip, each
                // segment whole unless empty, without chaining iterators.
                let whole = |out: &mut Vec<libc::iovec>, v: &libc::iovec| {
                    if v.iov_len > 0 {
                        out.push(*v);
                    }
                };
                whole(out, &hdr);
                data.iter().for_each(|v| whole(out, v));
                whole(out, &trailer);
                return true;
            }
            let segs = std::iter::once(&hdr).chain(data).chain(Some(&trailer));
            push_skipping(out, segs, skip);
            return true;
        }
        if self.chunked() {
            return self.push_chunks(out, skip, buf_size);
        }
        // Pieces before `sent_pieces` have left and freed their buffers.
        let first = self.sent_pieces;
        let (lead, skip) = match first {
            0 => (Some(&hdr), skip),
            k => {
                let before = self.piece_end(k - 1, buf_size);
                debug_assert!(skip >= before, "sent pieces were wholly sent");
                (None, skip - before)
            }
        };
        let ready = (first as usize..self.pieces.len())
            .take_while(|&k| self.pieces[k].state == PieceState::Ready)
            .count();
        let data = &self.iov[first as usize..first as usize + ready];
        let whole = first as usize + ready == self.pieces.len();
        // An unfragmented READ's final chunk follows its data.
        let trailer = libc::iovec {
            iov_base: self.trailer.as_ptr() as *mut libc::c_void,
            iov_len: self.trailer.len(),
        };
        let end = whole.then_some(&trailer);
        push_skipping(out, lead.into_iter().chain(data).chain(end), skip);
        whole
    }

    /// The READ asked for one content chunk (NBD_CMD_FLAG_DF).
    pub fn unfragmented(&self) -> bool {
        self.flags & proto::CMD_FLAG_DF != 0
    }

    /// A streamed READ with NBD_CMD_FLAG_DF: the spec wants "at most one
    /// content chunk" whatever its length, so one OFFSET_DATA chunk spans
    /// its pieces. That chunk is not final, as a piece may still fail; the
    /// trailer ends the reply.
    pub(super) fn encode_unfragmented(&mut self, framing: proto::Framing) {
        let (cookie, offset, len) = (self.cookie, self.offset, self.len);
        proto::encode_offset_data_header(&mut self.hdr, framing, cookie, offset, len, false);
        self.data_reply = true;
        self.encode_unfragmented_end(framing);
    }

    /// The chunk that ends an unfragmented READ: its first error, if a
    /// piece failed, else NONE.
    fn encode_unfragmented_end(&mut self, framing: proto::Framing) {
        self.trailer.clear();
        if self.error == 0 {
            proto::encode_done(&mut self.trailer, framing, self.cookie);
        } else {
            let (cookie, error) = (self.cookie, self.error);
            proto::encode_error_chunk(&mut self.trailer, framing, cookie, error, "", None, true);
        }
    }

    /// Piece `k` of an unfragmented streamed READ is ready after the device
    /// failed it or an earlier piece: a failed piece goes out as zeroes and
    /// the reply ends with the error. False when the reply cannot say so
    /// (a simple reply promised all the data: only a close can break that).
    pub fn pad_failed_piece(&mut self, k: u32) -> bool {
        let Some(framing) = self.framing().filter(|_| self.unfragmented()) else {
            return false;
        };
        let seg = &mut self.iov[k as usize];
        if self.pieces[k as usize].error != 0 {
            let Some(zeros) = padding(seg.iov_len) else {
                return false;
            };
            seg.iov_base = zeros;
        }
        self.encode_unfragmented_end(framing);
        true
    }

    /// [`Req::push_reply_iov`] of a chunked streamed READ: each piece read
    /// so far, in order, as its chunk header and (unless failed) its data.
    fn push_chunks(&self, out: &mut Vec<libc::iovec>, skip: usize, buf_size: u32) -> bool {
        let first = self.sent_pieces;
        let before = match first {
            0 => 0,
            k => self.piece_end(k - 1, buf_size),
        };
        debug_assert!(skip >= before, "sent pieces were wholly sent");
        let end = self.stream_end as usize;
        let ready = (first as usize..end)
            .take_while(|&k| self.pieces[k].state == PieceState::Ready)
            .count();
        let hdr = |k: usize| libc::iovec {
            iov_base: self.chunk_hdrs[k].as_ptr() as *mut libc::c_void,
            iov_len: self.chunk_hdrs[k].len(),
        };
        let segs = (first as usize..first as usize + ready).flat_map(|k| {
            let data = (self.pieces[k].error == 0).then_some(self.iov[k]);
            std::iter::once(hdr(k)).chain(data)
        });
        let segs: Vec<libc::iovec> = segs.collect();
        push_skipping(out, segs.iter(), skip - before);
        first as usize + ready == end
    }
}
