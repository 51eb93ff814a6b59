//! Server side of the fixed-newstyle handshake, as a state machine over bytes.

use std::sync::Arc;

use crate::consts::*;
use crate::meta::{self, take_string, SelectedContext};
use crate::ExportInfo;

/// Largest option payload buffered; larger ones get ERR_TOO_BIG and are skipped.
pub const MAX_OPTION_LEN: u32 = 64 << 10;

/// What the handshake settled, for the transmission phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub export_index: usize,
    pub structured_replies: bool,
    /// NBD_OPT_EXTENDED_HEADERS: 32-byte requests with 64-bit lengths, and
    /// every reply an extended chunk.
    pub extended_headers: bool,
    /// The metadata contexts the client selected for BLOCK_STATUS (none:
    /// BLOCK_STATUS is not allowed).
    pub contexts: Vec<SelectedContext>,
    pub no_zeroes: bool,
    /// This client may only read the export, whatever the export allows.
    pub read_only: bool,
}

/// Each export's dirty bitmap names, by export index.
pub type BitmapNames = Arc<dyn Fn(usize) -> Vec<String> + Send + Sync>;

/// What one client may do with one export (access control).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Not listed; INFO and GO get NBD_REP_ERR_POLICY, EXPORT_NAME closes.
    Denied,
    ReadOnly,
    ReadWrite,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeStatus {
    Negotiating,
    Done(Negotiated),
    /// The client aborted or broke the protocol: send the output, then close.
    Closed,
    /// STARTTLS was acknowledged: send the output, run the TLS handshake,
    /// then call [`Handshake::tls_started`]. Bytes the client sent before
    /// the TLS handshake are a protocol violation.
    StartTls,
}

/// Where a handshake stands with TLS (NBD_OPT_STARTTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// The listener has no TLS: STARTTLS is unsupported.
    Off,
    /// STARTTLS is accepted; every option works without it too.
    Offered,
    /// Every option but STARTTLS and ABORT is refused with ERR_TLS_REQD
    /// (the spec's "TLS-only" server); EXPORT_NAME, which has no error
    /// reply, closes the connection.
    Required,
    /// TLS is up: another STARTTLS is invalid.
    Active,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    ClientFlags,
    Options,
    /// Discarding the payload of an option too large to buffer.
    Skip(u64),
}

pub struct Handshake {
    exports: Arc<[ExportInfo]>,
    default_export: Option<usize>,
    out: Vec<u8>,
    stage: Stage,
    status: HandshakeStatus,
    tls: Tls,
    /// Per export, parallel to `exports`; empty means every export is open.
    access: Vec<Access>,
    /// Per export: a TLS client certificate may open it (empty: none may).
    tls_opens: Vec<bool>,
    no_zeroes: bool,
    structured: bool,
    extended: bool,
    /// Each export's dirty bitmaps' names, asked when a client lists or
    /// selects metadata contexts (none: no export has any).
    bitmaps: Option<BitmapNames>,
    /// The export the last SET_META_CONTEXT named, and what it selected.
    meta_export: Option<usize>,
    meta_selected: Vec<SelectedContext>,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

impl Handshake {
    /// Starts a handshake; the server greeting is queued in the output.
    pub fn new(exports: Arc<[ExportInfo]>, default_export: Option<usize>) -> Handshake {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        Handshake {
            exports,
            default_export,
            out,
            stage: Stage::ClientFlags,
            status: HandshakeStatus::Negotiating,
            tls: Tls::Off,
            access: Vec::new(),
            tls_opens: Vec::new(),
            no_zeroes: false,
            structured: false,
            extended: false,
            bitmaps: None,
            meta_export: None,
            meta_selected: Vec::new(),
        }
    }

    /// The same handshake offering each export's dirty bitmaps, as
    /// `bitmaps` names them when asked, as `qemu:dirty-bitmap:NAME` contexts.
    pub fn with_bitmaps(mut self, bitmaps: BitmapNames) -> Handshake {
        self.bitmaps = Some(bitmaps);
        self
    }

    fn bitmaps_of(&self, idx: usize) -> Vec<String> {
        self.bitmaps
            .as_ref()
            .map_or_else(Vec::new, |names| names(idx))
    }

    /// The same handshake with STARTTLS handled as `tls` says.
    pub fn with_tls(mut self, tls: Tls) -> Handshake {
        self.tls = tls;
        self
    }

    pub fn tls(&self) -> Tls {
        self.tls
    }

    /// What this client may do with each export (parallel to the exports);
    /// may change while negotiating, e.g. once a TLS client certificate is known.
    pub fn set_access(&mut self, access: Vec<Access>) {
        debug_assert!(access.is_empty() || access.len() == self.exports.len());
        self.access = access;
    }

