//! Real NBD clients against the real binary: nbdinfo, nbdcopy, fio, qemu-img, qemu-io.

mod common;

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn nbdinfo_shows_advertised_features() {
    require("nbdinfo", "libnbd-bin");
    let server = Server::malloc();
    let out = run(
        Command::new("nbdinfo").args(["--json", &server.unix_uri("default")]),
        LIMIT,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
    assert_eq!(v["structured"], true, "{v:#}");
    let e = &v["exports"][0];
    for key in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
        "can_fast_zero",
        "can_cache",
    ] {
        assert_eq!(e[key], true, "{key} in {e:#}");
    }
    assert_eq!(e["is_read_only"], false);
    assert_eq!(e["export-size"], 512u64 << 20);
    let contexts = e["contexts"].as_array().expect("contexts");
    assert!(contexts.iter().any(|c| c == "base:allocation"), "{e:#}");
    // The read-only export says so, over TCP too.
    let out = run(
        Command::new("nbdinfo").args(["--json", &server.tcp_uri("ro")]),
        LIMIT,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
    assert_eq!(v["exports"][0]["is_read_only"], true);
    // --list shows every export.
    let out = run(
        Command::new("nbdinfo").args(["--list", "--json", &server.unix_uri("")]),
        LIMIT,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
    assert_eq!(v["exports"].as_array().map(Vec::len), Some(2), "{v:#}");
}

#[test]
fn nbdcopy_roundtrip_256mib_is_byte_identical() {
    require("nbdcopy", "libnbd-bin");
    let server = Server::start(
        "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"256MiB\"\n[[export]]\nname = \"default\"\nbdev = \"m\"\n",
    );
    let src = server.dir.path().join("src.bin");
    let back = server.dir.path().join("back.bin");
    random_file(&src, 256 << 20, 42);
    run(
        Command::new("nbdcopy")
            .arg(&src)
            .arg(server.unix_uri("default")),
        LIMIT,
    );
    run(
        Command::new("nbdcopy")
            .args(["--connections=4", "--flush"])
            .arg(server.tcp_uri("default"))
            .arg(&back),
        LIMIT,
    );
    let a = std::fs::read(&src).expect("src");
    let b = std::fs::read(&back).expect("back");
    assert_eq!(a.len(), b.len());
    assert!(a == b, "data read back differs from data written");
    server.assert_quiescent(256);
}

fn fio_verify(uri: &str, dir: &std::path::Path, name: &str) {
    let out_json = dir.join(format!("{name}.json"));
    run(
        Command::new("fio")
            // fio leaves its verify state file in the working directory.
            .current_dir(dir)
            .args([
                "--name",
                name,
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randwrite",
                "--bs=4k",
                "--bssplit=4k/60:64k/30:256k/10",
                "--iodepth=32",
                "--size=48m",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--output-format=json",
            ])
            .arg(format!("--output={}", out_json.display())),
        LIMIT,
    );
    let text = std::fs::read_to_string(&out_json).expect("fio output");
    let json = &text[text.find('{').expect("fio JSON")..];
    let v: serde_json::Value = serde_json::from_str(json).expect("fio JSON parses");
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job:#}");
    assert!(
        job["write"]["io_bytes"].as_u64().unwrap_or(0) >= 48 << 20,
        "{job:#}"
    );
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap_or(0) >= 48 << 20,
        "verify read: {job:#}"
    );
}

#[test]
fn fio_verify_malloc_over_tcp_and_unix() {
    require("fio", "fio");
    let server = Server::malloc();
    fio_verify(&server.unix_uri("default"), server.dir.path(), "unix");
    fio_verify(&server.tcp_uri("default"), server.dir.path(), "tcp");
    server.assert_quiescent(256);
}

/// A temporary image on a disk filesystem (a file bdev needs O_DIRECT) and
/// the config body serving it as export `default`.
fn file_export(prefix: &str, size: &str) -> (tempfile::NamedTempFile, String) {
    let (img, body) = sizeless_file_export(prefix);
    (
        img,
        body.replace(
            "kind = \"file\"\n",
            &format!("kind = \"file\"\nsize = \"{size}\"\n"),
        ),
    )
}

/// As [`file_export`], serving the file at the size it has.
fn sizeless_file_export(prefix: &str) -> (tempfile::NamedTempFile, String) {
    let img = tempfile::Builder::new()
        .prefix(prefix)
        .tempfile_in("/var/tmp")
        .expect("temp file on a disk filesystem");
    let body = format!(
        "[[bdev]]\nname = \"f0\"\nkind = \"file\"\npath = \"{}\"\n\n[[export]]\nname = \"default\"\nbdev = \"f0\"\n",
        img.path().display()
    );
    (img, body)
}

/// An existing image whose size is not a multiple of 512 (an ISO's tail, a
/// raw image cut anywhere) is served whole: nbdcopy gets every byte back,
/// and the last byte can be written.
#[test]
fn file_of_odd_size_is_served_to_its_last_byte() {
    require("nbdcopy", "libnbd-bin");
    let (img, body) = sizeless_file_export("iopace-it-odd");
    let len = 1_000_001;
    random_file(img.path(), len, 11);
    let server = Server::start(&body);
    let out = server.dir.path().join("copy.bin");
    run(
        Command::new("nbdcopy")
            .arg(server.unix_uri("default"))
            .arg(&out),
        LIMIT,
    );
    let (want, got) = (std::fs::read(img.path()), std::fs::read(&out));
    let (want, got) = (want.expect("image"), got.expect("copy"));
    assert_eq!(got.len(), len, "export size");
    assert!(want == got, "the copy differs from the image");
    let mut c = raw_unix(&server, "default");
    c.request(1, 0, 1, len as u64 - 1, 1);
    c.s.write_all(b"Z").expect("payload");
    assert_eq!(c.simple_reply(), (0, 1), "write of the last byte");
    c.request(0, 0, 2, len as u64 - 3, 3);
    assert_eq!(c.simple_reply(), (0, 2), "read of the last bytes");
    assert_eq!(c.read_exact(3), [want[len - 3], want[len - 2], b'Z']);
    server.assert_quiescent(256);
}

/// RAM and null bdevs of a size that is no multiple of 512 (nor of their
/// block size) are served at that size, as a file bdev is: nbdinfo sees
/// it, and the last byte is written and read back.
#[test]
fn malloc_and_null_of_odd_size_are_served_exactly() {
    require("nbdinfo", "libnbd-bin");
    let body = "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = 1000001\nblock_size = 4096\n\
                [[bdev]]\nname = \"n\"\nkind = \"null\"\nsize = 777\n\
                [[export]]\nname = \"default\"\nbdev = \"m\"\n\
                [[export]]\nname = \"null\"\nbdev = \"n\"\n";
    let server = Server::start(body);
    for (export, len) in [("default", 1_000_001u64), ("null", 777)] {
        let out = run(
            Command::new("nbdinfo")
                .arg("--size")
                .arg(server.unix_uri(export)),
            LIMIT,
        );
        let size = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(size, len.to_string(), "{export}");
    }
    let mut c = raw_unix(&server, "default");
    c.request(1, 0, 1, 1_000_000, 1);
    c.s.write_all(b"Z").expect("payload");
    assert_eq!(c.simple_reply(), (0, 1), "write of the last byte");
    c.request(0, 0, 2, 999_999, 2);
    assert_eq!(c.simple_reply(), (0, 2), "read of the last bytes");
    assert_eq!(c.read_exact(2), [0, b'Z']);
    c.request(0, 0, 3, 999_999, 3);
    assert_eq!(c.simple_reply().0, proto::EINVAL, "past the end");
    server.assert_quiescent(256);
}

/// The block sizes advertised are ones libnbd accepts: a 64 KiB block
/// device with a 16 KiB maximum request prefers 16 KiB (a preferred size
/// past the maximum made libnbd drop every constraint, the maximum too).
#[test]
fn advertised_block_sizes_are_consistent() {
    require("nbdinfo", "libnbd-bin");
    let body =
        "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"16MiB\"\nblock_size = \"64KiB\"\n\
                [[export]]\nname = \"default\"\nbdev = \"m\"\n";
    let buffers = "num_shared_buffers = 64\nmax_request_size = \"16KiB\"";
    let server = Server::start_with(body, buffers);
    let out = run(
        Command::new("nbdinfo").arg(server.unix_uri("default")),
        LIMIT,
    );
    let info = String::from_utf8_lossy(&out.stdout);
    for line in [
        "block_size_minimum: 1",
        "block_size_preferred: 16384",
        "block_size_maximum: 16384",
    ] {
        assert!(info.contains(line), "{line}:\n{info}");
    }
}

#[test]
fn fio_verify_file_bdev_over_tcp_and_unix() {
    require("fio", "fio");
    // Bound, not `_`: the image lives as long as the test.
    let (_img, body) = file_export("iopace-it-file", "128MiB");
    let server = Server::start(&body);
    fio_verify(&server.unix_uri("default"), server.dir.path(), "unix");
    fio_verify(&server.tcp_uri("default"), server.dir.path(), "tcp");
    server.assert_quiescent(256);
    assert!(server.stop().0.success());
}

#[test]
fn qemu_img_convert_and_compare() {
    require("qemu-img", "qemu-utils");
    let server = Server::malloc();
    let src = server.dir.path().join("src.raw");
    let qcow = server.dir.path().join("src.qcow2");
    let back = server.dir.path().join("back.qcow2");
    random_file(&src, 32 << 20, 7);
    run(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&src)
            .arg(&qcow),
        LIMIT,
    );
    // Into the export (raw over NBD), and back out to a new qcow2.
    run(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "qcow2", "-O", "raw"])
            .arg(&qcow)
            .arg(server.tcp_uri("default")),
        LIMIT,
    );
    run(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(server.unix_uri("default"))
            .arg(&back),
        LIMIT,
    );
    // The first 32 MiB must match; the rest of the export reads as zeros.
    let out = run(
        Command::new("qemu-img")
            .args(["compare", "-f", "qcow2", "-F", "qcow2"])
            .arg(&qcow)
            .arg(&back),
        LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("identical") || text.contains("Images are identical"),
        "{text}"
    );
}

