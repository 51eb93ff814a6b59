//! `file` bdevs on images as storage engineers hand them over, checked
//! with the clients they use (qemu-img, qemu-io, nbdinfo) and against what
//! qemu-nbd and nbdkit do with the same image.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{random_file, require, run, serve_once, Server};

const LIMIT: Duration = Duration::from_secs(60);

/// An image made immutable (`chattr +i`), which even root opens only
/// read-only, as a file without write permission or one on a read-only
/// mount; made mutable again on drop so it can be removed.
struct Immutable(tempfile::NamedTempFile);

impl Immutable {
    /// None where the filesystem or the user cannot set the flag.
    fn new(len: usize) -> Option<Immutable> {
        let img = tempfile::Builder::new()
            .prefix("iopace-it-immutable")
            .tempfile_in("/var/tmp")
            .expect("temp file on a disk filesystem");
        random_file(img.path(), len, 5);
        let set = Command::new("chattr").arg("+i").arg(img.path()).status();
        if !set.is_ok_and(|s| s.success()) {
            eprintln!(
                "SKIPPED: cannot make {} immutable here",
                img.path().display()
            );
            return None;
        }
        Some(Immutable(img))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(self.0.path()).status();
    }
}

fn config(img: &Path, read_only: bool) -> String {
    format!(
        "[[bdev]]\nname = \"f0\"\nkind = \"file\"\npath = \"{}\"\n\n\
         [[export]]\nname = \"default\"\nbdev = \"f0\"\nread_only = {read_only}\n",
        img.display()
    )
}

/// An image that refuses writing is served by a read-only export, as
/// `qemu-nbd -r` and `nbdkit -r` serve it: every byte reads back, and
/// nothing but reads is offered. A writable export of it is refused at
/// start (and by `serve --check`), naming `read_only`, as qemu-nbd without
/// -r refuses it, rather than failing every write once served; so is a
/// `size` that would extend it.
#[test]
fn an_image_that_refuses_writing_is_served_read_only() {
    require("qemu-img", "qemu-utils");
    require("nbdinfo", "libnbd-bin");
    require("chattr", "e2fsprogs");
    let Some(img) = Immutable::new(3 << 20) else {
        return;
    };
    let server = Server::start(&config(img.path(), true));
    let uri = server.unix_uri("default");
    let info = run(Command::new("nbdinfo").arg("--json").arg(&uri), LIMIT);
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).expect("nbdinfo JSON");
    let e = &info["exports"][0];
    assert_eq!(e["is_read_only"], true, "{e}");
    assert_eq!(e["export-size"], 3 << 20, "{e}");
    for flag in ["can_trim", "can_zero", "can_fua"] {
        assert_eq!(e[flag], false, "{flag}: {e}");
    }
    let cmp = run(
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(img.path())
            .arg(&uri),
        LIMIT,
    );
    assert!(cmp.status.success(), "{cmp:?}");
    let (st, log) = server.stop();
    assert!(st.success(), "{st}\n{log}");

    // Writable, or to be extended: refused alike by serve and --check.
    let dir = tempfile::tempdir().expect("tempdir");
    let larger =
        config(img.path(), true).replace("kind = \"file\"\n", "kind = \"file\"\nsize = \"4MiB\"\n");
    let refused = [
        (config(img.path(), false), "export.read_only"),
        (larger, "cannot extend"),
    ];
    for (body, why) in &refused {
        for args in [&["--check"][..], &[]] {
            let out = serve_once(args, body, dir.path());
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(why), "{args:?}: {err}");
        }
    }
}