    /// The exports a TLS client certificate may open (parallel to the
    /// exports): before TLS, such an export is TLS-only to a client it
    /// denies.
    pub fn set_tls_opens(&mut self, opens: Vec<bool>) {
        debug_assert!(opens.is_empty() || opens.len() == self.exports.len());
        self.tls_opens = opens;
    }

    fn access(&self, idx: usize) -> Access {
        self.access.get(idx).copied().unwrap_or(Access::ReadWrite)
    }

    /// Export `idx` as this client sees it: a read-only client gets no write flags.
    fn view(&self, idx: usize) -> ExportInfo {
        let mut e = self.exports[idx].clone();
        if self.access(idx) == Access::ReadOnly {
            e.read_only = true;
            e.can_trim = false;
            e.can_write_zeroes = false;
            e.can_fast_zero = false;
            e.can_fua = false;
            e.can_flush = false;
        }
        e
    }

    /// The TLS session is up after [`HandshakeStatus::StartTls`]: options go on.
    pub fn tls_started(&mut self) {
        debug_assert_eq!(self.status, HandshakeStatus::StartTls);
        self.status = HandshakeStatus::Negotiating;
        self.tls = Tls::Active;
        // Nothing said in plaintext carries over into the TLS session.
        self.structured = false;
        self.extended = false;
        self.meta_export = None;
        self.meta_selected.clear();
    }

    pub fn status(&self) -> &HandshakeStatus {
        &self.status
    }

    /// How many bytes, counting the `buffered` ones, the next whole client
    /// message needs; a driver that reads exactly this much never reads past
    /// the handshake.
    pub fn wanted(&self, buffered: &[u8]) -> usize {
        match self.stage {
            Stage::ClientFlags => 4,
            Stage::Skip(left) => left.min(u64::from(MAX_OPTION_LEN)) as usize,
            Stage::Options if buffered.len() < 16 => 16,
            Stage::Options => {
                let len = be32(buffered, 12);
                if len > MAX_OPTION_LEN {
                    16
                } else {
                    16 + len as usize
                }
            }
        }
    }

    /// Bytes the driver must send, in order.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Consumes whole client messages from `input`; never bytes past the end
    /// of the handshake. Returns how many bytes were consumed.
    pub fn feed(&mut self, input: &[u8]) -> usize {
        let mut pos = 0;
        while self.status == HandshakeStatus::Negotiating {
            let avail = &input[pos..];
            match self.stage {
                Stage::ClientFlags => {
                    if avail.len() < 4 {
                        break;
                    }
                    let flags = be32(avail, 0);
                    pos += 4;
                    // "If the client sets flags the server does not understand, the server MUST close."
                    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        self.status = HandshakeStatus::Closed;
                        break;
                    }
                    self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                    self.stage = Stage::Options;
                }
                Stage::Skip(left) => {
                    if avail.is_empty() {
                        break;
                    }
                    let n = (avail.len() as u64).min(left);
                    pos += n as usize;
                    self.stage = if n == left {
                        Stage::Options
                    } else {
                        Stage::Skip(left - n)
                    };
                }
                Stage::Options => {
                    if avail.len() < 16 {
                        break;
                    }
                    if be64(avail, 0) != IHAVEOPT {
                        self.status = HandshakeStatus::Closed;
                        break;
                    }
                    let opt = be32(avail, 8);
                    let len = be32(avail, 12);
                    if len > MAX_OPTION_LEN {
                        pos += 16;
                        if opt == OPT_EXPORT_NAME {
                            // EXPORT_NAME has no error reply: all we can do is close.
                            self.status = HandshakeStatus::Closed;
                            break;
                        }
                        self.reply(opt, REP_ERR_TOO_BIG, b"option too large");
                        self.stage = Stage::Skip(u64::from(len));
                        continue;
                    }
                    let total = 16 + len as usize;
                    if avail.len() < total {
                        break;
                    }
                    pos += total;
                    self.option(opt, &avail[16..total]);
                }
            }
        }
        pos
    }

    fn reply(&mut self, opt: u32, typ: u32, data: &[u8]) {
        self.out.extend_from_slice(&REPLY_MAGIC_OPT.to_be_bytes());
        self.out.extend_from_slice(&opt.to_be_bytes());
        self.out.extend_from_slice(&typ.to_be_bytes());
        self.out
            .extend_from_slice(&(data.len() as u32).to_be_bytes());
        self.out.extend_from_slice(data);
    }

