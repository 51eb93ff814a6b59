//! The data structures admin commands return: Identify (controller,
//! namespace, active namespace list, namespace identification descriptors)
//! and log pages (error, SMART/health, changed namespace list, discovery).
//! Pure functions of the controller's view; byte offsets follow NVMe 1.4
//! and NVMe over Fabrics 1.1.

use super::{Limits, Listener, Namespace, Subsystem};

/// NVMe version 1.4 (VS and Identify Controller's VER).
pub const VERSION: u32 = 0x0001_0400;
/// PCI vendor id field: none (the fabrics target is software).
const VENDOR: u16 = 0;
/// The firmware revision: Identify Controller's FR and firmware slot 1's.
const FIRMWARE: &str = env!("CARGO_PKG_VERSION");

/// The warning composite temperature threshold (70 C), in kelvin: WCTEMP,
/// and the Temperature Threshold feature's default.
pub const WARNING_TEMP_K: u16 = 343;

/// The critical composite temperature threshold (100 C): CCTEMP.
const CRITICAL_TEMP_K: u16 = 373;

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// An ASCII field padded with spaces.
fn put_str(b: &mut [u8], at: usize, len: usize, s: &str) {
    let s = s.as_bytes();
    let n = s.len().min(len);
    b[at..at + n].copy_from_slice(&s[..n]);
    b[at + n..at + len].fill(b' ');
}

/// An NQN field: NUL-terminated, at most 255 bytes of name in 256.
fn put_nqn(b: &mut [u8], at: usize, nqn: &str) {
    let s = nqn.as_bytes();
    let n = s.len().min(255);
    b[at..at + n].copy_from_slice(&s[..n]);
}

/// What Identify Controller describes.
pub struct CtrlView<'a> {
    pub cntlid: u16,
    /// None for the discovery controller.
    pub subsys: Option<&'a Subsystem>,
    pub limits: &'a Limits,
    pub io_queue_size: u16,
}

/// Identify Controller (CNS 01h), 4096 bytes.
pub fn identify_controller(v: &CtrlView<'_>) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    put(&mut b, 0, &VENDOR.to_le_bytes());
    put(&mut b, 2, &VENDOR.to_le_bytes());
    let (serial, model, nqn) = match v.subsys {
        Some(s) => (s.serial.as_str(), s.model.as_str(), s.nqn.as_str()),
        None => ("iopace-discovery", "iopace discovery", super::DISCOVERY_NQN),
    };
    put_str(&mut b, 4, 20, serial);
    put_str(&mut b, 24, 40, model);
    put_str(&mut b, 64, 8, FIRMWARE);
    b[72] = 6; // RAB: recommended arbitration burst
    b[76] = 0b011; // CMIC: several ports and controllers may share the NVM
    b[77] = v.limits.mdts();
    put(&mut b, 78, &v.cntlid.to_le_bytes());
    put(&mut b, 80, &VERSION.to_le_bytes());
    // OAES: namespace attribute notices (bit 8), where there are
    // namespaces; a discovery controller has none to notice.
    let oaes: u32 = if v.subsys.is_some() { 1 << 8 } else { 0 };
    put(&mut b, 92, &oaes.to_le_bytes());
    // CTRATT: 128-bit host id (bit 0); traffic based keep alive (bit 6): any
    // command restarts the keep-alive timer, not only Keep Alive.
    put(&mut b, 96, &(1u32 | 1 << 6).to_le_bytes());
    b[111] = if v.subsys.is_some() { 1 } else { 2 }; // CNTRLTYPE: IO or discovery
    b[258] = super::MAX_ABORTS - 1; // ACL, 0's based
    b[259] = super::MAX_AERS as u8 - 1; // AERL, 0's based
    if v.subsys.is_some() {
        // FRMW: one firmware slot (the spec allows 1 to 7, never 0), read-only.
        b[260] = (1 << 1) | 1;
    }
    b[261] = 0b0000_0100; // LPA: extended data for Get Log Page
    if v.subsys.is_some() {
        // WCTEMP and CCTEMP (kelvin): the spec asks NVMe 1.2+ controllers
        // for non-zero thresholds; the warning one is the Temperature
        // Threshold feature's default.
        put(&mut b, 266, &WARNING_TEMP_K.to_le_bytes());
        put(&mut b, 268, &CRITICAL_TEMP_K.to_le_bytes());
    }
    b[262] = 0; // ELPE: one error log entry, 0's based
    put(&mut b, 320, &10u16.to_le_bytes()); // KAS: 100 ms units -> 1 s granularity
    b[512] = 0x66; // SQES: 64 bytes
    b[513] = 0x44; // CQES: 16 bytes
    put(&mut b, 514, &v.io_queue_size.to_le_bytes()); // MAXCMD
    if let Some(s) = v.subsys {
        let nn = s.namespaces.iter().map(|n| n.nsid).max().unwrap_or(0);
        put(&mut b, 516, &nn.to_le_bytes());
        // ONCS: DSM (bit 2) and Write Zeroes (bit 3).
        put(&mut b, 520, &0b1100u16.to_le_bytes());
        b[525] = 1; // VWC: a volatile write cache; Flush matters
    }
    // SGLS: SGLs supported (bits 1:0 = 01), offsets in data blocks (bit 20).
    put(&mut b, 536, &(1u32 | (1 << 20)).to_le_bytes());
    put_nqn(&mut b, 768, nqn);
    // Fabrics: IOCCSZ (16-byte units: the 64-byte SQE and in-capsule data),
    // IORCSZ (one 16-byte CQE), ICDOFF 0, MSDBD 1.
    let ioccsz = (64 + v.limits.in_capsule) / 16;
    put(&mut b, 1792, &ioccsz.to_le_bytes());
    put(&mut b, 1796, &1u32.to_le_bytes());
    b[1803] = 1;
    b
}

