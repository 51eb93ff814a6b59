//! `[server]`: listeners, reactors, timeouts and how reactors wait.

use std::fmt;
use std::path::{Path, PathBuf};

use bdev::ByteSize;
use serde::Deserialize;

use crate::tls::TlsMode;
use crate::{bounds, ConfigError, LoadedConfig};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Reactor threads, one per core. 0 means one per available CPU.
    #[serde(default)]
    pub reactors: usize,
    /// TCP listeners: "ADDR:PORT", or a table { addr = "ADDR:PORT", tls =
    /// "require", gbps = 25, port = "eth0" } (see [`crate::ports`]).
    #[serde(default = "default_tcp")]
    pub tcp: Vec<TcpListenerConfig>,
    /// TLS mode of the TCP listeners that do not name one (needs `[tls]`).
    #[serde(default)]
    pub tls: TlsMode,
    #[serde(default = "default_unix")]
    pub unix: Vec<PathBuf>,
    /// NVMe/TCP listeners: "ADDR:PORT", or { addr = "ADDR:PORT", gbps = 25 };
    /// none unless set.
    #[serde(default)]
    pub nvme_tcp: Vec<TcpListenerConfig>,
    /// Admin JSON-RPC socket; empty disables it.
    #[serde(default = "default_rpc")]
    pub rpc: PathBuf,
    /// Request slots per reactor: bounds memory for headers and per-request state.
    #[serde(default = "default_max_requests")]
    pub max_requests_per_reactor: u32,
    /// Seconds to wait for in-flight IO at shutdown before closing connections anyway.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout_s: u64,
    /// HTTP address serving `/metrics` (OpenMetrics text); off when absent.
    #[serde(default)]
    pub metrics: Option<String>,
    /// Seconds a client may take from connecting to the end of the handshake.
    #[serde(default = "default_handshake_timeout")]
    pub handshake_timeout_s: u64,
    /// Seconds a connection may sit with no request in flight and no bytes
    /// arriving; 0 (the default): no limit.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_s: u64,
    /// Seconds a WRITE payload may stall (no bytes while the target can take them).
    #[serde(default = "default_payload_timeout")]
    pub payload_timeout_s: u64,
    /// How an idle reactor waits for completions.
    #[serde(default)]
    pub poll: PollMode,
    /// `adaptive`: how long a reactor keeps polling after its last completion.
    #[serde(default = "default_poll_spin_us")]
    pub poll_spin_us: u64,
    /// How long a reactor that served several requests in its last turn
    /// waits to gather more completions before it serves them: fewer
    /// wake-ups and syscalls per IO at high queue depths, for at most this
    /// much latency (a `busy` reactor spins through it instead of
    /// sleeping). Each reactor keeps trying its clients without it and
    /// stops gathering while that serves clearly more. 0 turns gathering off.
    #[serde(default = "default_batch_wait_us")]
    pub batch_wait_us: u64,
    /// Which connections send a RAM export's READ data by reference
    /// (vmsplice into a pipe, splice into the socket) instead of copying it
    /// into the socket.
    #[serde(default)]
    pub splice: SpliceMode,
    /// SO_SNDBUF of Unix-socket connections (the only buffer between the
    /// two ends of a Unix socket); 0 keeps the kernel's default
    /// (`net.core.wmem_default`). The kernel caps it at `net.core.wmem_max`.
    #[serde(default = "default_unix_send_buffer")]
    pub unix_send_buffer: ByteSize,
    /// TCP_NOTSENT_LOWAT of TCP connections (NBD and NVMe/TCP): a reply's
    /// send completes, and the pacer counts it landed, only once the
    /// socket holds less than this unsent, so the replies' queue stays in
    /// the target (in the pacer's count) and not in the kernel, where the
    /// connections share the wire first come first served. 0 keeps the
    /// kernel's (`net.ipv4.tcp_notsent_lowat`, by default no limit). Off
    /// by default: alone it does not make tenant weights hold on a shared
    /// port, and it costs large reads over loopback 10-15%
    /// (docs/evidence.md#ports-real).
    #[serde(default = "zero_bytes")]
    pub tcp_notsent_lowat: ByteSize,
    /// SO_SNDBUF of TCP connections; 0 keeps the kernel's autotuning.
    #[serde(default = "zero_bytes")]
    pub tcp_send_buffer: ByteSize,
}

