//! What a socket hands the port: the target's send stream cut into the
//! replies (NBD) or PDUs (NVMe/TCP) its host reads.

/// Bytes of one reply handed to the port at once: the whole reply, or the
/// part of a streamed one that a send held. On an NVMe/TCP queue, a PDU
/// (or part of one) and its `cookie` the command id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub cookie: u64,
    pub bytes: u32,
    /// The reply ends with it.
    pub last: bool,
    /// What the NVMe/TCP PDU it ends tells its host.
    pub nvme: Option<NvmeMark>,
}

/// The end of an NVMe/TCP PDU the host acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmeMark {
    /// The command completed (a CapsuleResp, or C2HData flagged SUCCESS
    /// that ends `data` bytes of it), with this status field.
    Done { status: u16, data: u32 },
    /// The target asks for `len` bytes of a WRITE's data at `offset`.
    R2t { ttag: u16, offset: u32, len: u32 },
}
