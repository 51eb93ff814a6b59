//! Admin JSON-RPC 2.0 over a Unix socket, one JSON object per line.
//! Control plane only: plain threads and blocking IO are fine here, with a
//! bound on how many clients are served at once and how long one may idle.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pace::pacer::{PacingConfig, PortLoad};
use serde_json::{json, Value};

use crate::reactor::{Msg, ReactorHandle};
use crate::stats::ReactorStats;

/// Longest request line accepted; admin requests are tiny.
const MAX_LINE: usize = admin::MAX_LINE;

/// Admin clients served at once; more are told to retry and closed.
const MAX_CLIENTS: usize = 16;

/// An admin client idle this long is closed, freeing its place.
const CLIENT_IDLE: Duration = Duration::from_secs(60);

pub struct RpcState {
    pub reactors: Vec<Arc<ReactorHandle>>,
    /// The effective configuration as `get_config` shows it.
    pub config: Mutex<Value>,
    /// The pacing configuration in force; `set_pacing` merges into it.
    pub pacing: Mutex<PacingConfig>,
    pub stopping: AtomicBool,
    clients: AtomicUsize,
    /// Fault bdevs, for `set_fault` and `get_faults`.
    pub faults: crate::fault_ctl::FaultControl,
    /// The exports' dirty bitmaps, for the `*_dirty_bitmap(s)` calls.
    pub dirty: crate::dirty_ctl::DirtyControl,
    /// The ports the pacers measure, if any listener gives its capacity.
    pub ports: Option<Ports>,
}

/// The ports the pacers measure, for `get_stats`.
pub struct Ports {
    pub load: Arc<PortLoad>,
    /// Each port's name (`config::WirePorts::names`).
    pub names: Vec<String>,
}

impl Ports {
    pub fn stats(&self) -> Vec<admin::stats::PortStats> {
        (0..self.load.count())
            .map(|port| {
                let (gbps, sent_bytes, received_bytes) = self.load.carried(port);
                admin::stats::PortStats {
                    port,
                    name: self.names.get(port).cloned().unwrap_or_default(),
                    gbps,
                    sent_bytes,
                    received_bytes,
                }
            })
            .collect()
    }
}

impl RpcState {
    pub fn new(
        reactors: Vec<Arc<ReactorHandle>>,
        config: Value,
        pacing: PacingConfig,
        faults: crate::fault_ctl::FaultControl,
        dirty: crate::dirty_ctl::DirtyControl,
    ) -> Self {
        RpcState {
            faults,
            dirty,
            reactors,
            config: Mutex::new(config),
            pacing: Mutex::new(pacing),
            stopping: AtomicBool::new(false),
            clients: AtomicUsize::new(0),
            ports: None,
        }
    }

    /// Merges `params` (some `[pacing]` fields, as JSON) into the pacing in
    /// force, checks the result and sends it to every reactor. Fields not
    /// given keep their values.
    pub fn set_pacing(&self, params: &Value) -> Result<PacingConfig, String> {
        let Some(fields) = params.as_object() else {
            return Err("params must be an object of [pacing] fields".into());
        };
        if fields.contains_key("tenants") {
            return Err("tenants cannot change at run time; restart with a new config".into());
        }
        let pacing = self.pacing.lock().unwrap_or_else(|e| e.into_inner());
        let mut merged = serde_json::to_value(&*pacing).map_err(|e| e.to_string())?;
        for (k, v) in fields {
            merged[k.as_str()] = v.clone();
        }
        drop(pacing);
        let cfg: PacingConfig = serde_json::from_value(merged).map_err(|e| e.to_string())?;
        self.replace_pacing(cfg)
    }

