//! What a completion is for: the tag each SQE carries in its user data,
//! decoded when the completion comes back.

use crate::engine::{ConnId, IoToken};

/// What a completion is for: the tag each SQE carries in its user data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// The inbox's eventfd.
    Event,
    Recv(ConnId),
    Send(ConnId),
    /// A splicing send's socket became writable (a poll).
    Splice(ConnId),
    /// A TLS connection's ciphertext receive, into its session's buffer.
    TlsRecv(ConnId),
    /// A TLS connection's ciphertext send, from its session's output.
    TlsSend(ConnId),
    /// A device IO's SQE; `link` for an earlier SQE of a linked chain, which
    /// completes only on error.
    Io {
        io: IoToken,
        link: bool,
    },
}

// Layout: the kind in the top 4 bits; a connection's generation (24 bits)
// above its index (32 bits); an IO's 56-bit token, with bit 56 for `link`.
const OP_EVENT: u64 = 1;
const OP_RECV: u64 = 2;
const OP_SEND: u64 = 3;
const OP_IO: u64 = 4;
const OP_SPLICE: u64 = 5;
const OP_TLS_RECV: u64 = 6;
const OP_TLS_SEND: u64 = 7;

impl Op {
    pub(super) fn encode(self) -> u64 {
        let conn = |c: ConnId| (u64::from(c.gen) << 32) | u64::from(c.index);
        match self {
            Op::Event => OP_EVENT << 60,
            Op::Recv(c) => (OP_RECV << 60) | conn(c),
            Op::Send(c) => (OP_SEND << 60) | conn(c),
            Op::Splice(c) => (OP_SPLICE << 60) | conn(c),
            Op::TlsRecv(c) => (OP_TLS_RECV << 60) | conn(c),
            Op::TlsSend(c) => (OP_TLS_SEND << 60) | conn(c),
            Op::Io { io, link } => (OP_IO << 60) | (u64::from(link) << 56) | io.encode(),
        }
    }

    pub(super) fn decode(v: u64) -> Option<Op> {
        let conn = || ConnId {
            index: v as u32,
            gen: ((v >> 32) & 0xff_ffff) as u32,
        };
        Some(match v >> 60 {
            OP_EVENT => Op::Event,
            OP_RECV => Op::Recv(conn()),
            OP_SEND => Op::Send(conn()),
            OP_SPLICE => Op::Splice(conn()),
            OP_TLS_RECV => Op::TlsRecv(conn()),
            OP_TLS_SEND => Op::TlsSend(conn()),
            OP_IO => Op::Io {
                io: IoToken::decode(v & ((1 << 56) - 1)),
                link: (v >> 56) & 1 == 1,
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ReqId;

    #[test]
    fn op_round_trips() {
        let conn = ConnId {
            index: u32::MAX,
            gen: crate::engine::GEN_MASK,
        };
        let ops = [
            Op::Event,
            Op::Recv(conn),
            Op::Send(ConnId { index: 3, gen: 1 }),
            Op::Splice(ConnId { index: 9, gen: 2 }),
            Op::TlsRecv(ConnId { index: 4, gen: 5 }),
            Op::TlsSend(conn),
            Op::Io {
                io: IoToken::whole(ReqId(u32::MAX)),
                link: false,
            },
            Op::Io {
                io: IoToken::piece(ReqId(7), crate::engine::MAX_PIECES),
                link: true,
            },
        ];
        for op in ops {
            assert_eq!(Op::decode(op.encode()), Some(op), "{op:?}");
        }
        assert_eq!(Op::decode(0), None);
    }
}