/// Identify Namespace (CNS 00h), 4096 bytes; all zero for an inactive id.
/// `write_protected`: this host may only read it.
pub fn identify_namespace(ns: Option<&Namespace>, write_protected: bool) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let Some(ns) = ns else {
        return b;
    };
    put(&mut b, 0, &ns.blocks.to_le_bytes()); // NSZE
    put(&mut b, 8, &ns.blocks.to_le_bytes()); // NCAP
    put(&mut b, 16, &ns.blocks.to_le_bytes()); // NUSE
    b[24] = 0; // NSFEAT
    b[25] = 0; // NLBAF: one format, 0's based
    b[26] = 0; // FLBAS: format 0
    b[33] = u8::from(ns.dealloc_zeroes); // DLFEAT: zeros after deallocate (001b), else 000b
    b[30] = 1; // NMIC: may be shared by controllers
    b[99] = u8::from(ns.read_only || write_protected); // NSATTR: write protected
                                                       // NGUID
    put(&mut b, 104, &ns.nguid);
    // LBAF0: no metadata, LBADS, relative performance best.
    put(&mut b, 128, &(u32::from(ns.lba_shift) << 16).to_le_bytes());
    b
}

/// Active Namespace ID list (CNS 02h): ids above `after`, ascending.
pub fn active_namespaces(s: Option<&Subsystem>, after: u32) -> Vec<u8> {
    let mut ids: Vec<u32> = s
        .map(|s| s.namespaces.iter().map(|n| n.nsid).collect())
        .unwrap_or_default();
    ids.sort_unstable();
    let mut b = vec![0u8; 4096];
    for (i, id) in ids
        .into_iter()
        .filter(|&id| id > after)
        .take(1024)
        .enumerate()
    {
        put(&mut b, 4 * i, &id.to_le_bytes());
    }
    b
}

/// Namespace Identification Descriptor list (CNS 03h): NGUID, UUID, CSI.
pub fn namespace_descriptors(ns: &Namespace) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    put(&mut b, 0, &[2, 16, 0, 0]); // NGUID
    put(&mut b, 4, &ns.nguid);
    let mut uuid = ns.nguid;
    uuid[6] = (uuid[6] & 0x0F) | 0x80; // a version 8 (custom) UUID
    uuid[8] = (uuid[8] & 0x3F) | 0x80;
    put(&mut b, 20, &[3, 16, 0, 0]); // UUID
    put(&mut b, 24, &uuid);
    put(&mut b, 40, &[4, 1, 0, 0, 0]); // CSI: NVM command set
    b
}

/// Error Information log: one entry (64 bytes), the error count so far.
pub fn error_log(errors: u64) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    put(&mut b, 0, &errors.to_le_bytes());
    b
}

/// Firmware Slot Information log (512 bytes), mandatory for an I/O
/// controller: slot 1 active, holding this build's revision.
pub fn firmware_slot_log() -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1; // AFI: slot 1 active, no other slot at the next reset
    put_str(&mut b, 8, 8, FIRMWARE); // FRS1
    b
}

/// SMART / Health Information log (512 bytes).
pub fn smart_log(units_read: u64, units_written: u64) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    put(&mut b, 1, &300u16.to_le_bytes()); // composite temperature, kelvin
    b[3] = 100; // available spare
    b[4] = 10; // spare threshold
    put(&mut b, 32, &units_read.to_le_bytes()); // data units read (1000 x 512 B)
    put(&mut b, 48, &units_written.to_le_bytes());
    b
}

/// Changed Namespace List log (4096 bytes of namespace ids).
pub fn changed_namespaces(ids: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    if ids.len() > 1024 {
        put(&mut b, 0, &u32::MAX.to_le_bytes()); // more than 1024 changed
        return b;
    }
    for (i, id) in ids.iter().enumerate() {
        put(&mut b, 4 * i, &id.to_le_bytes());
    }
    b
}

/// Discovery log page: a 1024-byte header, then one 1024-byte entry per
/// subsystem the host may see, per listener; `asqsz`: the most entries of
/// an admin queue.
pub fn discovery_log(
    subs: &[&Subsystem],
    listeners: &[Listener],
    genctr: u64,
    asqsz: u16,
) -> Vec<u8> {
    let n = subs.len() * listeners.len();
    let mut b = vec![0u8; 1024 * (1 + n)];
    put(&mut b, 0, &genctr.to_le_bytes());
    put(&mut b, 8, &(n as u64).to_le_bytes());
    let mut at = 1024;
    for s in subs {
        for (port, l) in listeners.iter().enumerate() {
            let e = &mut b[at..at + 1024];
            e[0] = 3; // TRTYPE: TCP
            e[1] = if l.ipv6 { 2 } else { 1 }; // ADRFAM
            e[2] = 2; // SUBTYPE: NVM subsystem
            e[3] = 0b10; // TREQ: secure channel not required
            put(e, 4, &(port as u16).to_le_bytes()); // PORTID
            put(e, 6, &0xFFFFu16.to_le_bytes()); // CNTLID: dynamic
            put(e, 8, &asqsz.to_le_bytes()); // ASQSZ
            put_str(e, 32, 32, &l.trsvcid);
            put_nqn(e, 256, &s.nqn);
            put_str(e, 512, 256, &l.traddr);
            // TSAS for TCP: SECTYPE 0, none.
            at += 1024;
        }
    }
    b
}

/// The part of a log page at `offset`, `len` bytes, zero past its end.
pub fn slice_log(page: &[u8], offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    if let Ok(start) = usize::try_from(offset) {
        if start < page.len() {
            let n = (page.len() - start).min(len);
            out[..n].copy_from_slice(&page[start..start + n]);
        }
    }
    out
}