    /// Export `name`'s index if this client may use it; if not, the
    /// option's error reply is sent.
    fn export_for(&mut self, opt: u32, name: &str) -> Option<usize> {
        let Some(idx) = self.find(name) else {
            self.reply(opt, REP_ERR_UNKNOWN, b"unknown export");
            return None;
        };
        if self.access(idx) == Access::Denied {
            // SELECTIVETLS: INFO and GO "MUST reply with NBD_REP_ERR_TLS_REQD
            // if that export is TLS-only" (and only they may), so the client
            // knows STARTTLS and a certificate may open it.
            let tls_only = self.tls == Tls::Offered && self.tls_opens.get(idx) == Some(&true);
            if tls_only && matches!(opt, OPT_INFO | OPT_GO) {
                self.reply(opt, REP_ERR_TLS_REQD, b"start TLS first (NBD_OPT_STARTTLS)");
                return None;
            }
            let why = b"this export is not open to this client";
            self.reply(opt, REP_ERR_POLICY, why);
            return None;
        }
        Some(idx)
    }

    fn find(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return self.default_export;
        }
        self.exports.iter().position(|e| e.name == name)
    }

    fn negotiated(&self, export_index: usize) -> Negotiated {
        Negotiated {
            export_index,
            structured_replies: self.structured,
            extended_headers: self.extended,
            contexts: if self.meta_export == Some(export_index) {
                self.meta_selected.clone()
            } else {
                Vec::new()
            },
            no_zeroes: self.no_zeroes,
            read_only: self.access(export_index) == Access::ReadOnly,
        }
    }

    /// STARTTLS, and every option while TLS is required but not yet up;
    /// returns whether the option was handled here.
    fn tls_option(&mut self, opt: u32, data: &[u8]) -> bool {
        match (self.tls, opt) {
            (Tls::Off, _) | (Tls::Offered | Tls::Active, OPT_ABORT) => false,
            (Tls::Offered | Tls::Required, OPT_STARTTLS) if !data.is_empty() => {
                self.reply(opt, REP_ERR_INVALID, b"STARTTLS takes no data");
                true
            }
            (Tls::Offered | Tls::Required, OPT_STARTTLS) => {
                self.reply(opt, REP_ACK, &[]);
                self.status = HandshakeStatus::StartTls;
                true
            }
            (Tls::Active, OPT_STARTTLS) => {
                self.reply(opt, REP_ERR_INVALID, b"TLS is already up");
                true
            }
            (Tls::Required, OPT_ABORT) | (Tls::Offered | Tls::Active, _) => false,
            (Tls::Required, OPT_EXPORT_NAME) => {
                self.status = HandshakeStatus::Closed;
                true
            }
            (Tls::Required, _) => {
                self.reply(opt, REP_ERR_TLS_REQD, b"start TLS first (NBD_OPT_STARTTLS)");
                true
            }
        }
    }

    fn option(&mut self, opt: u32, data: &[u8]) {
        if self.tls_option(opt, data) {
            return;
        }
        match opt {
            // A client with extended headers "MUST NOT use NBD_OPT_EXPORT_NAME",
            // which has no error reply: all we can do is close.
            OPT_EXPORT_NAME if self.extended => self.status = HandshakeStatus::Closed,
            OPT_EXPORT_NAME => {
                let idx = std::str::from_utf8(data).ok().and_then(|n| self.find(n));
                let Some(idx) = idx.filter(|&i| self.access(i) != Access::Denied) else {
                    // "If the server does not know the export, it MUST terminate the session."
                    self.status = HandshakeStatus::Closed;
                    return;
                };
                let e = &self.view(idx);
                let flags = e.transmission_flags(self.structured);
                self.out.extend_from_slice(&e.size.to_be_bytes());
                self.out.extend_from_slice(&flags.to_be_bytes());
                if !self.no_zeroes {
                    self.out.extend_from_slice(&[0u8; 124]);
                }
                self.status = HandshakeStatus::Done(self.negotiated(idx));
            }
            OPT_ABORT => {
                self.reply(opt, REP_ACK, &[]);
                self.status = HandshakeStatus::Closed;
            }
            OPT_LIST => {
                if !data.is_empty() {
                    self.reply(opt, REP_ERR_INVALID, b"LIST takes no data");
                    return;
                }
                let exports = self.exports.clone();
                let visible = (0..exports.len()).filter(|&i| self.access(i) != Access::Denied);
                for e in visible.map(|i| &exports[i]).collect::<Vec<_>>() {
                    // The bytes after the name are the export's description.
                    let mut d = Vec::with_capacity(4 + e.name.len() + e.description.len());
                    d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    self.reply(opt, REP_SERVER, &d);
                }
                self.reply(opt, REP_ACK, &[]);
            }
            OPT_INFO | OPT_GO => self.info_or_go(opt, data),
            OPT_STRUCTURED_REPLY | OPT_EXTENDED_HEADERS => self.reply_format(opt, data),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(opt, data),
            _ => self.reply(opt, REP_ERR_UNSUP, b"option not supported"),
        }
    }

    /// STRUCTURED_REPLY or EXTENDED_HEADERS: how replies will be framed.
    fn reply_format(&mut self, opt: u32, data: &[u8]) {
        if !data.is_empty() {
            self.reply(opt, REP_ERR_INVALID, b"this option takes no data");
        } else if opt == OPT_EXTENDED_HEADERS {
            self.extended = true;
            self.reply(opt, REP_ACK, &[]);
        } else if self.extended {
            // No downgrade from extended headers.
            let why = b"extended headers are already on";
            self.reply(opt, REP_ERR_EXT_HEADER_REQD, why);
        } else {
            self.structured = true;
            self.reply(opt, REP_ACK, &[]);
        }
    }

    fn info_or_go(&mut self, opt: u32, data: &[u8]) {
        let mut pos = 0;
        let Some(name) = take_string(data, &mut pos) else {
            self.reply(opt, REP_ERR_INVALID, b"malformed request");
            return;
        };
        let Some(n) = data.get(pos..pos + 2).map(|b| be16(b, 0) as usize) else {
            self.reply(opt, REP_ERR_INVALID, b"malformed request");
            return;
        };
        pos += 2;
        if data.len() != pos + 2 * n {
            self.reply(
                opt,
                REP_ERR_INVALID,
                b"information request count does not match length",
            );
            return;
        }
        let requested: Vec<u16> = (0..n).map(|i| be16(data, pos + 2 * i)).collect();
        let Some(idx) = self.export_for(opt, name) else {
            return;
        };
        let e = self.view(idx);
        let mut d = Vec::with_capacity(12);
        d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        d.extend_from_slice(&e.size.to_be_bytes());
        let flags = e.transmission_flags(self.structured || self.extended);
        d.extend_from_slice(&flags.to_be_bytes());
        self.reply(opt, REP_INFO, &d);
        if requested.contains(&INFO_NAME) {
            let mut d = INFO_NAME.to_be_bytes().to_vec();
            d.extend_from_slice(e.name.as_bytes());
            self.reply(opt, REP_INFO, &d);
        }
        if requested.contains(&INFO_DESCRIPTION) && !e.description.is_empty() {
            let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
            d.extend_from_slice(e.description.as_bytes());
            self.reply(opt, REP_INFO, &d);
        }
        let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        d.extend_from_slice(&e.min_block.to_be_bytes());
        d.extend_from_slice(&e.pref_block.to_be_bytes());
        d.extend_from_slice(&e.max_block.to_be_bytes());
        self.reply(opt, REP_INFO, &d);
        self.reply(opt, REP_ACK, &[]);
        if opt == OPT_GO {
            self.status = HandshakeStatus::Done(self.negotiated(idx));
        }
    }

    fn meta_context(&mut self, opt: u32, data: &[u8]) {
        let set = opt == OPT_SET_META_CONTEXT;
        if set {
            // "Issuing this command replaces all previously-set metadata contexts
            // (including when this command fails)."
            self.meta_export = None;
            self.meta_selected.clear();
        }
        if !(self.structured || self.extended) {
            self.reply(opt, REP_ERR_INVALID, b"negotiate structured replies first");
            return;
        }
        let request = match meta::parse(data) {
            Ok(r) => r,
            Err(why) => {
                self.reply(opt, REP_ERR_INVALID, why.as_bytes());
                return;
            }
        };
        let Some(idx) = self.export_for(opt, request.export) else {
            return;
        };
        let bitmaps = self.bitmaps_of(idx);
        // Unknown namespaces and names match nothing, as the spec requires.
        let answers: Vec<(u32, String)> = if set {
            let selected = meta::select(&request.queries, &bitmaps);
            let answers = selected.iter().map(|c| (c.id, c.context.name())).collect();
            self.meta_export = Some(idx);
            self.meta_selected = selected;
            answers
        } else {
            let listed = meta::list(&request.queries, &bitmaps);
            listed.iter().map(|c| (0, c.name())).collect()
        };
        for (id, name) in answers {
            let mut d = id.to_be_bytes().to_vec();
            d.extend_from_slice(name.as_bytes());
            self.reply(opt, REP_META_CONTEXT, &d);
        }
        self.reply(opt, REP_ACK, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::tests::data as meta_data;
    use proptest::prelude::*;

    fn exports() -> Arc<[ExportInfo]> {
        let mut a = ExportInfo::simple("default", 1 << 30);
        a.description = "RAM".into();
        let b = ExportInfo::simple("other", 4096);
        vec![a, b].into()
    }

    fn option(opt: u32, data: &[u8]) -> Vec<u8> {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&opt.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    /// Parses option replies: (option, type, data).
    fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while out.len() >= 20 {
            assert_eq!(be64(out, 0), REPLY_MAGIC_OPT);
            let len = be32(out, 16) as usize;
            v.push((be32(out, 8), be32(out, 12), out[20..20 + len].to_vec()));
            out = &out[20 + len..];
        }
        v
    }

    fn client(flags: u32) -> Vec<u8> {
        flags.to_be_bytes().to_vec()
    }

    /// A handshake past its greeting, and a fixed-newstyle client's opening
    /// bytes, for the options a test adds.
    fn opened(default_export: Option<usize>) -> (Handshake, Vec<u8>) {
        let mut h = Handshake::new(exports(), default_export);
        h.take_output();
        (h, client(FLAG_C_FIXED_NEWSTYLE))
    }

    #[test]
    fn tls_required_refuses_options_until_starttls() {
        let (h, mut input) = opened(Some(0));
        let mut h = h.with_tls(Tls::Required);
        input.extend(option(OPT_LIST, &[]));
        input.extend(option(OPT_GO, &go_data("default", &[])));
        input.extend(option(OPT_STARTTLS, &[]));
        let after = option(OPT_GO, &go_data("default", &[]));
        input.extend(&after);
        let used = h.feed(&input);
        assert_eq!(
            used,
            input.len() - after.len(),
            "nothing read past STARTTLS"
        );
        assert_eq!(*h.status(), HandshakeStatus::StartTls);
        let r = replies(&h.take_output());
        let types: Vec<u32> = r.iter().map(|x| x.1).collect();
        assert_eq!(types, [REP_ERR_TLS_REQD, REP_ERR_TLS_REQD, REP_ACK]);
        h.tls_started();
        assert_eq!(h.feed(&after), after.len());
        assert!(matches!(h.status(), HandshakeStatus::Done(_)));
    }

    #[test]
    fn starttls_twice_or_when_off() {
        let (h, mut input) = opened(Some(0));
        let mut h = h.with_tls(Tls::Active);
        input.extend(option(OPT_STARTTLS, &[]));
        h.feed(&input);
        assert_eq!(replies(&h.take_output())[0].1, REP_ERR_INVALID);
        let mut h = opened(Some(0)).0;
        h.feed(&input);
        assert_eq!(replies(&h.take_output())[0].1, REP_ERR_UNSUP);
        assert_eq!(*h.status(), HandshakeStatus::Negotiating);
    }

    #[test]
    fn tls_required_export_name_closes() {
        let mut h = Handshake::new(exports(), Some(0)).with_tls(Tls::Required);
        let mut input = client(FLAG_C_FIXED_NEWSTYLE);
        input.extend(option(OPT_EXPORT_NAME, b"default"));
        h.feed(&input);
        assert_eq!(*h.status(), HandshakeStatus::Closed);
    }

    #[test]
    fn access_hides_denies_and_narrows_exports() {
        let mut h = Handshake::new(exports(), Some(0));
        h.set_access(vec![Access::ReadOnly, Access::Denied]);
        let _ = h.take_output();
        let mut input = client(FLAG_C_FIXED_NEWSTYLE);
        input.extend(option(OPT_LIST, &[]));
        input.extend(option(OPT_GO, &go_data("other", &[])));
        input.extend(option(OPT_GO, &go_data("default", &[])));
        assert_eq!(h.feed(&input), input.len());
        let r = replies(&h.take_output());
        assert_eq!(r[0].1, REP_SERVER, "only `default` is listed");
        assert_eq!(r[1].1, REP_ACK);
        assert_eq!(r[2].1, REP_ERR_POLICY, "GO other is refused");
        assert_eq!(r[3].1, REP_INFO);
        let flags = be16(&r[3].2, 10);
        assert_ne!(flags & FLAG_READ_ONLY, 0, "read-only for this client");
        match h.status() {
            HandshakeStatus::Done(n) => assert!(n.read_only),
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn an_export_a_certificate_may_open_is_tls_only_before_tls() {
        let mut h = Handshake::new(exports(), Some(0)).with_tls(Tls::Offered);
        h.set_access(vec![Access::Denied, Access::Denied]);
        h.set_tls_opens(vec![true, false]);
        let _ = h.take_output();
        let mut input = client(FLAG_C_FIXED_NEWSTYLE);
        input.extend(option(OPT_INFO, &go_data("default", &[])));
        input.extend(option(OPT_GO, &go_data("other", &[])));
        input.extend(option(OPT_STRUCTURED_REPLY, &[]));
        input.extend(option(OPT_LIST_META_CONTEXT, &meta_data("default", &[])));
        input.extend(option(OPT_STARTTLS, &[]));
        h.feed(&input);
        let types: Vec<u32> = replies(&h.take_output()).iter().map(|x| x.1).collect();
        let want = [
            REP_ERR_TLS_REQD,
            REP_ERR_POLICY,
            REP_ACK,
            REP_ERR_POLICY,
            REP_ACK,
        ];
        assert_eq!(types, want, "only INFO and GO may answer TLS_REQD");
        // Once TLS is up without a certificate that opens it: refused.
        h.tls_started();
        h.feed(&option(OPT_GO, &go_data("default", &[])));
        assert_eq!(replies(&h.take_output())[0].1, REP_ERR_POLICY);
    }

    #[test]
    fn wanted_never_reads_past_a_message() {
        let h = Handshake::new(exports(), Some(0));
        assert_eq!(h.wanted(&[]), 4);
        let mut h = Handshake::new(exports(), Some(0));
        h.feed(&client(FLAG_C_FIXED_NEWSTYLE));
        let opt = option(OPT_LIST, b"abc");
        assert_eq!(h.wanted(&opt[..3]), 16);
        assert_eq!(h.wanted(&opt[..16]), 19);
    }

    #[test]
    fn greeting_then_go_with_structured_and_meta() {
        let mut h = Handshake::new(exports(), Some(0));
        let greet = h.take_output();
        assert_eq!(greet.len(), 18);
        assert_eq!(be16(&greet, 16), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        let mut input = client(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        input.extend(option(OPT_STRUCTURED_REPLY, &[]));
        input.extend(option(
            OPT_SET_META_CONTEXT,
            &meta_data("default", &["base:allocation", "qemu:x"]),
        ));
        input.extend(option(OPT_GO, &go_data("", &[INFO_NAME, INFO_DESCRIPTION])));
        input.extend_from_slice(&[1, 2, 3]); // transmission bytes: not ours
        let used = h.feed(&input);
        assert_eq!(used, input.len() - 3);
        let r = replies(&h.take_output());
        let types: Vec<u32> = r.iter().map(|x| x.1).collect();
        assert_eq!(
            types,
            vec![
                REP_ACK,
                REP_META_CONTEXT,
                REP_ACK,
                REP_INFO,
                REP_INFO,
                REP_INFO,
                REP_INFO,
                REP_ACK
            ]
        );
        let export_info = &r[3].2;
        assert_eq!(be16(export_info, 0), INFO_EXPORT);
        let flags = be16(export_info, 10);
        assert!(flags & FLAG_SEND_DF != 0 && flags & FLAG_CAN_MULTI_CONN != 0);
        match h.status() {
            HandshakeStatus::Done(n) => {
                assert_eq!(n.export_index, 0);
                assert!(n.structured_replies);
                assert_eq!(ids(n), [1]);
            }
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn extended_headers_replace_structured_replies() {
        let mut h = Handshake::new(exports(), Some(0));
        h.take_output();
        let mut input = client(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        input.extend(option(OPT_EXTENDED_HEADERS, b"x"));
        input.extend(option(OPT_EXTENDED_HEADERS, &[]));
        input.extend(option(OPT_STRUCTURED_REPLY, &[]));
        input.extend(option(
            OPT_SET_META_CONTEXT,
            &meta_data("default", &["base:allocation"]),
        ));
        input.extend(option(OPT_GO, &go_data("default", &[])));
        assert_eq!(h.feed(&input), input.len());
        let r = replies(&h.take_output());
        let types: Vec<u32> = r.iter().map(|x| x.1).collect();
        assert_eq!(
            types,
            vec![
                REP_ERR_INVALID,
                REP_ACK,
                REP_ERR_EXT_HEADER_REQD,
                REP_META_CONTEXT,
                REP_ACK,
                REP_INFO,
                REP_INFO,
                REP_ACK
            ]
        );
        assert_ne!(be16(&r[5].2, 10) & FLAG_SEND_DF, 0, "DF is offered");
        match h.status() {
            HandshakeStatus::Done(n) => {
                assert!(n.extended_headers && !n.structured_replies);
                assert_eq!(ids(n), [1]);
            }
            s => panic!("{s:?}"),
        }
        // EXPORT_NAME is not for clients with extended headers.
        let mut h = Handshake::new(exports(), Some(0));
        let mut input = client(FLAG_C_FIXED_NEWSTYLE);
        input.extend(option(OPT_EXTENDED_HEADERS, &[]));
        input.extend(option(OPT_EXPORT_NAME, b"default"));
        h.feed(&input);
        assert_eq!(h.status(), &HandshakeStatus::Closed);
    }

    #[test]
    fn unknown_option_is_unsup_and_next_still_parsed() {
        let (mut h, mut input) = opened(Some(0));
        input.extend(option(999, b"junk"));
        input.extend(option(OPT_LIST, &[]));
        assert_eq!(h.feed(&input), input.len());
        let r = replies(&h.take_output());
        assert_eq!(r[0].1, REP_ERR_UNSUP);
        assert_eq!(r[1].1, REP_SERVER);
        assert_eq!(r[2].1, REP_SERVER);
        assert_eq!(r[3].1, REP_ACK);
        assert_eq!(h.status(), &HandshakeStatus::Negotiating);
        // Name length, name, then the description.
        assert_eq!(&r[1].2[..], b"\0\0\0\x07defaultRAM");
        assert_eq!(&r[2].2[..], b"\0\0\0\x05other");
    }

    #[test]
    fn export_name_sends_size_flags_and_zeroes() {
        for (cflags, len) in [
            (FLAG_C_FIXED_NEWSTYLE, 10 + 124),
            (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES, 10),
        ] {
            let mut h = Handshake::new(exports(), Some(0));
            h.take_output();
            let mut input = client(cflags);
            input.extend(option(OPT_EXPORT_NAME, b"other"));
            h.feed(&input);
            let out = h.take_output();
            assert_eq!(out.len(), len);
            assert_eq!(be64(&out, 0), 4096);
            assert!(matches!(h.status(), HandshakeStatus::Done(n) if n.export_index == 1));
        }
    }

    #[test]
    fn unknown_export_errors() {
        let (mut h, mut input) = opened(None);
        input.extend(option(OPT_GO, &go_data("nope", &[])));
        input.extend(option(OPT_GO, &go_data("", &[]))); // no default export either
        h.feed(&input);
        let r = replies(&h.take_output());
        assert_eq!(r[0].1, REP_ERR_UNKNOWN);
        assert_eq!(r[1].1, REP_ERR_UNKNOWN);
        input = option(OPT_EXPORT_NAME, b"nope");
        h.feed(&input);
        assert_eq!(h.status(), &HandshakeStatus::Closed);
    }

    #[test]
    fn malformed_options_get_err_invalid() {
        let (mut h, mut input) = opened(Some(0));
        input.extend(option(OPT_GO, &[0, 0, 0, 200, b'x'])); // name longer than data
        input.extend(option(OPT_LIST, b"x"));
        input.extend(option(
            OPT_SET_META_CONTEXT,
            &meta_data("default", &["base:allocation"]),
        )); // before structured
        h.feed(&input);
        let r = replies(&h.take_output());
        assert!(r.iter().all(|x| x.1 == REP_ERR_INVALID), "{r:?}");
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn oversized_option_is_skipped_across_feeds() {
        let (mut h, mut input) = opened(Some(0));
        let big = MAX_OPTION_LEN + 10;
        input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        input.extend_from_slice(&OPT_INFO.to_be_bytes());
        input.extend_from_slice(&big.to_be_bytes());
        assert_eq!(h.feed(&input), input.len());
        let junk = vec![0u8; big as usize];
        let (a, b) = junk.split_at(1000);
        assert_eq!(h.feed(a), a.len());
        assert_eq!(h.feed(b), b.len());
        let list = option(OPT_LIST, &[]);
        assert_eq!(h.feed(&list), list.len());
        let r = replies(&h.take_output());
        assert_eq!(r[0].1, REP_ERR_TOO_BIG);
        assert_eq!(r.last().map(|x| x.1), Some(REP_ACK));
    }

    #[test]
    fn bad_magic_or_client_flags_close() {
        let mut h = Handshake::new(exports(), Some(0));
        h.feed(&client(1 << 7));
        assert_eq!(h.status(), &HandshakeStatus::Closed);
        let mut h = Handshake::new(exports(), Some(0));
        let mut input = client(1);
        input.extend_from_slice(&[0u8; 16]);
        h.feed(&input);
        assert_eq!(h.status(), &HandshakeStatus::Closed);
    }

    #[test]
    fn abort_acks_and_closes() {
        let (mut h, mut input) = opened(Some(0));
        input.extend(option(OPT_ABORT, &[]));
        h.feed(&input);
        assert_eq!(replies(&h.take_output())[0].1, REP_ACK);
        assert_eq!(h.status(), &HandshakeStatus::Closed);
    }

    #[test]
    fn list_meta_context_lists_base_allocation() {
        let (mut h, mut input) = opened(Some(0));
        input.extend(option(OPT_STRUCTURED_REPLY, &[]));
        input.extend(option(OPT_LIST_META_CONTEXT, &meta_data("default", &[])));
        input.extend(option(
            OPT_LIST_META_CONTEXT,
            &meta_data("default", &["base:"]),
        ));
        input.extend(option(
            OPT_LIST_META_CONTEXT,
            &meta_data("default", &["other:thing"]),
        ));
        h.feed(&input);
        let types: Vec<u32> = replies(&h.take_output()).iter().map(|x| x.1).collect();
        assert_eq!(
            types,
            vec![
                REP_ACK,
                REP_META_CONTEXT,
                REP_ACK,
                REP_META_CONTEXT,
                REP_ACK,
                REP_ACK
            ]
        );
    }

    fn ids(n: &Negotiated) -> Vec<u32> {
        n.contexts.iter().map(|c| c.id).collect()
    }

    #[test]
    fn dirty_bitmaps_are_listed_and_selected_per_export() {
        let (h, mut input) = opened(Some(0));
        let names = |i: usize| match i {
            0 => vec!["backup".to_string()],
            _ => Vec::new(),
        };
        let mut h = h.with_bitmaps(Arc::new(names));
        input.extend(option(OPT_STRUCTURED_REPLY, &[]));
        input.extend(option(
            OPT_LIST_META_CONTEXT,
            &meta_data("default", &["qemu:"]),
        ));
        input.extend(option(
            OPT_LIST_META_CONTEXT,
            &meta_data("other", &["qemu:"]),
        ));
        input.extend(option(
            OPT_LIST_META_CONTEXT,
            &meta_data("default", &["nons"]),
        ));
        let both = ["qemu:dirty-bitmap:backup", "base:allocation"];
        input.extend(option(OPT_SET_META_CONTEXT, &meta_data("default", &both)));
        input.extend(option(OPT_GO, &go_data("default", &[])));
        h.feed(&input);
        let r = replies(&h.take_output())[1..].to_vec();
        let types: Vec<u32> = r.iter().map(|x| x.1).collect();
        let mut want = vec![REP_META_CONTEXT, REP_ACK, REP_ACK, REP_ERR_INVALID];
        want.extend([REP_META_CONTEXT, REP_META_CONTEXT, REP_ACK]);
        assert_eq!(types[..want.len()], want);
        assert_eq!(&r[0].2[..4], &[0; 4], "LIST's ids are zero");
        assert_eq!(&r[0].2[4..], b"qemu:dirty-bitmap:backup");
        assert_eq!(be32(&r[4].2, 0), 1);
        assert_eq!(&r[4].2[4..], b"base:allocation");
        assert_eq!(be32(&r[5].2, 0), 2);
        match h.status() {
            HandshakeStatus::Done(n) => {
                assert_eq!(ids(n), [1, 2]);
                let bitmap = &n.contexts[1].context;
                assert_eq!(*bitmap, crate::MetaContext::DirtyBitmap("backup".into()));
            }
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn contexts_set_for_another_export_are_not_kept() {
        let (mut h, mut input) = opened(Some(0));
        input.extend(option(OPT_STRUCTURED_REPLY, &[]));
        let q = meta_data("other", &["base:allocation"]);
        input.extend(option(OPT_SET_META_CONTEXT, &q));
        input.extend(option(OPT_GO, &go_data("default", &[])));
        h.feed(&input);
        match h.status() {
            HandshakeStatus::Done(n) => assert!(n.contexts.is_empty()),
            s => panic!("{s:?}"),
        }
    }

    proptest! {
        /// How the input is cut into reads must not change the outcome.
        #[test]
        fn chunking_does_not_matter(cuts in proptest::collection::vec(1usize..40, 1..30)) {
            let mut input = client(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
            input.extend(option(OPT_STRUCTURED_REPLY, &[]));
            input.extend(option(77, b"zz"));
            input.extend(option(OPT_LIST, &[]));
            input.extend(option(OPT_SET_META_CONTEXT, &meta_data("default", &["base:allocation"])));
            input.extend(option(OPT_GO, &go_data("default", &[INFO_NAME])));
            let mut whole = Handshake::new(exports(), Some(0));
            whole.feed(&input);
            let expected = whole.take_output();

            let mut h = Handshake::new(exports(), Some(0));
            let mut buf = Vec::new();
            let mut fed = 0;
            let mut cuts = cuts.into_iter().cycle();
            while fed < input.len() {
                let n = cuts.next().unwrap_or(1).min(input.len() - fed);
                buf.extend_from_slice(&input[fed..fed + n]);
                fed += n;
                let used = h.feed(&buf);
                buf.drain(..used);
            }
            prop_assert_eq!(h.take_output(), expected);
            prop_assert_eq!(h.status(), whole.status());
        }

        #[test]
        fn arbitrary_input_never_overconsumes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut h = Handshake::new(exports(), Some(0));
            let used = h.feed(&data);
            prop_assert!(used <= data.len());
        }
    }
}
