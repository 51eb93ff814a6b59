//! Admin JSON-RPC 2.0 over a Unix socket, one JSON object per line.
//! Control plane only: plain threads and blocking IO are fine here.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use pace::pacer::PacingConfig;
use serde_json::{json, Value};

use crate::reactor::{Msg, ReactorHandle};
use crate::stats::ReactorStats;

/// Longest request line accepted; admin requests are tiny.
const MAX_LINE: usize = 1 << 20;

pub struct RpcState {
    pub reactors: Vec<Arc<ReactorHandle>>,
    pub config: Value,
    pub stopping: AtomicBool,
}

/// Asks every reactor for a snapshot. A reactor that does not answer in time
/// is reported as missing rather than stalling the caller.
pub fn collect_stats(reactors: &[Arc<ReactorHandle>]) -> Vec<ReactorStats> {
    let (tx, rx) = mpsc::channel();
    for r in reactors {
        r.send(Msg::Stats(tx.clone()));
    }
    drop(tx);
    let mut out = Vec::with_capacity(reactors.len());
    while out.len() < reactors.len() {
        match rx.recv_timeout(Duration::from_secs(2)) {
            Ok(s) => out.push(s),
            Err(_) => break,
        }
    }
    out.sort_by_key(|s| s.reactor);
    out
}

fn handle_call(state: &RpcState, req: &Value) -> Result<Value, (i64, String)> {
    let method = req
        .get("method")
        .and_then(Value::as_str)
        .ok_or((-32600, "invalid request: no method".to_string()))?;
    match method {
        "get_stats" => {
            let reactors = collect_stats(&state.reactors);
            Ok(json!({ "reactors": reactors }))
        }
        "get_config" => Ok(state.config.clone()),
        "set_pacing" => {
            // The whole [pacing] table, as JSON; applied by every reactor.
            let params = req.get("params").cloned().unwrap_or(Value::Null);
            let cfg: PacingConfig = serde_json::from_value(params)
                .map_err(|e| (-32602, format!("invalid params: {e}")))?;
            if !cfg.tenants.is_empty() {
                return Err((
                    -32602,
                    "tenants cannot change at run time; restart with a new config".into(),
                ));
            }
            cfg.validate()
                .map_err(|(field, m)| (-32602, format!("{field}: {m}")))?;
            for r in &state.reactors {
                r.send(Msg::SetPacing(cfg.clone()));
            }
            Ok(json!({ "applied": serde_json::to_value(&cfg).unwrap_or_default() }))
        }
        "rpc_get_methods" => Ok(json!([
            "get_stats",
            "get_config",
            "set_pacing",
            "rpc_get_methods"
        ])),
        other => Err((-32601, format!("method not found: {other}"))),
    }
}

fn serve_client(state: &RpcState, stream: UnixStream) {
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut writer = std::io::BufWriter::new(write_half);
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE as u64).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Err(e) => json!({"jsonrpc": "2.0", "id": null,
                             "error": {"code": -32700, "message": format!("parse error: {e}")}}),
            Ok(req) => {
                let id = req.get("id").cloned().unwrap_or(Value::Null);
                match handle_call(state, &req) {
                    Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                    Err((code, message)) => {
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
                    }
                }
            }
        };
        if writeln!(writer, "{reply}")
            .and_then(|_| writer.flush())
            .is_err()
        {
            return;
        }
    }
}

use std::io::Read as _;

/// Binds the admin socket and serves it on a background thread.
pub fn spawn(path: &Path, state: Arc<RpcState>) -> std::io::Result<JoinHandle<()>> {
    remove_stale_socket(path);
    let listener = UnixListener::bind(path)?;
    let handle = std::thread::Builder::new()
        .name("iopace-rpc".into())
        .spawn(move || {
            for stream in listener.incoming() {
                if state.stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let state = state.clone();
                let _ = std::thread::Builder::new()
                    .name("iopace-rpc-client".into())
                    .spawn(move || serve_client(&state, stream));
            }
        })?;
    Ok(handle)
}

/// Removes a socket file left by a previous run, but only if nobody listens on it.
pub fn remove_stale_socket(path: &Path) {
    if path.exists() && UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
}

/// Client side: one call, for `iopace stats` and tests.
pub fn call(path: &PathBuf, method: &str, params: Value) -> Result<Value, String> {
    let stream = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot connect to admin socket {}: {e} (is `iopace serve` running?)",
            path.display()
        )
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(writer, "{req}").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| format!("reading reply: {e}"))?;
    let reply: Value = serde_json::from_str(&line).map_err(|e| format!("bad reply: {e}"))?;
    if let Some(err) = reply.get("error") {
        return Err(format!("rpc error: {err}"));
    }
    Ok(reply.get("result").cloned().unwrap_or(Value::Null))
}
