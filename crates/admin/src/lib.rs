//! The admin socket as its clients see it: one JSON-RPC call per
//! connection ([`call`]), and the typed `get_stats` reply ([`stats`]).
//! The target serves it (`server::rpc`); `iopace stats`, `bench` and
//! `probe` call it through this crate, which links no network stack.

use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

pub mod stats;

/// Longest request or reply line, either side.
pub const MAX_LINE: usize = 1 << 20;

/// Client side: `get_stats`, typed.
pub fn get_stats(path: &Path) -> Result<stats::StatsReply, String> {
    let reply = call(path, "get_stats", Value::Null)?;
    serde_json::from_value(reply).map_err(|e| format!("unexpected get_stats reply: {e}"))
}

/// How long a client waits for the server's reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Client side: one call, for `iopace stats` and tests.
pub fn call(path: &Path, method: &str, params: Value) -> Result<Value, String> {
    call_within(path, method, params, REPLY_TIMEOUT)
}

fn call_within(
    path: &Path,
    method: &str,
    params: Value,
    reply_timeout: Duration,
) -> Result<Value, String> {
    let stream = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot connect to admin socket {}: {e} (is `iopace serve` running?)",
            path.display()
        )
    })?;
    stream
        .set_read_timeout(Some(reply_timeout))
        .map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    // Another server (an NBD socket, say) sends its own greeting and closes
    // or resets the connection on our JSON, before or after we finish
    // writing it; the admin socket never does.
    let not_admin = |e: std::io::Error| {
        format!(
            "{} is not an iopace admin socket: it closed the connection instead of answering JSON-RPC ({e})",
            path.display()
        )
    };
    let closed = |e: &std::io::Error| {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        matches!(e.kind(), BrokenPipe | ConnectionReset)
    };
    // One write: `writeln!` on the socket may split the line, and a peer
    // that rejects the first part closes before the rest.
    if let Err(e) = writer.write_all(format!("{req}\n").as_bytes()) {
        return Err(if closed(&e) {
            not_admin(e)
        } else {
            e.to_string()
        });
    }
    let mut line = Vec::new();
    let read = BufReader::new(stream)
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut line);
    if let Err(e) = read {
        if !line.is_empty() || closed(&e) {
            return Err(not_admin(e));
        }
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        if matches!(e.kind(), WouldBlock | TimedOut) {
            return Err(format!(
                "no reply from {} within {reply_timeout:?}: a stuck server, or not an iopace admin socket",
                path.display()
            ));
        }
        return Err(format!("reading reply from {}: {e}", path.display()));
    }
    let reply: Value = serde_json::from_slice(&line)
        .ok()
        .filter(|v: &Value| v.get("jsonrpc").is_some())
        .ok_or_else(|| {
            format!(
                "{} is not an iopace admin socket: its reply is not JSON-RPC",
                path.display()
            )
        })?;
    if let Some(err) = reply.get("error") {
        return Err(format!("rpc error: {err}"));
    }
    Ok(reply.get("result").cloned().unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that accepts and never answers (a hung server, another
    /// program) is named as such, not with the read's EAGAIN.
    #[test]
    fn a_socket_that_never_answers_is_reported_as_such() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("mute.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let keep = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        let e = call_within(&path, "get_stats", Value::Null, Duration::from_millis(100))
            .expect_err("no reply");
        assert!(e.contains("no reply") && e.contains("mute.sock"), "{e}");
        drop(keep.join());
    }
}
