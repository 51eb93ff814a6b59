//! One NVMe/TCP queue (one TCP connection), sans-IO: bytes in, bytes and
//! actions out. It runs the connection's PDU sequence (ICReq, then
//! capsules and H2CData), tracks each command's life (`cmd.rs`, `Life`)
//! and asks its driver for what it cannot do itself: Connect and admin
//! commands go to the `ctrl::Target`, data commands wait for the pacer's
//! admission, IO goes to the device. What goes back to the host is framed
//! by its send side (`tx.rs`, `Tx`).

mod cmd;
mod tx;

#[cfg(test)]
mod prop_tests;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_abort;
#[cfg(test)]
mod tests_admin;
#[cfg(test)]
mod tests_bad;
#[cfg(test)]
mod tests_external;
#[cfg(test)]
mod tests_stream;

use rustc_hash::FxHashMap;

use super::cmd::Status;
use super::ctrl::{AdminDone, Connected, IoCmd, Limits, ADMIN_IN_CAPSULE};
use super::decode::{Decoded, Decoder, Fatal, Role};
use super::pdu::{
    crc32c_append, fes, DataHdr, Digests, Framing, IcResp, Pdu, TermReq, DIGEST_LEN, TERM_MAX_DATA,
};
pub use cmd::{Action, DataStart, DevOp};
use cmd::{Cmd, Ev, Life};
use tx::Tx;

/// Where the connection is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Waiting for ICReq.
    Init,
    /// ICResp sent; the first capsule must be a Connect.
    Unbound,
    /// Connect sent to the target.
    Connecting,
    Bound(Connected),
    /// A TermReq went out or came in: nothing more is read.
    Closing,
}

/// One queue's connection.
#[derive(Debug)]
pub struct Queue {
    limits: Limits,
    /// Data commands go without asking the driver to admit them.
    auto_admit: bool,
    /// READs and WRITEs are the driver's: it admits them, holds their data
    /// in its own buffers and encodes their completions (`external`).
    external: bool,
    /// Where the buffer passed to `receive` starts: H2CData of an external
    /// command is reported as a range of it (`Action::Data`).
    rx_origin: usize,
    phase: Phase,
    decoder: Decoder,
    /// By command id. Hashed cheaply: a host picks its ids, but a queue
    /// holds at most its depth of them, and a lookup runs several times per IO.
    cmds: FxHashMap<u16, Cmd>,
    /// What goes to the host: framing, completions, data, R2Ts.
    tx: Tx,
    actions: Vec<Action>,
    /// An H2CData PDU whose data is arriving, taken as it comes.
    inflow: Option<Inflow>,
    /// Command capsules received so far: the driver reports a queue that
    /// took commands to its controller's keep-alive timer (`commands`).
    commands: u64,
}

/// An H2CData PDU taken as its data arrives: the receive buffer never
/// holds a large PDU whole (nor is one moved to its front half in).
#[derive(Debug)]
struct Inflow {
    hdr: DataHdr,
    /// Its command's bytes before this PDU's data.
    base: u32,
    /// Bytes of its data, and taken so far.
    len: u32,
    took: u32,
    /// The data digest so far, when one follows the data.
    crc: Option<u32>,
}

impl Queue {
    pub fn new(limits: Limits, auto_admit: bool) -> Queue {
        let max = limits
            .in_capsule
            .max(limits.maxh2cdata)
            .max(ADMIN_IN_CAPSULE);
        Queue {
            limits,
            auto_admit,
            external: false,
            rx_origin: 0,
            phase: Phase::Init,
            decoder: Decoder::new(Role::Controller, max),
            cmds: FxHashMap::default(),
            tx: Tx::default(),
            actions: Vec::new(),
            inflow: None,
            commands: 0,
        }
    }

