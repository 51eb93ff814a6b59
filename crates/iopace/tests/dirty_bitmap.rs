//! Dirty bitmaps for incremental backup with real clients: qemu-io writes,
//! nbdinfo and qemu-img read the `qemu:dirty-bitmap:NAME` context, nbdcopy
//! and qemu-img copy, and the admin RPC clears, snapshots, adds and removes.
//! A persisted bitmap survives a clean restart, and after a kill -9 is all
//! dirty.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(120);
const K: u64 = 1024;
const M: u64 = 1024 * 1024;

/// A 64 MiB RAM export keeping the bitmap `backup` (64 KiB granularity).
const EXPORT: &str = "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"64MiB\"\n\
    [[export]]\nname = \"default\"\nbdev = \"m\"\ndirty_bitmaps = [\"backup\"]\n";

/// The (offset, length) of the dirty extents of bitmap `name`, by nbdinfo.
fn dirty(server: &Server, name: &str) -> Vec<(u64, u64)> {
    let map = format!("--map=qemu:dirty-bitmap:{name}");
    let uri = server.unix_uri("default");
    let out = run(Command::new("nbdinfo").args(["--json", &map, &uri]), LIMIT);
    let v: Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
    let extents = v.as_array().expect("extents");
    let mut end = 0;
    let mut out = Vec::new();
    for e in extents {
        let (off, len) = (
            e["offset"].as_u64().expect("offset"),
            e["length"].as_u64().expect("length"),
        );
        assert_eq!(off, end, "extents are contiguous: {v:#}");
        end = off + len;
        if e["type"] == 1 {
            assert_eq!(e["description"], "dirty");
            out.push((off, len));
        }
    }
    assert_eq!(end, 64 * M, "the map covers the export");
    out
}

fn call(server: &Server, method: &str, params: Value) -> Value {
    let reply = server.rpc_call(method, params);
    assert!(reply.get("error").is_none(), "{method}: {reply:#}");
    reply["result"].clone()
}

/// Bytes READ served so far, over every reactor.
fn read_bytes(server: &Server) -> u64 {
    let stats = server.rpc("get_stats");
    let reactors = stats["reactors"].as_array().expect("reactors");
    reactors
        .iter()
        .map(|r| r["io"]["read"]["bytes"].as_u64().expect("bytes"))
        .sum()
}

fn image_opts(server: &Server, extra: &str) -> String {
    let sock = server.sock.display();
    format!("driver=nbd,server.type=unix,server.path={sock},export=default{extra}")
}

#[test]
fn the_map_shows_exactly_the_written_blocks_and_clear_resets_them() {
    require("nbdinfo", "libnbd-bin");
    require("qemu-io", "qemu-utils");
    let server = Server::start(EXPORT);
    let uri = server.unix_uri("default");
    let out = run(Command::new("nbdinfo").args(["--json", &uri]), LIMIT);
    let v: Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
    let contexts = &v["exports"][0]["contexts"];
    assert_eq!(
        *contexts,
        json!(["base:allocation", "qemu:dirty-bitmap:backup"])
    );
    assert!(dirty(&server, "backup").is_empty(), "clean at start");
    let cmds = [
        "write -P 0x55 1M 4k",
        "write -P 0x66 10M 100k",
        "write -z 20M 64k",
        "discard 30M 1k",
    ];
    qemu_io(&uri, &cmds, LIMIT);
    let written = vec![
        (M, 64 * K),
        (10 * M, 128 * K),
        (20 * M, 64 * K),
        (30 * M, 64 * K),
    ];
    assert_eq!(dirty(&server, "backup"), written);
    // qemu's client reads the context in place of base:allocation, where
    // flag 1 (dirty) means "hole": dirty blocks come back as data: false.
    let opts = image_opts(&server, ",x-dirty-bitmap=qemu:dirty-bitmap:backup");
    let out = run(
        Command::new("qemu-img").args(["map", "--output=json", "--image-opts", &opts]),
        LIMIT,
    );
    let map: Value = serde_json::from_slice(&out.stdout).expect("qemu-img JSON");
    let not_data: Vec<(u64, u64)> = (map.as_array().expect("map").iter())
        .filter(|e| e["data"] == false)
        .map(|e| {
            (
                e["start"].as_u64().expect("start"),
                e["length"].as_u64().expect("length"),
            )
        })
        .collect();
    assert_eq!(not_data, written, "{map:#}");
    let listed = call(&server, "get_dirty_bitmaps", json!({}));
    assert_eq!(listed[0]["dirty_bytes"], 320 * K, "{listed:#}");
    assert_eq!(listed[0]["granularity"], 64 * K);
    let cleared = call(
        &server,
        "clear_dirty_bitmap",
        json!({"export": "default", "name": "backup"}),
    );
    assert_eq!(cleared["cleared_bytes"], 320 * K);
    assert!(dirty(&server, "backup").is_empty(), "clear resets it");
    // One added at run time tracks from then on, at its own granularity.
    let add = json!({"export": "default", "name": "fine", "granularity": 4096});
    call(&server, "add_dirty_bitmap", add);
    qemu_io(&uri, &["write -P 0x77 5M 6k"], LIMIT);
    assert_eq!(dirty(&server, "fine"), [(5 * M, 8 * K)]);
    assert_eq!(dirty(&server, "backup"), [(5 * M, 64 * K)]);
    call(
        &server,
        "remove_dirty_bitmap",
        json!({"export": "default", "name": "fine"}),
    );
    let listed = call(&server, "get_dirty_bitmaps", json!({"export": "default"}));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed:#}");
    // Mistakes are errors, not crashes.
    for (method, params) in [
        (
            "add_dirty_bitmap",
            json!({"export": "default", "name": "backup"}),
        ),
        (
            "add_dirty_bitmap",
            json!({"export": "default", "name": "x", "granularity": 1000}),
        ),
        (
            "clear_dirty_bitmap",
            json!({"export": "nope", "name": "backup"}),
        ),
        (
            "remove_dirty_bitmap",
            json!({"export": "default", "name": "fine"}),
        ),
    ] {
        let reply = server.rpc_call(method, params.clone());
        assert_eq!(
            reply["error"]["code"], -32602,
            "{method} {params}: {reply:#}"
        );
    }
    server.assert_quiescent(0);
}

