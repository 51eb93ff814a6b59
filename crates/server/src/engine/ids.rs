//! Typed identifiers: connections, request slots, and the token one IO (a
//! whole request, or one piece of a WRITE payload) carries through the pacer,
//! the buffer pool and the device.

/// A connection: its slot and the slot's generation, so a completion for a
/// connection that has since closed (and whose slot was reused) is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    pub index: u32,
    /// 24 bits: what fits beside the index in a completion's user data.
    pub gen: u32,
}

pub const GEN_MASK: u32 = 0xff_ffff;

/// A request slot of one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u32);

impl ReqId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Which part of a request an IO covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// The whole request (READ, and commands without data).
    Whole,
    /// One buffer-sized piece of a WRITE payload.
    Piece(u32),
}

/// Most pieces one WRITE may have: what fits in the token's 24 part bits.
pub const MAX_PIECES: u32 = (1 << 24) - 2;

/// One IO of a request: its id in the pacer and the buffer pool, and its tag
/// at the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoToken {
    pub req: ReqId,
    pub part: Part,
}

impl IoToken {
    pub fn whole(req: ReqId) -> IoToken {
        IoToken {
            req,
            part: Part::Whole,
        }
    }

    pub fn piece(req: ReqId, piece: u32) -> IoToken {
        IoToken {
            req,
            part: Part::Piece(piece),
        }
    }

    /// 56 bits: the request in the low 32, the part in the next 24.
    pub fn encode(self) -> u64 {
        let part = match self.part {
            Part::Whole => 0,
            Part::Piece(k) => {
                debug_assert!(k <= MAX_PIECES, "piece {k} past the token's range");
                u64::from(k) + 1
            }
        };
        (part << 32) | u64::from(self.req.0)
    }

    pub fn decode(v: u64) -> IoToken {
        let req = ReqId(v as u32);
        let part = match ((v >> 32) & 0xff_ffff) as u32 {
            0 => Part::Whole,
            k => Part::Piece(k - 1),
        };
        IoToken { req, part }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips() {
        for req in [0, 1, 4095, u32::MAX] {
            for part in [
                Part::Whole,
                Part::Piece(0),
                Part::Piece(7),
                Part::Piece(MAX_PIECES),
            ] {
                let t = IoToken {
                    req: ReqId(req),
                    part,
                };
                let v = t.encode();
                assert!(v < 1 << 56, "leaves the top byte free");
                assert_eq!(IoToken::decode(v), t);
            }
        }
    }
}
