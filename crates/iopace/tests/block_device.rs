//! A block device as a `file` bdev (a loop device here, `/dev/nvme0n1` on a
//! real target): its fallocate takes whole blocks only, and zeroes without
//! writing only where the device can, so WRITE_ZEROES and TRIM of any
//! alignment, FAST_ZERO and unaligned writes are checked with qemu-io.

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{qemu_io, require, serve_once, Server};

const LIMIT: Duration = Duration::from_secs(60);

/// A loop device over a sparse image, detached and removed on drop.
struct Loop {
    dev: String,
    image: PathBuf,
}

impl Loop {
    /// None where this machine cannot attach one (no loop driver, not root).
    fn attach(size: u64) -> Option<Loop> {
        Loop::attach_with(size, &[])
    }

    /// As [`Loop::attach`], with more `losetup` options (`-r`: read-only).
    fn attach_with(size: u64, options: &[&str]) -> Option<Loop> {
        let image = tempfile::Builder::new()
            .prefix("iopace-loop")
            .tempfile_in("/var/tmp")
            .expect("image file")
            .into_temp_path()
            .keep()
            .expect("keep image");
        std::fs::File::options()
            .write(true)
            .open(&image)
            .and_then(|f| f.set_len(size))
            .expect("size image");
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .args(options)
            .arg(&image)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Loop {
                dev: String::from_utf8_lossy(&o.stdout).trim().to_string(),
                image,
            }),
            other => {
                eprintln!("SKIPPED: cannot attach a loop device here: {other:?}");
                let _ = std::fs::remove_file(&image);
                None
            }
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

#[test]
fn block_device_zeroes_and_trims_at_any_alignment() {
    require("qemu-io", "qemu-utils");
    require("losetup", "mount");
    let Some(lo) = Loop::attach(64 << 20) else {
        return;
    };
    let server = Server::start(&format!(
        "[[bdev]]\nname = \"blk\"\nkind = \"file\"\npath = \"{}\"\ndirect = \"on\"\n\n\
         [[export]]\nname = \"blk\"\nbdev = \"blk\"\n",
        lo.dev
    ));
    let uri = server.unix_uri("blk");
    let text = qemu_io(
        &uri,
        &[
            "write -P 0x5a 0 1M",
            // Unaligned ranges: a zeroed head and tail around whole blocks.
            "write -z 100 1000",
            "write -z -u 5000 10000",
            "write -z -f 20000 8192",
            "read -P 0x5a 0 100",
            "read -P 0 100 1000",
            "read -P 0x5a 1100 3900",
            "read -P 0 5000 10000",
            "read -P 0 20000 8192",
            "read -P 0x5a 28192 1020384",
            // Trim is advisory: unaligned edges stay, no error.
            "discard 300000 5000",
            // An unaligned write goes through the page cache.
            "write -P 0x77 1 4095",
            "read -P 0x77 1 4095",
            "write -z -n -u 512k 256k",
            "read -P 0 512k 256k",
            "flush",
        ],
        LIMIT,
    );
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert!(!text.contains("failed"), "{text}");
    // FAST_ZERO with no whole block inside: only writing would zero it, so
    // "fail quickly" with ENOTSUP (qemu-io exits 1), and the data stays.
    let out = Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "write -z -n 100 1000",
            "-c",
            "read -P 0x77 100 1000",
        ])
        .arg(&uri)
        .output()
        .expect("run qemu-io");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("write failed: Operation not supported"),
        "{text}"
    );
    assert!(!text.contains("Pattern verification failed"), "{text}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// A block device that something else holds (a mounted filesystem claims
/// its device as this O_EXCL open does) is refused: the clients' writes
/// would corrupt the filesystem under it.
#[test]
fn a_held_block_device_is_refused() {
    require("losetup", "mount");
    let Some(lo) = Loop::attach(16 << 20) else {
        return;
    };
    let _held = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&lo.dev)
        .expect("claim the loop device");
    let dir = tempfile::tempdir().expect("tempdir");
    assert_refused(&config(dir.path(), &lo.dev, ""), "in use");
}

/// A `size` other than the device's own is a config error: the device is
/// served whole (it was served at its own size, whatever `size` said).
#[test]
fn a_block_device_size_must_match() {
    require("losetup", "mount");
    let Some(lo) = Loop::attach(16 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for size in ["8MiB", "32MiB"] {
        let extra = format!("size = \"{size}\"\n");
        assert_refused(&config(dir.path(), &lo.dev, &extra), "remove size");
    }
}

/// A block device set read-only (`losetup -r`, `blockdev --setro`, a
/// write-protected disk) opens read-write but fails every write: it is
/// served to read-only exports, and a writable export of it is refused,
/// as qemu-nbd refuses it without -r ("The device is not writable").
#[test]
fn a_read_only_block_device_is_served_only_read_only() {
    require("losetup", "mount");
    require("nbdinfo", "libnbd-bin");
    let Some(lo) = Loop::attach_with(16 << 20, &["-r"]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    assert_refused(&config(dir.path(), &lo.dev, ""), "set read_only = true");
    let server = Server::start(&format!(
        "[[bdev]]\nname = \"blk\"\nkind = \"file\"\npath = \"{}\"\n\n\
         [[export]]\nname = \"blk\"\nbdev = \"blk\"\nread_only = true\n",
        lo.dev
    ));
    let out = Command::new("nbdinfo")
        .arg(server.unix_uri("blk"))
        .output()
        .expect("run nbdinfo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("is_read_only: true"), "{text}");
    assert!(text.contains("export-size: 16777216"), "{text}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// A config serving `dev` as one file bdev, with `extra` bdev lines.
fn config(dir: &Path, dev: &str, extra: &str) -> String {
    format!(
        "[server]\nunix = [\"{}\"]\ntcp = []\n\n[[bdev]]\nname = \"blk\"\nkind = \"file\"\n\
         path = \"{dev}\"\n{extra}\n[[export]]\nname = \"blk\"\nbdev = \"blk\"\n",
        dir.join("nbd.sock").display(),
    )
}

/// `serve` and `serve --check` of `config` both exit 2 naming its line
/// and saying `why`.
fn assert_refused(config: &str, why: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    for args in [&[][..], &["--check"][..]] {
        let out = serve_once(args, config, dir.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("c.toml:") && err.contains(why), "{err}");
    }
}