#[test]
fn an_incremental_backup_copies_only_the_dirty_blocks() {
    require("nbdcopy", "libnbd-bin");
    require("qemu-img", "qemu-utils");
    let server = Server::start(EXPORT);
    let dir = server.dir.path().to_path_buf();
    let uri = server.unix_uri("default");
    let (src, backup, now) = (
        dir.join("src.img"),
        dir.join("backup.img"),
        dir.join("now.img"),
    );
    random_file(&src, 64 * M as usize, 35);
    run(Command::new("nbdcopy").arg(&src).arg(&uri), LIMIT);
    // The full backup: clear, then copy everything.
    call(
        &server,
        "clear_dirty_bitmap",
        json!({"export": "default", "name": "backup"}),
    );
    run(Command::new("nbdcopy").arg(&uri).arg(&backup), LIMIT);
    let cmds = [
        "write -P 0x11 3M 64k",
        "write -P 0x22 17412k 8k",
        "write -P 0x33 40M 1M",
    ];
    qemu_io(&uri, &cmds, LIMIT);
    // The incremental: move the marks into a snapshot, copy its blocks.
    let params = json!({"export": "default", "name": "backup", "snapshot": "inc"});
    let cleared = call(&server, "clear_dirty_bitmap", params);
    assert_eq!(
        cleared["cleared_bytes"],
        (64 + 64 + 1024) * K,
        "{cleared:#}"
    );
    let ranges = dirty(&server, "inc");
    assert_eq!(ranges, [(3 * M, 64 * K), (17 * M, 64 * K), (40 * M, M)]);
    assert!(dirty(&server, "backup").is_empty());
    copy_ranges(&server, &ranges, &backup);
    call(
        &server,
        "remove_dirty_bitmap",
        json!({"export": "default", "name": "inc"}),
    );
    assert_same(&server, &backup, &now);
    server.assert_quiescent(0);
}

/// The incremental copy: qemu-img copies each range of the export into
/// `backup`, and the server reads exactly those bytes.
fn copy_ranges(server: &Server, ranges: &[(u64, u64)], backup: &Path) {
    let before = read_bytes(server);
    let sock = server.sock.display();
    for (off, len) in ranges {
        let window = format!("driver=raw,offset={off},size={len}");
        let from = format!("{window},file.driver=nbd,file.server.type=unix,file.server.path={sock},file.export=default");
        let to = format!(
            "{window},file.driver=file,file.filename={}",
            backup.display()
        );
        run(
            Command::new("qemu-img").args([
                "convert",
                "-n",
                "--image-opts",
                &from,
                "--target-image-opts",
                &to,
            ]),
            LIMIT,
        );
    }
    let copied: u64 = ranges.iter().map(|r| r.1).sum();
    assert_eq!(
        read_bytes(server) - before,
        copied,
        "only the dirty blocks are read"
    );
}

/// The export, copied whole into `now` by nbdcopy, equals `backup` (cmp).
fn assert_same(server: &Server, backup: &Path, now: &Path) {
    run(
        Command::new("nbdcopy")
            .arg(server.unix_uri("default"))
            .arg(now),
        LIMIT,
    );
    let cmp = run(Command::new("cmp").arg(backup).arg(now), LIMIT);
    assert!(cmp.status.success(), "the backup equals the export");
}

/// A 64 MiB file export whose bitmap `backup` persists in `bitmaps`.
fn persisted_export(image: &Path, bitmaps: &Path) -> String {
    format!(
        "[[bdev]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = \"64MiB\"\n\
         [[export]]\nname = \"default\"\nbdev = \"f\"\ndirty_bitmaps = [\"backup\"]\n\
         dirty_bitmap_file = \"{}\"\n",
        image.display(),
        bitmaps.display()
    )
}

/// The state word of a bitmap file: 1 in use, 2 saved clean.
fn file_state(bitmaps: &Path) -> u32 {
    let bytes = std::fs::read(bitmaps).expect("bitmap file");
    assert_eq!(&bytes[..8], b"IOPACEDB");
    u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"))
}

