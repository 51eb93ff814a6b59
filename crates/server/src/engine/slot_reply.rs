//! A request slot's reply as iovecs: the header, the data (whole, or a
//! streamed READ's pieces read so far, chunked or not) and the trailer.

use super::Req;
use crate::engine::framing::push_skipping;
use crate::engine::states::PieceState;

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
        push_skipping(out, lead.into_iter().chain(data), skip);
        first as usize + ready == self.pieces.len()
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
