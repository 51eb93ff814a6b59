//! Tests of a request slot's pieces, iovecs and reply framing.

use super::*;

/// A WRITE whose pieces fill plain vectors standing in for pool buffers.
fn write_with_pieces(segs: &mut [Vec<u8>], buf_size: u32) -> Req {
    let mut r = Req {
        len: segs.iter().map(|s| s.len() as u32).sum(),
        command: Command::Write,
        ..Default::default()
    };
    r.plan_pieces(buf_size);
    for (k, s) in segs.iter_mut().enumerate() {
        r.iov[k] = libc::iovec {
            iov_base: s.as_mut_ptr().cast(),
            iov_len: s.len(),
        };
        r.pieces[k].state = PieceState::Filling;
    }
    r
}

#[test]
fn fill_stops_at_piece_end() {
    let mut segs = vec![vec![0u8; 4], vec![0u8; 4], vec![0u8; 2]];
    let mut r = write_with_pieces(&mut segs, 4);
    assert_eq!(r.fill_from(&[1, 2, 3], 4), 3);
    assert_eq!(r.fill_from(&[4, 5, 6, 7, 8], 4), 1);
    assert_eq!(r.fill_from(&[5, 6, 7, 8, 9], 4), 4);
    r.pieces[2].state = PieceState::NeedBuffer;
    assert_eq!(r.fill_from(&[9], 4), 0, "the last piece has no buffer yet");
    r.pieces[2].state = PieceState::Filling;
    assert_eq!(r.fill_from(&[9, 10, 11], 4), 2);
    assert_eq!(r.filled, 10);
    r.pieces.clear();
    drop(r);
    assert_eq!(segs, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9, 10]]);
}

#[test]
fn piece_io_covers_its_range() {
    let mut segs = vec![vec![0u8; 8], vec![0u8; 3]];
    let mut r = write_with_pieces(&mut segs, 8);
    r.offset = 100;
    let io = r.io_request(IoOp::Write { fua: true }, Some(1), 8);
    assert_eq!((io.offset, io.len, io.iovcnt), (108, 3, 1));
    assert_eq!(r.payload_target(8).map(|t| t.1), Some(8));
    r.pieces.clear();
}

#[test]
fn partial_send_skips_sent_bytes() {
    let mut segs = [vec![7u8; 8], vec![9u8; 8]];
    let mut r = Req {
        len: 16,
        command: Command::Read,
        cookie: 42,
        ..Default::default()
    };
    for s in segs.iter_mut() {
        r.iov.push(libc::iovec {
            iov_base: s.as_mut_ptr().cast(),
            iov_len: s.len(),
        });
    }
    r.encode_reply();
    assert!(r.data_reply);
    assert_eq!(r.reply_len(4096), 16 + 16);
    let mut iov = Vec::new();
    assert!(r.push_reply_iov(&mut iov, 20, 8));
    let lens: Vec<usize> = iov.iter().map(|v| v.iov_len).collect();
    assert_eq!(lens, vec![4, 8]);
}

/// A reply nothing of which was sent yet is every non-empty segment whole,
/// as `push_skipping` gives with no skip: header, data, trailer.
#[test]
fn an_unsent_reply_is_its_non_empty_segments() {
    let mut segs = [vec![7u8; 8], Vec::new(), vec![9u8; 8]];
    for trailer in [Vec::new(), vec![1u8, 2, 3, 4]] {
        let mut r = Req {
            len: 16,
            command: Command::Read,
            ..Default::default()
        };
        for s in segs.iter_mut() {
            r.iov.push(libc::iovec {
                iov_base: s.as_mut_ptr().cast(),
                iov_len: s.len(),
            });
        }
        r.hdr.extend_from_slice(&[0u8; 24]);
        r.data_reply_with(None);
        r.trailer = trailer;
        let mut got = vec![libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 1,
        }];
        assert!(r.push_reply_iov(&mut got, 0, 4096));
        let mut want = got[..1].to_vec();
        let hdr = libc::iovec {
            iov_base: r.hdr.as_ptr() as *mut libc::c_void,
            iov_len: r.hdr.len(),
        };
        let tr = libc::iovec {
            iov_base: r.trailer.as_ptr() as *mut libc::c_void,
            iov_len: r.trailer.len(),
        };
        let all = std::iter::once(&hdr).chain(&r.iov).chain(Some(&tr));
        crate::engine::framing::push_skipping(&mut want, all, 0);
        let pairs = |v: &[libc::iovec]| -> Vec<(usize, usize)> {
            v.iter().map(|v| (v.iov_base as usize, v.iov_len)).collect()
        };
        assert_eq!(pairs(&got), pairs(&want));
        // The entry before it, the header, two data segments, the trailer if any.
        assert_eq!(got.len(), 4 + usize::from(!r.trailer.is_empty()));
    }
}

#[test]
fn a_large_write_reply_is_one_iovec() {
    let mut r = Req {
        len: 1 << 20,
        command: Command::Write,
        ..Default::default()
    };
    r.plan_pieces(1024);
    r.encode_reply();
    assert_eq!(r.reply_iov_len(), 1, "not its 1024 piece iovecs");
    let mut iov = Vec::new();
    assert!(r.push_reply_iov(&mut iov, 0, 1024));
    assert_eq!(iov.len(), 1);
    r.pieces.clear();
}

#[test]
fn structured_read_error_has_no_data() {
    let mut r = Req {
        command: Command::Read,
        style: ReplyStyle::Structured,
        len: 4096,
        error: proto::EIO,
        ..Default::default()
    };
    r.encode_reply();
    assert!(!r.data_reply);
    assert_eq!(r.reply_len(4096), r.hdr.len());
    let typ = |hdr: &[u8]| u16::from_be_bytes([hdr[6], hdr[7]]);
    assert_eq!(typ(&r.hdr), proto::REPLY_TYPE_ERROR_OFFSET);
}

#[test]
fn a_failed_zero_length_read_has_no_error_offset() {
    // Nothing to point into: a zero-length READ past the end (EINVAL).
    for style in [ReplyStyle::Structured, ReplyStyle::Extended] {
        let mut r = Req {
            command: Command::Read,
            style,
            offset: 1 << 20,
            error: proto::EINVAL,
            ..Default::default()
        };
        r.encode_reply();
        let typ = u16::from_be_bytes([r.hdr[6], r.hdr[7]]);
        assert_eq!(typ, proto::REPLY_TYPE_ERROR, "{style:?}");
    }
}

#[test]
fn a_chunk_header_is_as_long_as_proto_encodes_it() {
    for framing in [
        proto::Framing::Structured,
        proto::Framing::Extended { request_offset: 0 },
    ] {
        let mut out = Vec::new();
        proto::encode_offset_data_header(&mut out, framing, 1, 0, 4096, false);
        assert_eq!(out.len(), data_chunk_hdr_len(framing));
    }
}
