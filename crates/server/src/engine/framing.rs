//! How a request's reply is framed: the style a connection's handshake
//! settled, what a connection tells the slot it hands a request to, and
//! the helpers the request slot (`slot.rs`) lays a chunked reply's
//! iovecs with.

use super::ids::ConnId;

/// How a connection's replies are framed, as its handshake settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStyle {
    /// Simple replies only.
    Simple,
    /// Structured replies: chunks for READs, simple replies for the rest.
    Structured,
    /// Extended headers: every reply is extended chunks.
    Extended,
    /// NVMe/TCP: the front end encodes the reply (`engine/nvme.rs`).
    Nvme,
}

impl ReplyStyle {
    pub fn of(neg: &proto::Negotiated) -> ReplyStyle {
        if neg.extended_headers {
            ReplyStyle::Extended
        } else if neg.structured_replies {
            ReplyStyle::Structured
        } else {
            ReplyStyle::Simple
        }
    }
}

/// What a connection knows about the request it hands to a slot.
pub struct ReqOrigin {
    pub conn: ConnId,
    pub export: u16,
    pub style: ReplyStyle,
}

/// Bytes of an OFFSET_DATA chunk before its data: the chunk header (20
/// bytes, 32 extended) and the offset.
pub(super) fn data_chunk_hdr_len(framing: proto::Framing) -> usize {
    match framing {
        proto::Framing::Structured => 20 + 8,
        proto::Framing::Extended { .. } => 32 + 8,
    }
}

/// Adds `segs` to `out`, leaving out their first `skip` bytes.
pub(super) fn push_skipping<'a>(
    out: &mut Vec<libc::iovec>,
    segs: impl Iterator<Item = &'a libc::iovec>,
    mut skip: usize,
) {
    for seg in segs {
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
