//! NVMe/TCP helpers for the integration tests: a bare host on the proto
//! crate's codec (one TCP connection a queue), and SPDK's tools when they
//! are built (`../shared/spdk/build.sh`, cached in `$SPDK_DIR`, default
//! `~/.cache/iopace-spdk-v26.05`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use proto::nvme::cmd::{admin, fctype, io, sgl, Sgl, Sqe};
use proto::nvme::ctrl::Connect;
use proto::nvme::decode::{Decoded, Decoder, Role};
use proto::nvme::pdu::{DataHdr, Digests, Framing, IcReq, Pdu};

use super::{free_port, Server, MALLOC_EXPORTS};

pub const NQN: &str = "nqn.2026-11.io.iopace:default";
pub const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The namespaces' block size.
pub const BLOCK: usize = 512;

/// The SPDK build, or None (and a message) when it is not there.
pub fn spdk() -> Option<PathBuf> {
    let dir = std::env::var_os("SPDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/iopace-spdk-v26.05")
        });
    if dir.join(".built").exists() {
        return Some(dir);
    }
    eprintln!(
        "SKIPPED: no SPDK build at {} (run ../shared/spdk/build.sh, or set SPDK_DIR)",
        dir.display()
    );
    None
}

/// A server of the malloc exports, with an NVMe/TCP listener; its port.
pub fn nvme_server() -> (Server, u16) {
    let port = free_port();
    let extra = format!("nvme_tcp = [\"127.0.0.1:{port}\"]");
    let s = Server::start_full(
        &extra,
        MALLOC_EXPORTS,
        "num_shared_buffers = 256\nbuf_cache_size = 8",
    );
    (s, port)
}

/// An SPDK tool with its library path, no hugepages, and a shared-memory
/// id of its own (tests and other users may run SPDK tools at once).
pub fn tool(spdk: &Path, rel: &str, shm: u32) -> Command {
    let mut c = Command::new(spdk.join(rel));
    c.env("LD_LIBRARY_PATH", spdk.join("build/lib"));
    c.args(["--no-huge", "-s", "512", "-i"])
        .arg(shm.to_string());
    c
}

pub fn shm_id(k: u32) -> u32 {
    (std::process::id() % 10_000) * 10 + k
}

pub fn trid(port: u16, nqn: &str) -> String {
    format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}")
}

/// A tool's stdout and stderr, carriage returns made newlines.
pub fn text(o: &std::process::Output) -> String {
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    s.replace('\r', "\n")
}

/// A bare NVMe/TCP host over one TCP connection.
pub struct Host {
    pub s: TcpStream,
    dec: Decoder,
    buf: Vec<u8>,
}