    /// Checks a whole pacing configuration and puts it in force on every
    /// reactor (NBD's and NVMe/TCP's connections alike).
    pub fn replace_pacing(&self, cfg: PacingConfig) -> Result<PacingConfig, String> {
        config::bounds::check_pacing(&cfg).map_err(|(field, m)| format!("{field}: {m}"))?;
        let mut pacing = self.pacing.lock().unwrap_or_else(|e| e.into_inner());
        for r in &self.reactors {
            r.send(Msg::SetPacing(cfg.clone()));
        }
        *pacing = cfg.clone();
        let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        config["pacing"] = serde_json::to_value(&cfg).unwrap_or_default();
        Ok(cfg)
    }
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
            let ports = state.ports.as_ref().map(Ports::stats).unwrap_or_default();
            Ok(json!({ "reactors": reactors, "ports": ports }))
        }
        "get_config" => Ok(state
            .config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()),
        "set_pacing" => {
            let params = req.get("params").cloned().unwrap_or(Value::Null);
            let cfg = state
                .set_pacing(&params)
                .map_err(|m| (-32602, format!("invalid params: {m}")))?;
            Ok(json!({ "applied": serde_json::to_value(&cfg).unwrap_or_default() }))
        }
        "set_fault" => {
            let params = req.get("params").cloned().unwrap_or(Value::Null);
            (state.faults.set(&params)).map_err(|m| (-32602, format!("invalid params: {m}")))
        }
        "get_faults" => Ok(state.faults.get()),
        "add_dirty_bitmap" | "remove_dirty_bitmap" | "clear_dirty_bitmap" | "get_dirty_bitmaps" => {
            dirty_call(state, method, req)
        }
        "trace" => {
            let params = req.get("params").cloned().unwrap_or(Value::Null);
            let (q, reactor) = crate::trace_rpc::query(&params)
                .map_err(|m| (-32602, format!("invalid params: {m}")))?;
            Ok(crate::trace_rpc::collect(&state.reactors, q, reactor))
        }
        "rpc_get_methods" => Ok(json!([
            "get_stats",
            "get_config",
            "set_pacing",
            "set_fault",
            "get_faults",
            "add_dirty_bitmap",
            "remove_dirty_bitmap",
            "clear_dirty_bitmap",
            "get_dirty_bitmaps",
            "trace",
            "rpc_get_methods"
        ])),
        other => Err((-32601, format!("method not found: {other}"))),
    }
}

fn dirty_call(state: &RpcState, method: &str, req: &Value) -> Result<Value, (i64, String)> {
    let params = req.get("params").cloned().unwrap_or(Value::Null);
    let d = &state.dirty;
    let done = match method {
        "add_dirty_bitmap" => d.add(&params),
        "remove_dirty_bitmap" => d.remove(&params),
        "clear_dirty_bitmap" => d.clear(&params),
        _ => d.get(&params),
    };
    done.map_err(|m| (-32602, format!("invalid params: {m}")))
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

/// Binds the admin socket (mode 0600 whatever the umask) and serves it on a
/// background thread. Only root and the server's own user are answered.
pub fn spawn(path: &Path, state: Arc<RpcState>) -> std::io::Result<JoinHandle<()>> {
    let listener = crate::sockets::bind_private(path)?;
    let handle = std::thread::Builder::new()
        .name("iopace-rpc".into())
        .spawn(move || {
            for stream in listener.incoming() {
                if state.stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                admit(&state, stream);
            }
        })?;
    Ok(handle)
}

/// Serves one admin client on its own thread if it may call and there is room.
fn admit(state: &Arc<RpcState>, mut stream: UnixStream) {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    match crate::sockets::peer_uid(&stream) {
        Ok(uid) if uid == 0 || uid == me => {}
        peer => {
            tracing::warn!(?peer, "admin socket: refused a client of another user");
            return;
        }
    }
    if state.clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
        state.clients.fetch_sub(1, Ordering::AcqRel);
        let busy = json!({"jsonrpc": "2.0", "id": null,
            "error": {"code": -32000, "message": format!("busy: {MAX_CLIENTS} admin clients already connected")}});
        let _ = writeln!(stream, "{busy}");
        return;
    }
    let _ = stream.set_read_timeout(Some(CLIENT_IDLE));
    let _ = stream.set_write_timeout(Some(CLIENT_IDLE));
    let state2 = state.clone();
    let spawned = std::thread::Builder::new()
        .name("iopace-rpc-client".into())
        .spawn(move || {
            serve_client(&state2, stream);
            state2.clients.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        state.clients.fetch_sub(1, Ordering::AcqRel);
    }
}