/// Which connections splice lent READ data (see `ServerConfig::splice`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpliceMode {
    /// Always copy (sendmsg).
    Off,
    /// Unix-socket connections splice, TCP ones copy.
    #[default]
    Unix,
    /// Every connection splices.
    All,
}

fn zero_bytes() -> ByteSize {
    ByteSize(0)
}

fn default_unix_send_buffer() -> ByteSize {
    ByteSize(4 << 20)
}

/// Largest `unix_send_buffer` and `tcp_send_buffer`: more only pins more
/// memory per connection.
const MAX_UNIX_SEND_BUFFER: u64 = 64 << 20;

/// How a reactor waits when it has nothing to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Sleep in the kernel until a completion, a timer or a wake-up.
    Interrupt,
    /// A lightly loaded reactor polls for `poll_spin_us` after the last
    /// completion, then sleeps: a client's next request, when it follows at
    /// once, finds the reactor awake; a wait for a slow device (completions
    /// further apart than the spin), for clients whose requests mostly come
    /// further apart than the spin, a busy reactor (it gathers instead)
    /// and an idle one cost no spinning.
    #[default]
    Adaptive,
    /// Never sleep: a core per reactor for the lowest latency. Loaded, it
    /// still gathers as `adaptive` does (`batch_wait_us`), spinning.
    Busy,
}

fn default_poll_spin_us() -> u64 {
    50
}

fn default_batch_wait_us() -> u64 {
    20
}
/// Longest gathering wait: beyond this it is a delay, not a batch.
const MAX_BATCH_WAIT_US: u64 = 1_000;
/// Longest adaptive spin: beyond this, `busy` is what is wanted.
const MAX_POLL_SPIN_US: u64 = 100_000;

fn default_tcp() -> Vec<TcpListenerConfig> {
    vec![TcpListenerConfig::Addr("127.0.0.1:10809".into())]
}

/// One TCP listener: an address, or an address with its own TLS mode and
/// the wire it is on (its port's capacity, see [`crate::ports`]).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum TcpListenerConfig {
    Addr(String),
    Listener {
        addr: String,
        #[serde(default)]
        tls: Option<TlsMode>,
        /// The capacity of the wire (NIC port) it listens on, Gb/s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gbps: Option<f64>,
        /// The wire's name: listeners naming one port share its capacity.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<String>,
    },
}

/// The table form of a listener. Unknown keys are errors: a misspelt `tls`
/// must not leave a listener meant for TLS in plaintext, as the untagged
/// derive did (and it said only "did not match any variant" for a bad mode).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenerTable {
    addr: String,
    #[serde(default)]
    tls: Option<TlsMode>,
    #[serde(default)]
    gbps: Option<f64>,
    #[serde(default)]
    port: Option<String>,
}

impl<'de> Deserialize<'de> for TcpListenerConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = TcpListenerConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "an address like \"127.0.0.1:10809\" or { addr = ..., tls = ..., gbps = ... }",
                )
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(TcpListenerConfig::Addr(s.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> Result<Self::Value, A::Error> {
                let t =
                    ListenerTable::deserialize(serde::de::value::MapAccessDeserializer::new(m))?;
                Ok(TcpListenerConfig::Listener {
                    addr: t.addr,
                    tls: t.tls,
                    gbps: t.gbps,
                    port: t.port,
                })
            }
        }
        d.deserialize_any(Form)
    }
}

impl TcpListenerConfig {
    pub fn addr(&self) -> &str {
        match self {
            TcpListenerConfig::Addr(a) | TcpListenerConfig::Listener { addr: a, .. } => a,
        }
    }

