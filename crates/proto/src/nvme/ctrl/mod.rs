//! The NVMe-oF controller side, sans-IO: subsystems and their namespaces,
//! controllers (Fabrics Connect, properties, admin commands, keep-alive,
//! async events) and the discovery controller. The clock is injected
//! (`Nanos`); a driver holds one `Target` for all connections.

mod connect;
mod controller;
mod io;
pub mod pages;
mod target;

pub use connect::{Connect, CONNECT_DATA_LEN};
pub use controller::Controller;
pub use io::{check_io, dsm_ranges, IoCmd, IoOp};
pub use pages::VERSION;
pub use target::{AdminDone, Connected, IoAbort, Target};

/// Nanoseconds on the driver's clock.
pub type Nanos = u64;

/// The well-known NQN of the discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// One namespace of a subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub nsid: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    /// log2 of the logical block size (9 for 512 bytes, 12 for 4 KiB).
    pub lba_shift: u8,
    pub read_only: bool,
    /// Globally unique id, also given as the UUID.
    pub nguid: [u8; 16],
    /// Deallocated blocks read as zeros (Identify Namespace's DLFEAT says
    /// so only then).
    pub dealloc_zeroes: bool,
}

impl Namespace {
    /// A namespace of `bytes` (rounded down to whole blocks) with an NGUID
    /// derived from the subsystem NQN, so it is stable across restarts.
    pub fn new(nsid: u32, bytes: u64, lba_shift: u8, subnqn: &str) -> Namespace {
        let mut nguid = [0u8; 16];
        let a = crc32c::crc32c(subnqn.as_bytes());
        let b = crc32c::crc32c_append(a, &nsid.to_le_bytes());
        nguid[..4].copy_from_slice(&a.to_be_bytes());
        nguid[4..8].copy_from_slice(&b.to_be_bytes());
        nguid[8..12].copy_from_slice(b"iopa");
        nguid[12..].copy_from_slice(&nsid.to_be_bytes());
        Namespace {
            nsid,
            blocks: bytes >> lba_shift,
            lba_shift,
            read_only: false,
            nguid,
            dealloc_zeroes: true,
        }
    }

    pub fn block_size(&self) -> u64 {
        1 << self.lba_shift
    }
}

/// An NVM subsystem: its NQN, namespaces and the hosts it admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub namespaces: Vec<Namespace>,
    /// Host NQNs allowed to connect; None lets every host in.
    pub hosts: Option<Vec<String>>,
}

impl Subsystem {
    pub fn allows(&self, hostnqn: &str) -> bool {
        self.hosts
            .as_ref()
            .is_none_or(|h| h.iter().any(|n| n == hostnqn))
    }

    pub fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }
}

/// A TCP listener the discovery log reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub traddr: String,
    pub trsvcid: String,
    pub ipv6: bool,
}

/// Limits every controller advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most IO queues per controller.
    pub max_io_queues: u16,
    /// Most entries of an IO queue (CAP.MQES + 1).
    pub max_queue_size: u16,
    /// Most entries of the admin queue (the discovery log's ASQSZ).
    pub max_admin_queue_size: u16,
    /// Most bytes one command transfers (MDTS, a power of two times 4 KiB).
    pub max_transfer: u32,
    /// Most bytes of in-capsule data on IO queues (admin queues take 8 KiB).
    pub in_capsule: u32,
    /// Most data bytes in one H2CData PDU.
    pub maxh2cdata: u32,
    /// Keep-alive timeout when the host asks for none, in ms (0: none).
    pub default_kato_ms: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_io_queues: 64,
            max_queue_size: 128,
            // The spec's largest (ASQS is 12 bits, 0's based) and SPDK's
            // target's `max_aq_depth` ceiling; it defaults to 128. Entries
            // cost nothing until used, and an admin command completes at
            // once (Async Event Requests, the only ones held, are capped by
            // AERL).
            max_admin_queue_size: MAX_ADMIN_QUEUE,
            max_transfer: 1 << 20,
            in_capsule: 8192,
            maxh2cdata: 128 << 10,
            default_kato_ms: 0,
        }
    }
}

/// Async Event Requests a controller holds at once (Identify's AERL is
/// this less one); one more is refused with Asynchronous Event Request
/// Limit Exceeded.
pub const MAX_AERS: usize = 4;
/// Abort commands a controller takes at once (Identify's ACL, 0's based,
/// is this less one). Only an Abort of an IO command waits (for its IO
/// queue's driver); one more is refused with Abort Command Limit Exceeded.
pub const MAX_ABORTS: u8 = 4;

/// The most entries an admin queue may have (NVMe: ASQS, 12 bits).
pub const MAX_ADMIN_QUEUE: u16 = 4096;

/// The admin queue's in-capsule data limit the transport guarantees.
pub const ADMIN_IN_CAPSULE: u32 = 8192;

impl Limits {
    /// MDTS: the transfer limit as a power of two of 4 KiB pages.
    pub fn mdts(&self) -> u8 {
        let pages = (self.max_transfer >> 12).max(1);
        pages.ilog2() as u8
    }
}
