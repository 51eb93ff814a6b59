//! Dirty bitmaps for incremental backup with real clients: qemu-io writes,
//! nbdinfo and qemu-img read the `qemu:dirty-bitmap:NAME` context, nbdcopy
//! and qemu-img copy, and the admin RPC clears, snapshots, adds and removes.

mod common;

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
    let before = read_bytes(&server);
    for (off, len) in &ranges {
        let window = format!("driver=raw,offset={off},size={len}");
        let sock = server.sock.display();
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
        read_bytes(&server) - before,
        copied,
        "only the dirty blocks are read"
    );
    call(
        &server,
        "remove_dirty_bitmap",
        json!({"export": "default", "name": "inc"}),
    );
    run(Command::new("nbdcopy").arg(&uri).arg(&now), LIMIT);
    let same = std::fs::read(&backup).expect("backup") == std::fs::read(&now).expect("now");
    assert!(
        same,
        "the backup equals the export after the incremental copy"
    );
    server.assert_quiescent(0);
}