#[test]
fn qemu_io_trim_and_write_zeroes_read_back_zeros() {
    require("qemu-io", "qemu-utils");
    let server = Server::malloc();
    let uri = server.tcp_uri("default");
    let out = run(
        Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 0 1M",
            "-c",
            "read -P 0x5a 0 1M",
            "-c",
            "discard 0 64k",
            "-c",
            "write -z 64k 64k",
            "-c",
            "write -z -u 128k 64k",
            "-c",
            "read -P 0 0 192k",
            "-c",
            "read -P 0x5a 192k 832k",
            "-c",
            "flush",
            &uri,
        ]),
        LIMIT,
    );
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert!(!text.to_lowercase().contains("error"), "{text}");
    // `write -z` without `-u` sends NO_HOLE: that range must stay allocated
    // (data in block status); the discard and `-z -u` may leave holes.
    require("nbdinfo", "libnbd-bin");
    let out = run(
        Command::new("nbdinfo").args(["--map", "--json", &uri]),
        LIMIT,
    );
    let map: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
    let hole_at = |at: u64| {
        let e = map
            .as_array()
            .and_then(|a| {
                a.iter().find(|e| {
                    let (o, l) = (e["offset"].as_u64(), e["length"].as_u64());
                    o.zip(l).is_some_and(|(o, l)| o <= at && at < o + l)
                })
            })
            .unwrap_or_else(|| panic!("no extent at {at}: {map:#}"));
        e["type"].as_u64().expect("type") & 1 != 0
    };
    assert!(hole_at(0), "discarded: {map:#}");
    assert!(!hole_at(64 << 10), "write -z (NO_HOLE) stays data: {map:#}");
    assert!(hole_at(128 << 10), "write -z -u: {map:#}");
    assert!(!hole_at(192 << 10), "{map:#}");
}

