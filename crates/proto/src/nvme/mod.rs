//! NVMe over TCP, sans-IO: the PDU codec (`pdu`, `decode`), NVMe command
//! and completion entries (`cmd`), the controller side of NVMe over Fabrics
//! (`ctrl`: subsystems, controllers, discovery) and one connection's queue
//! (`queue`: PDU sequence and each command's life). Knows nothing of
//! sockets, threads or clocks.

pub mod cmd;
pub mod ctrl;
pub mod decode;
pub mod fuzzing;
pub mod pdu;
pub mod queue;

#[cfg(test)]
mod pdu_tests;

pub use cmd::{Cqe, Sgl, Sqe, Status};
pub use decode::{Decoded, Decoder, Fatal, Role};
pub use pdu::{DataHdr, Digests, Framing, IcReq, IcResp, Pdu, R2t, TermReq};