    /// The capacity of its wire, Gb/s, if the config gives it.
    pub fn gbps(&self) -> Option<f64> {
        match self {
            TcpListenerConfig::Listener { gbps, .. } => *gbps,
            TcpListenerConfig::Addr(_) => None,
        }
    }

    /// The name of its wire, if the config gives one.
    pub fn port(&self) -> Option<&str> {
        match self {
            TcpListenerConfig::Listener { port, .. } => port.as_deref(),
            TcpListenerConfig::Addr(_) => None,
        }
    }

    /// This listener's TLS mode, `default` when it names none.
    pub fn tls(&self, default: TlsMode) -> TlsMode {
        match self {
            TcpListenerConfig::Listener { tls: Some(t), .. } => *t,
            _ => default,
        }
    }
}
fn default_unix() -> Vec<PathBuf> {
    vec![PathBuf::from("/tmp/iopace.sock")]
}
fn default_rpc() -> PathBuf {
    PathBuf::from("/tmp/iopace-admin.sock")
}
fn default_max_requests() -> u32 {
    4096
}
fn default_drain_timeout() -> u64 {
    10
}
// A handshake is a few round trips: 10 s covers a slow WAN and TLS.
fn default_handshake_timeout() -> u64 {
    10
}
// Initiators keep idle connections open for as long as their disk is
// attached (the kernel client, a VM's qemu), and NBD has no keep-alive to
// tell an idle one from an abandoned one: "The client and the server MUST
// NOT initiate any form of disconnect other than" a violation or a
// shutdown. A server that closed one idle for 5 minutes failed the
// guest's next IO (qemu: "Input/output error"); nbdkit and qemu-nbd set
// no limit either.
fn default_idle_timeout() -> u64 {
    0
}
// A payload that stalls 30 s is a dead or hostile client: TCP's own
// retransmission gives up on a live path well before that.
fn default_payload_timeout() -> u64 {
    30
}
/// Longest connection timeout: a day.
const MAX_CONN_TIMEOUT_S: u64 = 86_400;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            reactors: 0,
            tcp: default_tcp(),
            tls: TlsMode::Off,
            unix: default_unix(),
            nvme_tcp: Vec::new(),
            rpc: default_rpc(),
            max_requests_per_reactor: default_max_requests(),
            drain_timeout_s: default_drain_timeout(),
            metrics: None,
            handshake_timeout_s: default_handshake_timeout(),
            idle_timeout_s: default_idle_timeout(),
            payload_timeout_s: default_payload_timeout(),
            poll: PollMode::default(),
            poll_spin_us: default_poll_spin_us(),
            batch_wait_us: default_batch_wait_us(),
            splice: SpliceMode::default(),
            unix_send_buffer: default_unix_send_buffer(),
            tcp_notsent_lowat: ByteSize(0),
            tcp_send_buffer: ByteSize(0),
        }
    }
}