impl Host {
    pub fn connect(port: u16) -> Host {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut h = Host {
            s,
            dec: Decoder::new(Role::Host, 1 << 20),
            buf: Vec::new(),
        };
        let ic = IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        };
        h.send(Pdu::IcReq(ic));
        let r = h.recv();
        assert_eq!(r.0, 1, "ICResp");
        h.dec.digests = Some(Digests::default());
        h
    }

    pub fn send(&mut self, p: Pdu<'_>) {
        assert!(self.try_send(p), "send");
    }

    /// Sends a PDU; false if the connection is gone.
    pub fn try_send(&mut self, p: Pdu<'_>) -> bool {
        let mut b = Vec::new();
        p.encode(&mut b, Framing::default());
        self.s.write_all(&b).is_ok()
    }

    /// The next PDU: (type, its bytes); type 0xFF on EOF.
    pub fn recv(&mut self) -> (u8, Vec<u8>) {
        loop {
            if let Ok(Decoded::Pdu { pdu, len, .. }) = self.dec.decode(&self.buf) {
                let t = pdu.type_code();
                let b: Vec<u8> = self.buf.drain(..len).collect();
                return (t, b);
            }
            let mut chunk = [0u8; 65536];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return (0xFF, Vec::new()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Sends a command, returns the completion's status (SCT << 8 | SC) and dword 0.
    pub fn command(&mut self, sqe: Sqe, data: &[u8]) -> (u16, u32) {
        self.send(Pdu::CapsuleCmd(sqe, data));
        loop {
            let (t, b) = self.recv();
            assert_ne!(t, 0xFF, "connection closed");
            if t == 7 && b[1] & 0x08 != 0 {
                // C2HData flagged SUCCESS: the command completed, no CapsuleResp.
                return (0, 0);
            }
            if t == 5 {
                return (status(&b), u32::from_le_bytes([b[8], b[9], b[10], b[11]]));
            }
        }
    }
}

/// A CapsuleResp's status: SC in bits 7:0, SCT in 10:8 (DNR and More left out).
pub fn status(resp: &[u8]) -> u16 {
    (u16::from_le_bytes([resp[22], resp[23]]) >> 1) & 0x7FF
}

/// A Connect of queue `qid` (KATO `kato_ms`) to the default export's
/// subsystem: its capsule and data.
pub fn connect_cmd(qid: u16, kato_ms: u32, cntlid: u16) -> (Sqe, Vec<u8>) {
    let c = Connect {
        qid,
        sqsize: 31,
        kato_ms,
        hostid: [0; 16],
        cntlid,
        subnqn: NQN,
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:raw-host",
    };
    (c.sqe(1), c.data())
}

/// An admin queue connected (KATO `kato_ms`) and enabled; its controller id.
pub fn admin_queue(port: u16, kato_ms: u32) -> (Host, u16) {
    let mut a = Host::connect(port);
    let (s, d) = connect_cmd(0, kato_ms, 0xFFFF);
    let (st, cntlid) = a.command(s, &d);
    assert_eq!(st, 0, "admin connect");
    let mut p = Sqe::new(admin::FABRICS, 2);
    p.0[4] = fctype::PROPERTY_SET;
    p.set_cdw(11, 0x14);
    p.set_cdw(12, 0x0046_0001);
    assert_eq!(a.command(p, &[]).0, 0, "CC.EN");
    (a, cntlid as u16)
}

/// IO queue `qid` of controller `cntlid`, connected.
pub fn io_queue(port: u16, cntlid: u16, qid: u16) -> Host {
    let mut q = Host::connect(port);
    let (s, d) = connect_cmd(qid, 0, cntlid);
    assert_eq!(q.command(s, &d).0, 0, "IO queue {qid} connect");
    q
}

/// A READ or WRITE of `len` bytes at block `lba` whose data moves in
/// data PDUs (R2T and H2CData, or C2HData); FUA if asked.
pub fn rw_sqe(opcode: u8, cid: u16, lba: u32, len: usize, fua: bool) -> Sqe {
    let mut w = Sqe::new(opcode, cid);
    w.set_nsid(1);
    w.set_cdw(10, lba);
    w.set_cdw(12, (len / BLOCK - 1) as u32 | if fua { 1 << 30 } else { 0 });
    w.set_sgl(Sgl {
        address: 0,
        length: len as u32,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    w
}

/// A WRITE of 1 MiB at block `lba` whose data comes by R2T.
pub fn big_write(cid: u16, lba: u32) -> Sqe {
    rw_sqe(io::WRITE, cid, lba, 1 << 20, false)
}

/// A 1 MiB WRITE at `lba`, its data sent as the R2Ts ask; its status.
pub fn write_by_r2t(q: &mut Host, cid: u16, lba: u32) -> u16 {
    write_blocks(q, cid, lba, &vec![0x3C; 1 << 20], false).expect("connection closed")
}

/// A WRITE of `data` at block `lba`, its data sent as the R2Ts ask; its
/// status, or None if the connection went first.
pub fn write_blocks(q: &mut Host, cid: u16, lba: u32, data: &[u8], fua: bool) -> Option<u16> {
    if !q.try_send(Pdu::CapsuleCmd(
        rw_sqe(io::WRITE, cid, lba, data.len(), fua),
        &[],
    )) {
        return None;
    }
    loop {
        let (t, b) = q.recv();
        match t {
            // An R2T: its tag, offset and length.
            9 => {
                let ttag = u16::from_le_bytes([b[10], b[11]]);
                let at = u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
                let len = u32::from_le_bytes([b[16], b[17], b[18], b[19]]) as usize;
                for off in (at..at + len).step_by(128 << 10) {
                    let end = (off + (128 << 10)).min(at + len);
                    let h = DataHdr {
                        cccid: cid,
                        ttag,
                        datao: off as u32,
                        last: end == at + len,
                        success: false,
                    };
                    if !q.try_send(Pdu::H2CData(h, &data[off..end])) {
                        return None;
                    }
                }
            }
            5 => return Some(status(&b)),
            0xFF => return None,
            t => panic!("PDU type {t} during a WRITE"),
        }
    }
}

/// A READ of `len` bytes at block `lba`: its status and data.
pub fn read_blocks(q: &mut Host, cid: u16, lba: u32, len: usize) -> (u16, Vec<u8>) {
    q.send(Pdu::CapsuleCmd(rw_sqe(io::READ, cid, lba, len, false), &[]));
    let mut data = vec![0u8; len];
    loop {
        let (t, b) = q.recv();
        match t {
            // C2HData: PDO, DATAO and DATAL place its data.
            7 => {
                let pdo = usize::from(b[3]);
                let at = u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
                let n = u32::from_le_bytes([b[16], b[17], b[18], b[19]]) as usize;
                data[at..at + n].copy_from_slice(&b[pdo..pdo + n]);
                if b[1] & 0x08 != 0 {
                    return (0, data);
                }
            }
            5 => return (status(&b), data),
            t => panic!("PDU type {t} during a READ"),
        }
    }
}

/// A FLUSH of namespace 1: its status.
pub fn flush(q: &mut Host, cid: u16) -> u16 {
    let mut f = Sqe::new(io::FLUSH, cid);
    f.set_nsid(1);
    q.command(f, &[]).0
}