/// What the start found in the bitmap file, from `get_dirty_bitmaps`.
fn at_start(server: &Server) -> String {
    let listed = call(server, "get_dirty_bitmaps", json!({"export": "default"}));
    listed[0]["at_start"]
        .as_str()
        .expect("at_start")
        .to_string()
}

/// A full backup of a persisted export into `dir/backup.img`, then writes
/// to 3 ranges; returns the server (still running) and the ranges.
fn full_backup_then_three_writes(body: &str, dir: &Path) -> (Server, Vec<(u64, u64)>) {
    let server = Server::start(body);
    // First start: no file yet, so the bitmap cannot vouch for anything.
    assert!(at_start(&server).contains("no bitmap file yet"));
    assert_eq!(dirty(&server, "backup"), [(0, 64 * M)]);
    let bitmaps = dir.join("default.bitmaps");
    assert_eq!(file_state(&bitmaps), 1, "in use while serving");
    let src = dir.join("src.img");
    random_file(&src, 64 * M as usize, 36);
    run(
        Command::new("nbdcopy")
            .arg(&src)
            .arg(server.unix_uri("default")),
        LIMIT,
    );
    let clear = json!({"export": "default", "name": "backup"});
    call(&server, "clear_dirty_bitmap", clear);
    run(
        Command::new("nbdcopy")
            .arg(server.unix_uri("default"))
            .arg(dir.join("backup.img")),
        LIMIT,
    );
    let cmds = [
        "write -P 0x11 3M 64k",
        "write -P 0x22 17412k 8k",
        "write -P 0x33 40M 1M",
    ];
    qemu_io(&server.unix_uri("default"), &cmds, LIMIT);
    let ranges = vec![(3 * M, 64 * K), (17 * M, 64 * K), (40 * M, M)];
    assert_eq!(dirty(&server, "backup"), ranges);
    (server, ranges)
}

/// A directory on a real filesystem for the image, the bitmap file and
/// the copies; the bitmap file's path; the config body.
fn persisted_setup() -> (tempfile::TempDir, PathBuf, String) {
    require("nbdcopy", "libnbd-bin");
    require("qemu-img", "qemu-utils");
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let bitmaps = dir.path().join("default.bitmaps");
    let body = persisted_export(&dir.path().join("disk.img"), &bitmaps);
    (dir, bitmaps, body)
}

#[test]
fn a_persisted_bitmap_survives_a_clean_restart() {
    let (dir, bitmaps, body) = persisted_setup();
    let (server, ranges) = full_backup_then_three_writes(&body, dir.path());
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("dirty bitmaps saved"), "{log}");
    assert_eq!(file_state(&bitmaps), 2, "saved clean");
    let server = Server::start(&body);
    assert_eq!(at_start(&server), "restored from a clean shutdown");
    assert_eq!(file_state(&bitmaps), 1, "in use again");
    let params = json!({"export": "default", "name": "backup", "snapshot": "inc"});
    call(&server, "clear_dirty_bitmap", params);
    assert_eq!(dirty(&server, "inc"), ranges);
    let backup = dir.path().join("backup.img");
    copy_ranges(&server, &ranges, &backup);
    assert_same(&server, &backup, &dir.path().join("now.img"));
    server.assert_quiescent(0);
}

#[test]
fn after_a_kill_9_the_persisted_bitmap_is_all_dirty() {
    let (dir, bitmaps, body) = persisted_setup();
    let (server, _) = full_backup_then_three_writes(&body, dir.path());
    drop(server); // SIGKILL: the file stays in use
    assert_eq!(file_state(&bitmaps), 1);
    let server = Server::start(&body);
    let said = at_start(&server);
    assert!(
        said.contains("all dirty") && said.contains("did not stop cleanly"),
        "{said}"
    );
    assert!(server.log_text().contains("did not stop cleanly"));
    // Untrusted, so everything is copied again: nothing is lost.
    let whole = dirty(&server, "backup");
    assert_eq!(whole, [(0, 64 * M)]);
    let backup = dir.path().join("backup.img");
    copy_ranges(&server, &whole, &backup);
    assert_same(&server, &backup, &dir.path().join("now.img"));
    server.assert_quiescent(0);
}

#[test]
fn a_bitmap_file_that_is_not_one_is_refused_not_overwritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let foreign = dir.path().join("disk.qcow2");
    std::fs::write(&foreign, b"QFI\xfb not a bitmap").expect("write");
    let body = persisted_export(&dir.path().join("disk.img"), &foreign);
    let sock = dir.path().join("nbd.sock");
    let config = format!(
        "[server]\ntcp = []\nunix = [\"{}\"]\n\n{body}",
        sock.display()
    );
    for args in [&[][..], &["--check"][..]] {
        let out = serve_once(args, &config, dir.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("c.toml:14:"), "{err}");
        assert!(
            err.contains("export.dirty_bitmap_file") && err.contains("refusing"),
            "{err}"
        );
    }
    let kept = std::fs::read(&foreign).expect("kept");
    assert_eq!(kept, b"QFI\xfb not a bitmap");
}