impl ServerConfig {
    /// Semantic checks of `[server]` and of `[tls]`, which its listeners need.
    pub(crate) fn check(&self, at: &LoadedConfig) -> Result<(), ConfigError> {
        let s = self;
        let field = |e| at.field_error("server", e);
        bounds::in_range("reactors", s.reactors, 0, bounds::MAX_REACTORS).map_err(field)?;
        bounds::in_range(
            "max_requests_per_reactor",
            s.max_requests_per_reactor,
            1,
            bounds::MAX_REQUESTS_PER_REACTOR,
        )
        .map_err(field)?;
        bounds::in_range(
            "drain_timeout_s",
            s.drain_timeout_s,
            0,
            bounds::MAX_DRAIN_TIMEOUT_S,
        )
        .map_err(field)?;
        for (name, value, least) in [
            ("handshake_timeout_s", s.handshake_timeout_s, 1),
            ("idle_timeout_s", s.idle_timeout_s, 0),
            ("payload_timeout_s", s.payload_timeout_s, 1),
        ] {
            bounds::in_range(name, value, least, MAX_CONN_TIMEOUT_S).map_err(field)?;
        }
        bounds::in_range("poll_spin_us", s.poll_spin_us, 0, MAX_POLL_SPIN_US).map_err(field)?;
        bounds::in_range("batch_wait_us", s.batch_wait_us, 0, MAX_BATCH_WAIT_US).map_err(field)?;
        for (name, value) in [
            ("unix_send_buffer", s.unix_send_buffer.0),
            ("tcp_send_buffer", s.tcp_send_buffer.0),
            ("tcp_notsent_lowat", s.tcp_notsent_lowat.0),
        ] {
            bounds::in_range(name, value, 0, MAX_UNIX_SEND_BUFFER).map_err(field)?;
        }
        for listener in &s.tcp {
            check_tcp_address(listener.addr()).map_err(|m| at.error_at("server", 0, "tcp", m))?;
        }
        for path in &s.unix {
            check_socket_path(path).map_err(|m| at.error_at("server", 0, "unix", m))?;
        }
        for (i, l) in s.nvme_tcp.iter().enumerate() {
            check_tcp_address(l.addr()).map_err(|m| at.error_at("server", 0, "nvme_tcp", m))?;
            if matches!(l, TcpListenerConfig::Listener { tls: Some(_), .. }) {
                let m = "NVMe/TCP listeners have no TLS here; remove `tls`".to_string();
                return Err(at.error_at("server.nvme_tcp", i, "tls", m));
            }
        }
        crate::ports::check(s, at)?;
        if !s.rpc.as_os_str().is_empty() {
            check_socket_path(&s.rpc).map_err(|m| at.error_at("server", 0, "rpc", m))?;
        }
        self.check_tls(at)?;
        if let Some(addr) = &s.metrics {
            check_tcp_address(addr).map_err(|m| at.error_at("server", 0, "metrics", m))?;
        }
        if s.tcp.is_empty() && s.unix.is_empty() && s.nvme_tcp.is_empty() {
            return Err(at.error_at(
                "server",
                0,
                "tcp",
                "no listener: give at least one tcp address, unix path or nvme_tcp address".into(),
            ));
        }
        Ok(())
    }

    fn check_tls(&self, at: &LoadedConfig) -> Result<(), ConfigError> {
        let s = self;
        let wants_tls = s.tcp.iter().any(|l| l.tls(s.tls) != TlsMode::Off);
        match &at.config.tls {
            None if wants_tls => Err(at.error_at(
                "server",
                0,
                "tls",
                "a TLS listener needs a [tls] table with cert and key".into(),
            )),
            Some(t) if t.max_sessions.is_some() => Err(at.error_at(
                "tls",
                0,
                "max_sessions",
                "removed: TLS connections are served in the reactors and hold no thread \
                 each any more; delete this line"
                    .into(),
            )),
            Some(_) => Ok(()),
            None => Ok(()),
        }
    }
}

/// A TCP listen address: `IP:PORT` or `HOST:PORT` that resolves.
pub fn check_tcp_address(addr: &str) -> Result<(), String> {
    use std::net::ToSocketAddrs;
    match addr.to_socket_addrs().map(|mut addrs| addrs.next()) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!("`{addr}` resolves to no address")),
        Err(e) => Err(format!(
            "`{addr}` is not an address and port like 127.0.0.1:10809 or localhost:10809: {e}"
        )),
    }
}

/// Longest Unix socket path: `sun_path` holds 108 bytes with its NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// A Unix or admin socket path a listener can take: short enough for
/// `sun_path`, in a directory that exists, and not a file that is no
/// socket (which is never replaced).
pub fn check_socket_path(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(format!(
            "{}: {len} bytes, longer than a socket path can be ({MAX_SOCKET_PATH})",
            path.display()
        ));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(format!(
            "{}: directory {} does not exist",
            path.display(),
            parent.display()
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(format!(
            "{}: the path exists and is not a socket; refusing to replace it",
            path.display()
        )),
        _ => Ok(()),
    }
}
