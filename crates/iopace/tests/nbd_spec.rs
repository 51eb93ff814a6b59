//! Corners of the NBD spec (NetworkBlockDevice/nbd `doc/proto.md`) that
//! everyday use does not reach (an unfragmented READ, a filesystem that
//! fills up, a client idle for long), checked on the real binary with a
//! raw client that speaks structured replies, and with qemu-io.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;

use common::*;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLAG_DF: u16 = 1 << 2;
const OPT_STRUCTURED_REPLY: u32 = 8;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_ERROR: u16 = 0x8001;
const ENOSPC: u32 = 28;

/// One reply chunk: (flags, type, payload).
type Chunk = (u16, u16, Vec<u8>);

fn be(b: &[u8]) -> u64 {
    b.iter().fold(0, |v, &x| v << 8 | u64::from(x))
}

/// A raw client in `export` with structured replies.
fn structured(server: &Server, export: &str) -> RawClient<UnixStream> {
    let s = UnixStream::connect(&server.sock).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .expect("timeout");
    let mut c = RawClient { s };
    c.greet();
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply().1, 1, "structured replies acknowledged");
    c.go(export);
    c
}

/// The chunks of the reply to `cookie`, up to the one flagged done; a
/// simple reply (the server's answer to commands other than READ) as a
/// done chunk of type NONE, or ERROR with its error.
fn reply(c: &mut RawClient<UnixStream>, cookie: u64) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    loop {
        let mut h = c.read_exact(16);
        if be(&h[..4]) == 0x6744_6698 {
            assert_eq!(be(&h[8..16]), cookie);
            let error = h[4..8].to_vec();
            return match be(&error) {
                0 => vec![(1, REPLY_TYPE_NONE, Vec::new())],
                _ => vec![(1, REPLY_TYPE_ERROR, error)],
            };
        }
        h.extend(c.read_exact(4));
        assert_eq!(be(&h[..4]), 0x668e_33ef, "structured reply magic");
        let (flags, typ) = (be(&h[4..6]) as u16, be(&h[6..8]) as u16);
        assert_eq!(be(&h[8..16]), cookie);
        let payload = c.read_exact(be(&h[16..20]) as usize);
        chunks.push((flags, typ, payload));
        if flags & 1 != 0 {
            return chunks;
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i / 512) as u8 ^ seed).collect()
}

/// NBD_CMD_FLAG_DF: "the server MUST send at most one content chunk".
/// A READ longer than a stream's window (4 buffers of 128 KiB) streams
/// through the pool in pieces; with DF it still goes out as one
/// OFFSET_DATA chunk, then NONE. A piece the device fails is sent as
/// zeroes and the reply ends with its error (the spec's padding), and
/// the connection goes on.
#[test]
fn a_df_read_is_one_data_chunk_even_when_it_streams_or_fails() {
    let body = "[[bdev]]\nname = \"m0\"\nkind = \"malloc\"\nsize = \"64MiB\"\n\n\
         [[bdev]]\nname = \"flaky\"\nkind = \"fault\"\nbase = \"m0\"\n\
         ops = [\"read\"]\nerrno = \"ENOSPC\"\n\
         fail_range = { offset = 1572864, length = 1 }\n\n\
         [[export]]\nname = \"default\"\nbdev = \"m0\"\n\n\
         [[export]]\nname = \"flaky\"\nbdev = \"flaky\"\n";
    let server = Server::start_with(
        body,
        "buffer_size = \"128KiB\"\nnum_shared_buffers = 64\nbuf_cache_size = 4",
    );
    let len = 2 << 20;
    let data = pattern(len, 0x5a);
    let mut c = structured(&server, "default");
    c.request(CMD_WRITE, 0, 1, 0, len as u32);
    c.s.write_all(&data).expect("payload");
    assert_eq!(reply(&mut c, 1), vec![(1, REPLY_TYPE_NONE, Vec::new())]);
    for (cookie, export) in [(2, "default"), (3, "flaky")] {
        let mut c = structured(&server, export);
        c.request(CMD_READ, CMD_FLAG_DF, cookie, 0, len as u32);
        let chunks = reply(&mut c, cookie);
        let types: Vec<(u16, u16)> = chunks.iter().map(|x| (x.0, x.1)).collect();
        let end = if export == "flaky" {
            REPLY_TYPE_ERROR
        } else {
            REPLY_TYPE_NONE
        };
        assert_eq!(types, [(0, REPLY_TYPE_OFFSET_DATA), (1, end)], "{export}");
        let (offset, got) = chunks[0].2.split_at(8);
        assert_eq!((be(offset), got.len()), (0, len), "{export}");
        if export == "flaky" {
            assert_eq!(be(&chunks[1].2[..4]) as u32, ENOSPC);
            // The failed piece (1.5 MiB..1.625 MiB) is zeroes, the rest data.
            let bad = 1536 << 10..1664 << 10;
            assert!(got[bad.clone()].iter().all(|&b| b == 0));
            assert_eq!(got[..bad.start], data[..bad.start]);
            assert_eq!(got[bad.end..], data[bad.end..]);
        } else {
            assert!(got == &data[..], "data read back");
        }
        // The connection goes on.
        c.request(CMD_READ, 0, 9, 0, 4096);
        let chunks = reply(&mut c, 9);
        assert_eq!(chunks[0].2[8..], data[..4096]);
    }
    server.assert_quiescent(64);
}