/// Writes the server acknowledged are in the file, and a FLUSH covered
/// them, even when the server is killed (SIGKILL: no drain, no cleanup):
/// the file holds them, and a new server serves them back.
#[test]
fn acknowledged_flushed_writes_survive_a_killed_server() {
    require("qemu-io", "qemu-utils");
    let (img, body) = file_export("iopace-it-crash", "64MiB");
    let qemu_io = |uri: &str, cmds: &[&str]| qemu_io(uri, cmds, LIMIT);
    let server = Server::start(&body);
    let text = qemu_io(
        &server.tcp_uri("default"),
        &["write -P 0x3c 0 4M", "write -f -P 0xc3 8M 1M", "flush"],
    );
    assert!(!text.to_lowercase().contains("error"), "{text}");
    drop(server); // SIGKILL
    let file = std::fs::read(img.path()).expect("read the image");
    assert!(
        file[..4 << 20].iter().all(|&b| b == 0x3c),
        "the first 4 MiB are not in the file"
    );
    assert!(
        file[8 << 20..9 << 20].iter().all(|&b| b == 0xc3),
        "the FUA write is not in the file"
    );
    let server = Server::start(&body);
    let text = qemu_io(
        &server.unix_uri("default"),
        &["read -P 0x3c 0 4M", "read -P 0 4M 4M", "read -P 0xc3 8M 1M"],
    );
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert!(!text.to_lowercase().contains("error"), "{text}");
    assert!(server.stop().0.success());
}

/// A latency target the device cannot meet drives vrate to its floor while
/// every byte still reads back as written.
#[test]
fn an_unmeetable_latency_target_lowers_vrate_and_data_stays_correct() {
    require("fio", "fio");
    let body = r#"
[[bdev]]
name = "m0"
kind = "malloc"
size = "64MiB"

[[bdev]]
name = "slow"
kind = "delay"
base = "m0"
read_avg_us = 200
read_p99_us = 300
write_avg_us = 200
write_p99_us = 300

[[export]]
name = "default"
bdev = "slow"

[qos.slow]
rpct = 50
rlat_us = 50
wpct = 50
wlat_us = 50
min = 20
period_ms = 2
"#;
    let server = Server::start(body);
    fio_verify(&server.unix_uri("default"), server.dir.path(), "qos");
    let stats = server.rpc("get_stats");
    for r in stats["reactors"].as_array().expect("reactors") {
        let vrate = r["pacer"]["vrates"][0].as_f64().expect("vrates");
        assert!((vrate - 0.2).abs() < 0.01, "vrate {vrate}: {r:#}");
    }
    server.assert_quiescent(256);
}
