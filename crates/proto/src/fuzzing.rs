//! The fuzz harness, in the library so the cargo-fuzz target and the
//! corpus-replay test run the same code.

use std::sync::Arc;

use crate::{
    decode_request, encode_block_status, encode_done, encode_error_chunk,
    encode_offset_data_header, encode_simple_reply, request_header_len, validate, ExportInfo,
    Framing, Handshake, HandshakeStatus, Negotiated,
};

/// Feeds `data` to a handshake in uneven pieces, then decodes and validates
/// requests from what is left, as the target would. Panics only on a broken
/// invariant (which the fuzzer reports as a crash).
pub fn run(data: &[u8]) {
    let mut ro = ExportInfo::simple("ro", 1 << 20);
    ro.read_only = true;
    let exports: Arc<[ExportInfo]> = vec![ExportInfo::simple("default", 1 << 30), ro].into();
    let (neg, pos) = negotiate(data, &exports);
    let export = &exports[neg.export_index];
    let ext = neg.extended_headers;
    let mut out = Vec::new();
    let mut rest = &data[pos..];
    while let Ok(Some(req)) = decode_request(rest, ext) {
        rest = &rest[request_header_len(ext)..];
        let verdict = validate(&req, export, &neg);
        // Anything accepted that addresses data lies inside the export, and
        // a READ or WRITE within the advertised maximum.
        // (FLUSH and DISC address no data: a FLUSH's range must be zero, a
        // DISC's is ignored.)
        let ranged = !matches!(req.command, crate::Command::Flush | crate::Command::Disc);
        if verdict.is_ok() && ranged && req.length > 0 {
            let end = req.offset.checked_add(req.length);
            assert!(
                end.is_some_and(|e| e <= export.size),
                "{req:?} accepted out of range"
            );
        }
        if verdict.is_ok() && matches!(req.command, crate::Command::Read | crate::Command::Write) {
            assert!(
                req.length <= u64::from(export.max_block),
                "{req:?} over the maximum"
            );
        }
        let framing = if ext {
            Framing::Extended {
                request_offset: req.offset,
            }
        } else {
            Framing::Structured
        };
        let len = req.length.min(crate::MAX_EFFECT_LEN) as u32;
        out.clear();
        encode_simple_reply(&mut out, req.cookie, verdict.err().unwrap_or(0));
        encode_offset_data_header(&mut out, framing, req.cookie, req.offset, len, true);
        encode_error_chunk(
            &mut out,
            framing,
            req.cookie,
            22,
            "fuzz",
            Some(req.offset),
            true,
        );
        encode_block_status(&mut out, framing, req.cookie, 1, &[(len, 0)], true);
        encode_done(&mut out, framing, req.cookie);
        let payload = req.payload_len(ext);
        let skip = usize::try_from(payload).map_or(rest.len(), |p| p.min(rest.len()));
        rest = &rest[skip..];
    }
}

/// Feeds the handshake the data in cuts the data chooses; returns what it
/// negotiated (or a set drawn from the data if it did not finish) and where
/// the transmission bytes begin.
fn negotiate(data: &[u8], exports: &Arc<[ExportInfo]>) -> (Negotiated, usize) {
    let mut h = Handshake::new(exports.clone(), Some(0));
    let mut pos = 0;
    // Cut sizes come from the data itself so the fuzzer explores splits.
    let mut step = 1 + data.first().map_or(0, |b| *b as usize % 61);
    while pos < data.len() && *h.status() == HandshakeStatus::Negotiating {
        let end = (pos + step).min(data.len());
        let used = h.feed(&data[pos..end]);
        assert!(
            used <= end - pos,
            "handshake consumed more than it was given"
        );
        if used == 0 {
            if end == data.len() {
                break;
            }
            step *= 2; // needs a bigger window
            continue;
        }
        pos += used;
    }
    let _ = h.take_output();
    let neg = match h.status().clone() {
        HandshakeStatus::Done(n) => n,
        _ => Negotiated {
            export_index: 0,
            structured_replies: data.len().is_multiple_of(2),
            extended_headers: data.len().is_multiple_of(5),
            contexts: vec![crate::SelectedContext {
                id: 1,
                context: crate::MetaContext::Allocation,
            }],
            no_zeroes: true,
            read_only: data.len().is_multiple_of(3),
        },
    };
    (neg, pos)
}

/// The inputs of a packed corpus file (`fuzz/corpus.py pack`): records of
/// a big-endian u16 name length, the name, a u32 data length and the data.
/// The corpus is kept packed so the tree holds one file per target, not
/// hundreds; `fuzz/corpus.py unpack` restores the folder cargo-fuzz uses.
pub fn packed_inputs(mut packed: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    while !packed.is_empty() {
        let name = take_len(&mut packed, 2)?;
        take(&mut packed, name)?;
        let data = take_len(&mut packed, 4)?;
        out.push(take(&mut packed, data)?.to_vec());
    }
    Ok(out)
}

/// A big-endian length of `width` bytes from the front of `b`.
fn take_len(b: &mut &[u8], width: usize) -> Result<usize, String> {
    let bytes = take(b, width)?;
    Ok(bytes.iter().fold(0usize, |n, &x| n << 8 | usize::from(x)))
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if b.len() < n {
        return Err(format!(
            "packed corpus cut short: {n} bytes wanted, {} left",
            b.len()
        ));
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// A client that negotiates extended headers, base:allocation and GO.
    fn extended_handshake() -> Vec<u8> {
        let option = |m: &mut Vec<u8>, opt: u32, data: &[u8]| {
            m.extend_from_slice(&crate::IHAVEOPT.to_be_bytes());
            m.extend_from_slice(&opt.to_be_bytes());
            m.extend_from_slice(&(data.len() as u32).to_be_bytes());
            m.extend_from_slice(data);
        };
        let mut m = 3u32.to_be_bytes().to_vec();
        option(&mut m, crate::OPT_EXTENDED_HEADERS, &[]);
        let mut meta = 7u32.to_be_bytes().to_vec();
        meta.extend_from_slice(b"default\0\0\0\x01\0\0\0\x0fbase:allocation");
        option(&mut m, crate::OPT_SET_META_CONTEXT, &meta);
        option(&mut m, crate::OPT_GO, b"\0\0\0\x07default\0\0");
        m
    }

    proptest! {
        /// Random extended request headers (valid magic, any flags, command,
        /// offset and 64-bit length) and payload bytes never panic the
        /// decoder, the validator or the encoders.
        #[test]
        fn extended_requests_never_panic(
            reqs in proptest::collection::vec(
                (any::<u16>(), 0u16..10, any::<u64>(), any::<u64>(), 0usize..64),
                1..20,
            )
        ) {
            let mut data = extended_handshake();
            for (flags, cmd, offset, length, junk) in reqs {
                let r = crate::Request {
                    flags,
                    command: crate::Command::from_u16(cmd),
                    cookie: 1,
                    offset,
                    length,
                };
                crate::encode_request(&mut data, &r, true);
                data.extend(std::iter::repeat_n(0x5a, junk));
            }
            super::run(&data);
        }
    }
}
