//! NVMe over TCP, sans-IO: the PDU codec (`pdu`, `decode`), NVMe command
//! and completion entries (`cmd`). Knows nothing of sockets or threads.

pub mod cmd;
pub mod decode;
pub mod fuzzing;
pub mod pdu;

#[cfg(test)]
mod pdu_tests;

pub use cmd::{Cqe, Sgl, Sqe, Status};
pub use decode::{Decoded, Decoder, Fatal, Role};
pub use pdu::{DataHdr, Digests, Framing, IcReq, IcResp, Pdu, R2t, TermReq};
