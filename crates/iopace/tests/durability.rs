//! kill -9 durability rounds (issue 38): in each round qemu-io writes a
//! region of its own, half with FUA and half followed by a FLUSH, while
//! fio writes elsewhere; the server is killed (SIGKILL) with fio's IO in
//! flight, a new one serves the same file, and every region acknowledged
//! in every round so far reads back as written.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);
const ROUNDS: u64 = 3;

#[test]
fn acknowledged_writes_survive_kill_9_rounds_with_io_in_flight() {
    require("qemu-io", "qemu-utils");
    require("fio", "fio");
    let (_img, body) = file_export("iopace-it-durable", "/var/tmp", "64MiB");
    for round in 0..ROUNDS {
        let server = Server::start(&body);
        // fio keeps writing the upper half until the kill.
        let fio = Reaped(
            Command::new("fio")
                // Jobs as threads: a forked job outlives the SIGKILL that
                // `Reaped` sends its parent, and hangs on the dead socket.
                .args(["--name=bg", "--thread", "--ioengine=nbd", "--rw=randwrite"])
                .args(["--bs=64k"])
                .args(["--iodepth=16", "--offset=32M", "--size=32M", "--time_based"])
                .args(["--runtime=60"])
                .arg(format!("--uri={}", server.unix_uri("default")))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("fio"),
        );
        let (fua, flushed) = ((round * 2) << 20, (round * 2 + 1) << 20);
        let pattern = 0x40 + round;
        let text = qemu_io(
            &server.unix_uri("default"),
            &[
                &format!("write -f -P {pattern} {fua} 1M"),
                &format!("write -P {pattern} {flushed} 1M"),
                "flush",
            ],
            LIMIT,
        );
        assert!(!text.to_lowercase().contains("error"), "{text}");
        std::thread::sleep(Duration::from_millis(300));
        drop(server); // SIGKILL, with fio's writes in flight
        drop(fio);
        let server = Server::start(&body);
        let reads: Vec<String> = (0..=round)
            .map(|r| format!("read -P {} {} 2M", 0x40 + r, (r * 2) << 20))
            .collect();
        let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
        let text = qemu_io(&server.unix_uri("default"), &reads, LIMIT);
        assert!(
            !text.contains("verification failed"),
            "round {round}: {text}"
        );
        assert!(
            !text.to_lowercase().contains("error"),
            "round {round}: {text}"
        );
        assert!(server.stop().0.success());
    }
}