/// A tmpfs of `size` mounted on a temporary directory, unmounted on drop.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    /// None where this machine cannot mount one (not root).
    fn mount(size: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(SmallFs { dir }),
            other => {
                eprintln!("SKIPPED: cannot mount a tmpfs here: {other:?}");
                None
            }
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// A thin file export whose filesystem fills up: the write the filesystem
/// cuts short, and every one after it, gets ENOSPC (the spec's error for
/// a full device; qemu pauses its guest on it, werror=enospc, but fails
/// the guest's write on EIO, which the short one got), so do writes of
/// zeroes, and a trim makes room again.
#[test]
fn writes_into_a_full_filesystem_get_enospc_not_eio() {
    const CMD_TRIM: u16 = 4;
    const CMD_WRITE_ZEROES: u16 = 6;
    const NO_HOLE: u16 = 1 << 1;
    let Some(fs) = SmallFs::mount("4M") else {
        return;
    };
    let img = fs.dir.path().join("thin.img");
    let body = format!(
        "[[bdev]]\nname = \"f0\"\nkind = \"file\"\npath = \"{}\"\nsize = \"16MiB\"\n\n\
         [[export]]\nname = \"default\"\nbdev = \"f0\"\n",
        img.display()
    );
    let server = Server::start(&body);
    let mut c = raw_unix(&server, "default");
    let mib = vec![0x55u8; 1 << 20];
    let mut errors = Vec::new();
    for i in 0..8u64 {
        // Not page aligned, so the filesystem fills part way through one.
        c.request(CMD_WRITE, 0, i, (i << 20) + 100, 1 << 20);
        c.s.write_all(&mib).expect("payload");
        errors.push(c.simple_reply().0);
    }
    let full = errors.iter().position(|&e| e != 0).expect("the disk fills");
    assert!(full > 0, "{errors:?}");
    assert!(errors[full..].iter().all(|&e| e == ENOSPC), "{errors:?}");
    c.request(CMD_WRITE_ZEROES, NO_HOLE, 20, 12 << 20, 1 << 20);
    assert_eq!(c.simple_reply(), (ENOSPC, 20), "zeroes written");
    c.request(CMD_TRIM, 0, 21, 0, 2 << 20);
    assert_eq!(c.simple_reply(), (0, 21));
    c.request(CMD_WRITE, 0, 22, 0, 1 << 20);
    c.s.write_all(&mib).expect("payload");
    assert_eq!(c.simple_reply(), (0, 22), "room after the trim");
    server.assert_quiescent(256);
    drop(server);
}

/// NBD has no keep-alive, and "the client and the server MUST NOT
/// initiate any form of disconnect other than" a violation or a shutdown:
/// a disk a client keeps attached may sit idle for hours (a VM's, the
/// kernel client's). With the default config an idle connection is never
/// closed (it was after 5 minutes, and qemu's next read failed with
/// "Input/output error"): `serve --check` shows no idle limit, and
/// qemu-io idle past every other timeout of the server reads on.
#[test]
fn an_idle_client_is_not_disconnected() {
    require("qemu-io", "qemu-utils");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = serve_once(&["--check"], MALLOC_EXPORTS, dir.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("\"idle_timeout_s\": 0"), "{text}");
    let server = Server::start_full(
        "handshake_timeout_s = 1\npayload_timeout_s = 1",
        MALLOC_EXPORTS,
        "num_shared_buffers = 64",
    );
    let cmds = ["write -P 9 0 4k", "sleep 2500", "read -P 9 0 4k"];
    let limit = std::time::Duration::from_secs(30);
    let out = qemu_io(&server.unix_uri("default"), &cmds, limit);
    assert!(out.contains("read 4096/4096"), "{out}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(!log.contains("reason=\"Timeout\""), "{log}");
}