    /// A queue whose READs and WRITEs a driver serves from its own buffers:
    /// each asks for admission (`Action::Admit`); the driver then asks for a
    /// WRITE's data (`request_data`), gets it as ranges of its receive
    /// buffer (`Action::Data`, `Action::DataIn`) and answers with
    /// `c2h_head` and `finish_external`. Other commands run as `new(_, true)`.
    pub fn external(limits: Limits) -> Queue {
        let mut q = Queue::new(limits, true);
        q.external = true;
        q
    }

    /// Whether READs and WRITEs are the driver's (`external`).
    pub fn is_external(&self) -> bool {
        self.external
    }

    /// The Connect this queue made, once made.
    pub fn bound(&self) -> Option<&Connected> {
        match &self.phase {
            Phase::Bound(c) => Some(c),
            _ => None,
        }
    }

    /// Whether nothing more is read (a TermReq was sent or received).
    pub fn closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// Command capsules received so far: an I/O queue that took commands
    /// since its driver last looked restarts its controller's keep-alive
    /// timer (`Target::traffic`).
    pub fn commands(&self) -> u64 {
        self.commands
    }

    /// Commands received and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.cmds.len()
    }

    /// Whether command `cid` is received and not yet completed.
    pub fn has(&self, cid: u16) -> bool {
        self.cmds.contains_key(&cid)
    }

    /// Whether an H2CData PDU's data is part in: the host owes the rest.
    pub fn mid_pdu(&self) -> bool {
        self.inflow.is_some()
    }

    /// Bytes to send, in order; the caller takes them all.
    pub fn take_output(&mut self) -> Vec<u8> {
        self.tx.take()
    }

    pub fn has_output(&self) -> bool {
        self.tx.has_output()
    }

    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Moves the actions asked for so far into `out`, an empty list the
    /// driver lends (a swap: the queue keeps `out`'s capacity, so a PDU's
    /// actions need no new list each time).
    pub fn move_actions(&mut self, out: &mut Vec<Action>) {
        debug_assert!(out.is_empty(), "{} actions not yet carried out", out.len());
        std::mem::swap(&mut self.actions, out);
    }

    /// Consumes whole PDUs from `buf`, and an H2CData PDU's data as it
    /// comes; returns how many bytes it used. The rest (part of a PDU) must
    /// be offered again with more behind it. `want` says how many bytes
    /// are needed from there (the next PDU's, or the data still due).
    pub fn receive(&mut self, buf: &[u8]) -> (usize, usize) {
        let mut pos = 0;
        self.rx_origin = buf.as_ptr() as usize;
        while self.phase != Phase::Closing {
            let rest = &buf[pos..];
            if self.inflow.is_some() {
                match self.inflow_data(rest) {
                    Ok(n) => pos += n,
                    Err(want) => return (pos, want),
                }
                continue;
            }
            if rest.is_empty() {
                return (pos, 8);
            }
            match self.decoder.decode(rest) {
                Ok(Decoded::Need(n)) => match self.start_inflow(rest) {
                    Ok(Some(start)) => pos += start,
                    Ok(None) => return (pos, n),
                    Err(f) => self.fatal(f, rest),
                },
                Ok(Decoded::Pdu {
                    pdu,
                    len,
                    data_digest_ok,
                }) => {
                    pos += len;
                    if let Err(f) = self.on_pdu(pdu, data_digest_ok) {
                        self.fatal(f, rest);
                    }
                }
                Err(f) => self.fatal(f, rest),
            }
        }
        (buf.len(), 0)
    }

    /// An H2CData PDU not all in `rest`, with its header (checked as a
    /// whole one's) there: its data is taken as it comes. The header's
    /// bytes, or None when it is not such a PDU.
    fn start_inflow(&mut self, rest: &[u8]) -> Result<Option<usize>, Fatal> {
        let Some(h) = self.decoder.data_head(rest)? else {
            return Ok(None);
        };
        let base = self.check_h2c(&h.hdr, h.len)?;
        self.inflow = Some(Inflow {
            hdr: h.hdr,
            base,
            len: h.len as u32,
            took: 0,
            crc: h.digest.then_some(0),
        });
        Ok(Some(h.start))
    }

    /// Takes what `rest` holds of the arriving data, then its digest: the
    /// bytes used, or Err with the bytes still needed when it has none.
    fn inflow_data(&mut self, rest: &[u8]) -> Result<usize, usize> {
        let Some(f) = self.inflow.as_mut() else {
            return Ok(0);
        };
        let dd = if f.crc.is_some() { DIGEST_LEN } else { 0 };
        let left = (f.len - f.took) as usize;
        if left > 0 {
            let n = left.min(rest.len());
            if n == 0 {
                return Err(left + dd);
            }
            let data = &rest[..n];
            f.crc = f.crc.map(|crc| crc32c_append(crc, data));
            let (cid, at) = (f.hdr.cccid, f.base + f.took);
            f.took += n as u32;
            self.take_data(cid, at, data);
            return Ok(n);
        }
        let Some(digest) = rest.get(..dd) else {
            return Err(dd);
        };
        let ok = f.crc.is_none_or(|crc| digest == crc.to_le_bytes());
        let (hdr, end) = (f.hdr, f.base + f.len);
        self.inflow = None;
        self.h2c_end(&hdr, end, ok);
        Ok(dd)
    }

    /// The H2CData PDU whose data is arriving, if one is: its command, the
    /// offset in that command's data of the next byte due, and the data
    /// bytes still due (its digest, if any, follows them). A driver may
    /// receive those bytes straight into its own buffers and report them
    /// with `landed` instead of giving them to `receive`.
    pub fn inflow(&self) -> Option<(u16, u32, u32)> {
        let f = self.inflow.as_ref()?;
        Some((f.hdr.cccid, f.base + f.took, f.len - f.took))
    }

    /// `data`, the next bytes of the arriving H2CData PDU's data (at most
    /// what `inflow` says is due), were received by the driver into its
    /// own buffers: they count, and feed the data digest, with no `Data`
    /// action. The digest and the PDU's end come through `receive`, as
    /// ever (with no digest, `receive` of no bytes ends the PDU).
    pub fn landed(&mut self, data: &[u8]) {
        let Some(f) = self.inflow.as_mut() else {
            panic!("{} bytes landed with no H2CData arriving", data.len());
        };
        assert!(
            data.len() <= (f.len - f.took) as usize,
            "{} bytes landed, {} due",
            data.len(),
            f.len - f.took
        );
        f.crc = f.crc.map(|crc| crc32c_append(crc, data));
        f.took += data.len() as u32;
    }

    /// A fatal transport error: C2HTermReq with the offending header, close.
    fn fatal(&mut self, f: Fatal, header: &[u8]) {
        let hlen = header.get(2).map_or(0, |&h| usize::from(h));
        let n = header.len().min(hlen.max(8)).min(TERM_MAX_DATA);
        self.tx.plain(Pdu::C2HTerm(TermReq {
            fes: f.fes,
            fei: f.fei,
            data: &header[..n],
        }));
        self.close();
    }

    /// Stops reading and asks the driver to close once the output is sent.
    fn close(&mut self) {
        if self.phase != Phase::Closing {
            self.phase = Phase::Closing;
            self.actions.push(Action::Close);
        }
    }

    fn on_pdu(&mut self, pdu: Pdu<'_>, digest_ok: bool) -> Result<(), Fatal> {
        match pdu {
            Pdu::IcReq(r) => {
                let digests = r.digests;
                self.decoder.digests = Some(digests);
                self.tx.set_framing(Framing {
                    digests,
                    pda: r.hpda,
                });
                let resp = IcResp {
                    pfv: 0,
                    cpda: 0,
                    digests,
                    maxh2cdata: self.limits.maxh2cdata,
                };
                self.tx.plain(Pdu::IcResp(resp));
                self.phase = Phase::Unbound;
                Ok(())
            }
            Pdu::H2CTerm(_) => {
                self.close();
                Ok(())
            }
            Pdu::CapsuleCmd(sqe, data) => {
                self.commands += 1;
                self.life().capsule(sqe, data, digest_ok)
            }
            Pdu::H2CData(h, data) => self.h2c_data(h, data, digest_ok),
            _ => Err(Fatal {
                fes: fes::INVALID_HEADER_FIELD,
                fei: 0,
            }),
        }
    }

    fn h2c_data(&mut self, h: DataHdr, data: &[u8], digest_ok: bool) -> Result<(), Fatal> {
        let got = self.check_h2c(&h, data.len())?;
        self.take_data(h.cccid, got, data);
        self.h2c_end(&h, got + data.len() as u32, digest_ok);
        Ok(())
    }

    /// Checks an H2CData header carrying `len` bytes against its command:
    /// an R2T outstanding, its TTAG, the offset it is at, the limits.
    /// Returns the command's bytes so far.
    fn check_h2c(&self, h: &DataHdr, len: usize) -> Result<u32, Fatal> {
        let range = |fei| Fatal {
            fes: fes::DATA_OUT_OF_RANGE,
            fei,
        };
        let field = |fei| Fatal {
            fes: fes::INVALID_HEADER_FIELD,
            fei,
        };
        let Some(c) = self.cmds.get(&h.cccid) else {
            return Err(field(8));
        };
        let Some((ttag, got)) = c.receiving() else {
            return Err(field(8)); // no R2T outstanding for it
        };
        if h.ttag != ttag {
            return Err(field(10));
        }
        if h.datao != got {
            return Err(range(12));
        }
        if len > self.limits.maxh2cdata as usize {
            return Err(Fatal {
                fes: fes::DATA_LIMIT_EXCEEDED,
                fei: 0,
            });
        }
        let end = u64::from(got) + len as u64;
        if end > u64::from(c.xfer) {
            return Err(range(16));
        }
        if h.last != (end == u64::from(c.xfer)) {
            return Err(field(1));
        }
        Ok(got)
    }

    /// Data of command `cid` at offset `datao` of its data: the driver's
    /// (a range of the buffer `receive` was given), or kept here.
    fn take_data(&mut self, cid: u16, datao: u32, data: &[u8]) {
        let Some(c) = self.cmds.get_mut(&cid) else {
            return;
        };
        if data.is_empty() {
        } else if c.external {
            self.actions.push(Action::Data {
                cid,
                datao,
                at: data.as_ptr() as usize - self.rx_origin,
                len: data.len() as u32,
            });
        } else {
            c.data.extend_from_slice(data);
        }
    }

    /// An H2CData PDU's data is all in: `end` bytes of its command's.
    fn h2c_end(&mut self, h: &DataHdr, end: u32, digest_ok: bool) {
        let Some(c) = self.cmds.get_mut(&h.cccid) else {
            return;
        };
        c.bad_digest |= !digest_ok;
        c.set_received(end);
        if h.last {
            self.step(h.cccid, Ev::DataIn);
        }
    }

    /// The parts a command's life moves (`cmd.rs`).
    fn life(&mut self) -> Life<'_> {
        Life {
            cmds: &mut self.cmds,
            phase: &mut self.phase,
            tx: &mut self.tx,
            actions: &mut self.actions,
            limits: &self.limits,
            auto_admit: self.auto_admit,
            external: self.external,
        }
    }

    /// Moves command `cid` on by `ev` (`Life::step`).
    fn step(&mut self, cid: u16, ev: Ev) {
        self.life().step(cid, ev);
    }

    /// An external WRITE's buffers are the driver's: its data, from the
    /// capsule, or asked for with an R2T.
    pub fn request_data(&mut self, cid: u16) -> DataStart {
        self.life().request_data(cid)
    }

    /// Appends the head of the C2HData PDU that carries an external READ's
    /// `len` bytes (its data follows, then `data_digest` bytes of digest).
    /// With `success` the PDU completes the command (SUCCESS flag): call
    /// `finish_silently`, not `finish_external`.
    pub fn c2h_head(&self, cid: u16, len: u32, success: bool, out: &mut Vec<u8>) {
        self.tx.c2h_head(cid, len, success, out);
    }

    /// Whether data PDUs carry a data digest.
    pub fn data_digest(&self) -> bool {
        self.tx.data_digest()
    }

    /// The driver completes command `cid` (an external one, or one whose
    /// device operation it ran): its completion is appended to `out`, and
    /// it is gone. False when no such command is here.
    pub fn finish_external(&mut self, cid: u16, status: Status, out: &mut Vec<u8>) -> bool {
        if self.cmds.remove(&cid).is_none() {
            return false;
        }
        let qid = self.bound().map_or(0, |c| c.qid);
        self.tx.respond_into(cid, status, 0, qid, out);
        true
    }

    /// The driver aborted command `cid` while it waited (`Life::abort_cmd`):
    /// it completes with Command Abort Requested and is gone.
    pub fn abort_cmd(&mut self, cid: u16) -> bool {
        self.life().abort_cmd(cid)
    }

    /// Command `cid` completed with a C2HData PDU flagged SUCCESS: no
    /// CapsuleResp follows, and it is gone. False when no such command is here.
    pub fn finish_silently(&mut self, cid: u16) -> bool {
        self.cmds.remove(&cid).is_some()
    }

    /// An external command's fields: the IO the queue checked.
    pub fn io_cmd(&self, cid: u16) -> Option<IoCmd> {
        self.cmds.get(&cid)?.io()
    }

    /// The target answered this queue's Connect.
    pub fn connected(&mut self, cid: u16, r: Result<Connected, (Status, u32)>) {
        if self.phase != Phase::Connecting || !self.cmds.contains_key(&cid) {
            return;
        }
        let done = match r {
            Ok(c) => {
                let result = u64::from(c.cntlid);
                self.phase = Phase::Bound(c);
                (Status::SUCCESS, result)
            }
            Err((s, dw0)) => {
                self.phase = Phase::Unbound;
                (s, u64::from(dw0))
            }
        };
        self.step(cid, Ev::Done(done.0, done.1));
    }

    /// The target finished an admin command (or a parked AER's event came).
    pub fn admin_done(&mut self, cid: u16, d: AdminDone) {
        if d.parked {
            self.step(cid, Ev::Park);
        } else {
            self.life()
                .step_data(cid, Ev::Done(d.status, d.result), d.data);
        }
    }

    /// A parked Async Event Request ended as the target says
    /// (`Target::take_events_of`): completed, or let go with no completion.
    pub fn aer_end(&mut self, cid: u16, end: Option<AdminDone>) {
        match end {
            Some(d) => self.admin_done(cid, d),
            None => self.step(cid, Ev::Release),
        }
    }

    /// The pacer admitted a data command's buffers.
    pub fn admit(&mut self, cid: u16) {
        self.step(cid, Ev::Admitted);
    }

    /// The device finished an IO: a READ's data, or an error status.
    pub fn io_done(&mut self, cid: u16, r: Result<Vec<u8>, Status>) {
        match r {
            Ok(data) => self
                .life()
                .step_data(cid, Ev::Done(Status::SUCCESS, 0), data),
            Err(s) => self.step(cid, Ev::Done(s, 0)),
        }
    }

    /// The negotiated digests (after ICReq).
    pub fn digests(&self) -> Option<Digests> {
        self.decoder.digests
    }

    /// The connection is gone: every command is dropped. Returns the ids
    /// of commands at the device (their buffers come back with `io_done`,
    /// which is then ignored) so the driver can account for them.
    pub fn abort_all(&mut self) -> Vec<u16> {
        self.phase = Phase::Closing;
        self.inflow = None;
        let busy = self
            .cmds
            .iter()
            .filter(|(_, c)| c.at_device())
            .map(|(&id, _)| id)
            .collect();
        self.cmds.clear();
        busy
    }
}
