//! Target configuration: TOML with an embedded default, validated up front so
//! that every error names the file, line and field.

pub use crate::toml_locate::locate;
use crate::toml_locate::{backticked, key_at, line_of};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::collections::BTreeMap;

use std::io::Read as _;

use bdev::{BdevSpec, ByteSize};

use crate::bounds;
use crate::tls::{TlsConfig, TlsMode};
use pace::pacer::{CostModel, PacingConfig, QosConfig};
use pace::pool::PoolConfig;
use serde::Deserialize;

/// The configuration served when `iopace serve` gets no `--config`.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// Name shown in errors for the embedded default.
pub const DEFAULT_CONFIG_NAME: &str = "<embedded default config>";

/// Largest READ or WRITE the target accepts (and advertises) unless
/// `[buffers] max_request_size` says otherwise.
pub const DEFAULT_MAX_REQUEST_BYTES: u32 = 64 << 20;

/// The most exports one server serves (their index is 16 bits).
pub const MAX_EXPORTS: usize = 1 << 16;

/// The most `max_request_size` may be: the 32-bit length of a compact
/// request, rounded down to 4 KiB.
pub const MAX_REQUEST_LIMIT: u32 = 0xffff_f000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub buffers: BufferConfig,
    #[serde(default, rename = "bdev")]
    pub bdevs: Vec<BdevSpec>,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportConfig>,
    /// Pacing mode and parameters, tenants.
    #[serde(default)]
    pub pacing: PacingConfig,
    /// Per-bdev cost models (iocost's linear model), by bdev name.
    #[serde(default)]
    pub cost: BTreeMap<String, CostModel>,
    /// Per-bdev latency targets (iocost's QoS), by bdev name.
    #[serde(default)]
    pub qos: BTreeMap<String, QosConfig>,
    /// A cost database (`iopace probe db`): bdevs without `[cost.NAME]`
    /// take their model's entry from it.
    #[serde(default)]
    pub cost_db: Option<PathBuf>,
    /// Certificates for TCP listeners with TLS.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Reactor threads, one per core. 0 means one per available CPU.
    #[serde(default)]
    pub reactors: usize,
    /// TCP listeners: "ADDR:PORT", or { addr = "ADDR:PORT", tls = "require" }.
    #[serde(default = "default_tcp")]
    pub tcp: Vec<TcpListenerConfig>,
    /// TLS mode of the TCP listeners that do not name one (needs `[tls]`).
    #[serde(default)]
    pub tls: TlsMode,
    #[serde(default = "default_unix")]
    pub unix: Vec<PathBuf>,
    /// NVMe/TCP listeners ("ADDR:PORT"); none unless set.
    #[serde(default)]
    pub nvme_tcp: Vec<String>,
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
    /// Seconds a connection may sit with no request in flight and no bytes arriving.
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
    /// much latency. Each reactor keeps trying its clients without it and
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

fn default_unix_send_buffer() -> ByteSize {
    ByteSize(4 << 20)
}

/// Largest `unix_send_buffer`: more only pins more memory per connection.
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
    /// further apart than the spin), a busy reactor (it gathers instead)
    /// and an idle one cost no spinning.
    #[default]
    Adaptive,
    /// Never sleep: a core per reactor for the lowest latency.
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

/// One TCP listener: an address, or an address with its own TLS mode.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum TcpListenerConfig {
    Addr(String),
    Listener {
        addr: String,
        #[serde(default)]
        tls: Option<TlsMode>,
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
}

impl<'de> Deserialize<'de> for TcpListenerConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = TcpListenerConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address like \"127.0.0.1:10809\" or { addr = ..., tls = ... }")
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
// Initiators keep idle connections open (the kernel client between
// bursts); 5 minutes frees abandoned ones without churning live ones.
fn default_idle_timeout() -> u64 {
    300
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
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferConfig {
    #[serde(default = "default_num_buffers")]
    pub num_shared_buffers: u32,
    #[serde(default = "default_buffer_size")]
    pub buffer_size: ByteSize,
    #[serde(default = "default_cache")]
    pub buf_cache_size: u32,
    /// Small buffers: sizes double from `small_buffer_size` while below
    /// `buffer_size`, each class `num_small_buffers x small_buffer_size`
    /// bytes, and an IO takes one buffer of the smallest class it fits
    /// instead of `buffer_size` pieces (0, or a size not below
    /// `buffer_size`: none).
    #[serde(default = "default_num_small_buffers")]
    pub num_small_buffers: u32,
    #[serde(default = "default_small_buffer_size")]
    pub small_buffer_size: ByteSize,
    /// Largest READ or WRITE a client may send (advertised as the maximum
    /// block size). Large requests stream through a few buffers at a time,
    /// so this does not have to fit in the pool.
    #[serde(default = "default_max_request_size")]
    pub max_request_size: ByteSize,
}

fn default_num_buffers() -> u32 {
    1024
}
fn default_buffer_size() -> ByteSize {
    ByteSize(128 << 10)
}
fn default_cache() -> u32 {
    32
}
/// From SPDK's iobuf small pool (8 KiB): 64 MiB for each class (8, 16, 32
/// and 64 KiB with 128 KiB buffers), mapped without reserve and touched as
/// used.
fn default_num_small_buffers() -> u32 {
    8192
}
fn default_small_buffer_size() -> ByteSize {
    ByteSize(8 << 10)
}
/// Most bytes one small class may map (each class is mapped whole).
pub const MAX_SMALL_CLASS_BYTES: u64 = 16 << 30;

impl BufferConfig {
    /// The pool these settings make: no small buffers unless they are
    /// smaller than the large ones.
    pub fn pool(&self) -> PoolConfig {
        let small = self.small_buffer_size.0 as u32;
        let large = self.buffer_size.0 as u32;
        PoolConfig {
            num_small_buffers: if small < large {
                self.num_small_buffers
            } else {
                0
            },
            small_buffer_size: small,
            ..PoolConfig::large_only(self.num_shared_buffers, large, self.buf_cache_size)
        }
    }
}
fn default_max_request_size() -> ByteSize {
    ByteSize(u64::from(DEFAULT_MAX_REQUEST_BYTES))
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            num_shared_buffers: default_num_buffers(),
            buffer_size: default_buffer_size(),
            buf_cache_size: default_cache(),
            num_small_buffers: default_num_small_buffers(),
            small_buffer_size: default_small_buffer_size(),
            max_request_size: default_max_request_size(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    pub name: String,
    pub bdev: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub description: String,
    /// Who may open it: address ranges, `unix`, `cn:NAME`; absent: everyone.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// Who gets it read-only (the same rules).
    #[serde(default)]
    pub read_only_for: Vec<String>,
    /// Its NVMe subsystem NQN; default `nqn.2026-11.io.iopace:NAME`.
    #[serde(default)]
    pub nqn: Option<String>,
}

impl ExportConfig {
    /// The NVMe subsystem NQN this export is served as.
    pub fn subsystem_nqn(&self) -> String {
        self.nqn
            .clone()
            .unwrap_or_else(|| format!("nqn.2026-11.io.iopace:{}", self.name))
    }
}

impl ExportConfig {
    /// The export's access rules, or the field and message of the first bad one.
    pub fn rules(&self) -> Result<crate::access::ExportRules, (&'static str, String)> {
        let parse = |field: &'static str, list: &[String]| {
            list.iter()
                .map(|r| crate::access::Rule::parse(r))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| (field, m))
        };
        Ok(crate::access::ExportRules {
            allow: self
                .allow
                .as_deref()
                .map(|a| parse("allow", a))
                .transpose()?,
            read_only_for: parse("read_only_for", &self.read_only_for)?,
        })
    }
}

/// A configuration error: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A parsed, validated configuration with the text it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    pub source_name: String,
    pub text: String,
    /// The file it was read from; `None` for the embedded default.
    pub path: Option<PathBuf>,
}

impl Config {
    pub fn load(path: Option<&Path>) -> Result<LoadedConfig, ConfigError> {
        match path {
            None => Self::parse(DEFAULT_CONFIG, DEFAULT_CONFIG_NAME),
            Some(p) => {
                let mut loaded = Self::parse(&read_text(p)?, &p.display().to_string())?;
                loaded.path = Some(p.to_path_buf());
                Ok(loaded)
            }
        }
    }

    pub fn parse(text: &str, source_name: &str) -> Result<LoadedConfig, ConfigError> {
        let config: Config = from_toml(text, source_name)?;
        let loaded = LoadedConfig {
            config,
            source_name: source_name.to_string(),
            text: text.to_string(),
            path: None,
        };
        loaded.validate()?;
        Ok(loaded)
    }
}

impl LoadedConfig {
    /// An error about field `field` of the `index`-th `[[table]]` (or of `[table]`).
    pub fn error_at(&self, table: &str, index: usize, field: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.source_name.clone(),
            line: locate(&self.text, table, index, field),
            field: Some(format!("{table}.{field}")),
            message,
        }
    }

    /// An error about field `field` of `[table]`, from a [`bounds`] check.
    fn field_error(&self, table: &str, (field, message): bounds::FieldError) -> ConfigError {
        self.error_at(table, 0, field, message)
    }

    /// Semantic checks serde cannot do. Bdev stack errors are checked when
    /// the stack is built, and reported through [`LoadedConfig::error_at`] too.
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_buffers()?;
        self.validate_pacing()?;
        self.validate_exports()
    }

    fn validate_server(&self) -> Result<(), ConfigError> {
        let s = &self.config.server;
        let field = |e| self.field_error("server", e);
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
        for (name, value) in [
            ("handshake_timeout_s", s.handshake_timeout_s),
            ("idle_timeout_s", s.idle_timeout_s),
            ("payload_timeout_s", s.payload_timeout_s),
        ] {
            bounds::in_range(name, value, 1, MAX_CONN_TIMEOUT_S).map_err(field)?;
        }
        bounds::in_range("poll_spin_us", s.poll_spin_us, 0, MAX_POLL_SPIN_US).map_err(field)?;
        bounds::in_range("batch_wait_us", s.batch_wait_us, 0, MAX_BATCH_WAIT_US).map_err(field)?;
        bounds::in_range(
            "unix_send_buffer",
            s.unix_send_buffer.0,
            0,
            MAX_UNIX_SEND_BUFFER,
        )
        .map_err(field)?;
        for listener in &s.tcp {
            check_tcp_address(listener.addr()).map_err(|m| self.error_at("server", 0, "tcp", m))?;
        }
        for path in &s.unix {
            check_socket_path(path).map_err(|m| self.error_at("server", 0, "unix", m))?;
        }
        for addr in &s.nvme_tcp {
            check_tcp_address(addr).map_err(|m| self.error_at("server", 0, "nvme_tcp", m))?;
        }
        if !s.rpc.as_os_str().is_empty() {
            check_socket_path(&s.rpc).map_err(|m| self.error_at("server", 0, "rpc", m))?;
        }
        self.validate_tls()?;
        if let Some(addr) = &s.metrics {
            check_tcp_address(addr).map_err(|m| self.error_at("server", 0, "metrics", m))?;
        }
        if s.tcp.is_empty() && s.unix.is_empty() && s.nvme_tcp.is_empty() {
            return Err(self.error_at(
                "server",
                0,
                "tcp",
                "no listener: give at least one tcp address, unix path or nvme_tcp address".into(),
            ));
        }
        Ok(())
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        let s = &self.config.server;
        let wants_tls = s.tcp.iter().any(|l| l.tls(s.tls) != TlsMode::Off);
        match &self.config.tls {
            None if wants_tls => Err(self.error_at(
                "server",
                0,
                "tls",
                "a TLS listener needs a [tls] table with cert and key".into(),
            )),
            Some(t) => {
                bounds::in_range("max_sessions", t.max_sessions, 1, bounds::MAX_TLS_SESSIONS)
                    .map_err(|e| self.field_error("tls", e))
            }
            None => Ok(()),
        }
    }

    /// The rustls configuration of `[tls]`, with its files read and checked.
    pub fn tls_config(&self) -> Result<Option<Arc<rustls::ServerConfig>>, ConfigError> {
        let Some(t) = &self.config.tls else {
            return Ok(None);
        };
        crate::tls::server_config(t)
            .map(Some)
            .map_err(|(field, m)| self.error_at("tls", 0, field, m))
    }

    fn validate_buffers(&self) -> Result<(), ConfigError> {
        let b = &self.config.buffers;
        let size = b.buffer_size.0;
        if size < 4096 || !size.is_multiple_of(4096) || size > (16 << 20) {
            return Err(self.error_at(
                "buffers",
                0,
                "buffer_size",
                format!("must be a multiple of 4 KiB between 4 KiB and 16 MiB, got {size}"),
            ));
        }
        let field = |e| self.field_error("buffers", e);
        bounds::in_range(
            "num_shared_buffers",
            b.num_shared_buffers,
            1,
            bounds::MAX_SHARED_BUFFERS,
        )
        .map_err(field)?;
        bounds::in_range("buf_cache_size", b.buf_cache_size, 0, b.num_shared_buffers)
            .map_err(field)?;
        bounds::in_range(
            "num_small_buffers",
            b.num_small_buffers,
            0,
            bounds::MAX_SHARED_BUFFERS,
        )
        .map_err(field)?;
        let small = b.small_buffer_size.0;
        if small < 4096 || !small.is_multiple_of(4096) || small > (16 << 20) {
            return Err(self.error_at(
                "buffers",
                0,
                "small_buffer_size",
                format!("must be a multiple of 4 KiB between 4 KiB and 16 MiB, got {small}"),
            ));
        }
        let class_bytes = u64::from(b.num_small_buffers) * small;
        if class_bytes > MAX_SMALL_CLASS_BYTES {
            return Err(self.error_at(
                "buffers",
                0,
                "num_small_buffers",
                format!(
                    "x small_buffer_size is {class_bytes} bytes for each small class, \
                     more than {MAX_SMALL_CLASS_BYTES}"
                ),
            ));
        }
        let max = b.max_request_size.0;
        if max < 4096 || !max.is_multiple_of(4096) || max > u64::from(MAX_REQUEST_LIMIT) {
            return Err(self.error_at(
                "buffers",
                0,
                "max_request_size",
                format!(
                    "must be a multiple of 4 KiB between 4 KiB and {MAX_REQUEST_LIMIT} bytes, got {max}"
                ),
            ));
        }
        Ok(())
    }

    fn validate_pacing(&self) -> Result<(), ConfigError> {
        let c = &self.config;
        if let Err((field, message)) = bounds::check_pacing(&c.pacing) {
            let field = field.split('.').next_back().unwrap_or(field);
            return Err(self.error_at("pacing", 0, field, message));
        }
        for (name, q) in &c.qos {
            if let Err((field, message)) = q.validate() {
                return Err(self.error_at(&format!("qos.{name}"), 0, field, message));
            }
            // A cap beside a light tenant needs a tenant to be light and
            // another to hold back.
            if q.light_depth.is_some() && c.pacing.tenants.len() < 2 {
                return Err(self.error_at(
                    &format!("qos.{name}"),
                    0,
                    "light_depth",
                    "needs two or more [pacing] tenants (a light one beside those it holds back)"
                        .into(),
                ));
            }
        }
        for (name, model) in &c.cost {
            if let Err(e) = bounds::check_cost(model) {
                return Err(self.field_error(&format!("cost.{name}"), e));
            }
        }
        for (i, t) in c.pacing.tenants.iter().enumerate() {
            for e in &t.exports {
                if !c.exports.iter().any(|x| &x.name == e) {
                    return Err(ConfigError {
                        file: self.source_name.clone(),
                        line: locate(&self.text, "pacing.tenants", i, "exports"),
                        field: Some("pacing.tenants.exports".into()),
                        message: format!("tenant `{}` names unknown export `{e}`", t.name),
                    });
                }
            }
        }
        Ok(())
    }

    fn validate_exports(&self) -> Result<(), ConfigError> {
        let c = &self.config;
        if c.exports.is_empty() {
            return Err(ConfigError {
                file: self.source_name.clone(),
                line: None,
                field: Some("export".into()),
                message: "no [[export]] defined".into(),
            });
        }
        // Engines tag requests with a 16-bit export index: one more export
        // would be served from another's bdev.
        if c.exports.len() > MAX_EXPORTS {
            let msg = format!("more than {MAX_EXPORTS} exports");
            return Err(self.error_at("export", MAX_EXPORTS, "name", msg));
        }
        let mut names = std::collections::HashSet::with_capacity(c.exports.len());
        for (i, e) in c.exports.iter().enumerate() {
            if e.name.len() > 4096 {
                return Err(self.error_at("export", i, "name", "longer than 4096 bytes".into()));
            }
            if e.description.len() > 4096 {
                return Err(self.error_at(
                    "export",
                    i,
                    "description",
                    "longer than 4096 bytes".into(),
                ));
            }
            if let Err((field, m)) = e.rules() {
                return Err(self.error_at("export", i, field, m));
            }
            if !names.insert(e.name.as_str()) {
                return Err(self.error_at(
                    "export",
                    i,
                    "name",
                    format!("duplicate export name `{}`", e.name),
                ));
            }
        }
        Ok(())
    }

    /// The largest READ or WRITE payload clients may send. It need not fit
    /// in the pool: large requests stream through a few buffers at a time.
    pub fn max_request_bytes(&self) -> u32 {
        let max = self.config.buffers.max_request_size.0;
        debug_assert!(max <= u64::from(MAX_REQUEST_LIMIT), "validated at load");
        max.min(u64::from(MAX_REQUEST_LIMIT)) as u32
    }

    /// The effective configuration as JSON, for the `get_config` RPC.
    pub fn to_json(&self) -> serde_json::Value {
        let value: toml::Value =
            toml::from_str(&self.text).unwrap_or(toml::Value::Table(Default::default()));
        let mut json = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
        // Report the overrides and defaults actually in force, not just the file.
        let s = &self.config.server;
        json["server"] = serde_json::json!({
            "reactors": s.reactors,
            "tcp": s.tcp,
            "tls": s.tls,
            "unix": s.unix,
            "rpc": s.rpc,
            "max_requests_per_reactor": s.max_requests_per_reactor,
            "drain_timeout_s": s.drain_timeout_s,
            "metrics": s.metrics,
            "handshake_timeout_s": s.handshake_timeout_s,
            "idle_timeout_s": s.idle_timeout_s,
            "payload_timeout_s": s.payload_timeout_s,
            "poll": s.poll,
            "poll_spin_us": s.poll_spin_us,
            "batch_wait_us": s.batch_wait_us,
            "splice": s.splice,
            "unix_send_buffer": s.unix_send_buffer.0,
        });
        let b = &self.config.buffers;
        json["buffers"] = serde_json::json!({
            "num_shared_buffers": b.num_shared_buffers,
            "buffer_size": b.buffer_size.0,
            "buf_cache_size": b.buf_cache_size,
            "num_small_buffers": b.num_small_buffers,
            "small_buffer_size": b.small_buffer_size.0,
            "max_request_size": b.max_request_size.0,
        });
        json["pacing"] = serde_json::to_value(&self.config.pacing).unwrap_or_default();
        json["source"] = serde_json::Value::String(self.source_name.clone());
        json
    }
}

/// Largest config file read; anything bigger is not a config.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A config file's text; failing to read it is an error naming the file.
/// Only regular files are read: a FIFO or a device such as /dev/urandom
/// would block or never end.
pub fn read_text(path: &Path) -> Result<String, ConfigError> {
    let error = |message: String| ConfigError {
        file: path.display().to_string(),
        line: None,
        field: None,
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| error(format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(error("not a regular file".into()));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(error(format!(
            "{} bytes: larger than {MAX_CONFIG_BYTES}, not a config file",
            meta.len()
        )));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES).read_to_string(&mut text))
        .map_err(|e| error(format!("cannot read: {e}")))?;
    Ok(text)
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

/// Deserializes TOML text; a syntax or type error names the file, line and field.
pub fn from_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    source_name: &str,
) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let field = e
            .span()
            .and_then(|s| key_at(text, s.start))
            .or_else(|| backticked(e.message()));
        ConfigError {
            file: source_name.to_string(),
            line,
            field,
            message: e.message().trim().to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_parses() {
        let c = Config::load(None).expect("default config");
        assert_eq!(c.config.exports.len(), 3);
        assert_eq!(c.max_request_bytes(), DEFAULT_MAX_REQUEST_BYTES);
    }

    #[test]
    fn more_exports_than_their_16_bit_index_is_an_error() {
        let mut text = String::from("[[bdev]]\nname = \"n\"\nkind = \"null\"\nsize = 4096\n");
        for i in 0..=MAX_EXPORTS {
            text.push_str(&format!("[[export]]\nname = \"e{i}\"\nbdev = \"n\"\n"));
        }
        let e = Config::parse(&text, "x.toml").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("export.name"), "{e:?}");
        assert_eq!(e.line, Some(5 + 3 * MAX_EXPORTS + 1), "{e:?}");
    }

    #[test]
    fn the_most_exports_load_in_linear_time() {
        // The duplicate-name check compared every export with those before
        // it: 2^31 comparisons here, seconds in a debug build.
        let config = |n: usize, dup: bool| {
            let mut text = String::from("[[bdev]]\nname = \"n\"\nkind = \"null\"\nsize = 4096\n");
            for i in 0..n {
                let i = if dup && i == n - 1 { 0 } else { i };
                text.push_str(&format!("[[export]]\nname = \"e{i}\"\nbdev = \"n\"\n"));
            }
            text
        };
        let (small, big) = (config(MAX_EXPORTS / 8, false), config(MAX_EXPORTS, false));
        let timed = |text: &str| {
            let t = std::time::Instant::now();
            Config::parse(text, "x.toml").expect("distinct names");
            t.elapsed()
        };
        let (t_small, t_big) = (timed(&small), timed(&big));
        // Linear: about 8x; quadratic: about 64x, minus the parsing.
        assert!(t_big < t_small * 24, "{t_small:?} for 1/8 of {t_big:?}");
        let e = Config::parse(&config(MAX_EXPORTS, true), "x.toml").expect_err("dup");
        assert_eq!(e.line, Some(5 + 3 * (MAX_EXPORTS - 1) + 1), "{e:?}");
        assert!(e.message.contains("duplicate export name `e0`"), "{e}");
    }

    #[test]
    fn a_syntax_error_names_its_line_and_no_made_up_field() {
        for (text, line) in [
            ("[server]\nreactors = 1\ngarbage [[\n", 3),
            ("[server\nreactors = 1\n", 1),
        ] {
            let e = Config::parse(text, "x.toml").expect_err(text);
            assert_eq!(e.line, Some(line), "{e}");
            assert_eq!(e.field, None, "{e}");
            assert!(
                e.to_string().starts_with(&format!("x.toml:{line}: ")),
                "{e}"
            );
        }
        // Serde's messages still name theirs.
        let e = Config::parse("[server]\nreactor = 1\n", "x.toml").expect_err("typo");
        assert_eq!(e.field.as_deref(), Some("reactor"), "{e}");
    }

    #[test]
    fn unknown_field_names_line_and_field() {
        let text = "[server]\nreactors = 1\n\n[buffers]\nnum_shared_bufers = 3\n";
        let e = Config::parse(text, "x.toml").unwrap_err();
        assert_eq!(e.file, "x.toml");
        assert_eq!(e.line, Some(5));
        assert_eq!(e.field.as_deref(), Some("num_shared_bufers"));
    }

    #[test]
    fn a_listener_table_with_a_misspelt_key_or_mode_is_an_error() {
        let cfg = |l: &str| {
            format!(
                "[server]\ntcp = [\"127.0.0.1:1\",\n  {l}]\n\
                 [[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n\
                 [[export]]\nname = \"a\"\nbdev = \"m\"\n"
            )
        };
        let ok = Config::parse(&cfg(r#"{ addr = "127.0.0.1:2", tls = "off" }"#), "x.toml");
        let tcp = &ok.expect("listener table").config.server.tcp;
        assert_eq!(tcp[0].tls(TlsMode::On), TlsMode::On);
        assert_eq!(tcp[1].tls(TlsMode::On), TlsMode::Off);
        // `tsl` was taken as a listener without TLS: plaintext where TLS was meant.
        let e = Config::parse(
            &cfg(r#"{ addr = "127.0.0.1:2", tsl = "require" }"#),
            "x.toml",
        );
        let e = e.expect_err("misspelt tls");
        assert!(e.to_string().contains("unknown field `tsl`"), "{e}");
        let e = Config::parse(
            &cfg(r#"{ addr = "127.0.0.1:2", tls = "requre" }"#),
            "x.toml",
        );
        let e = e.expect_err("misspelt mode");
        assert!(e.to_string().contains("unknown variant `requre`"), "{e}");
        assert_eq!(e.line, Some(3), "{e}");
        let e = Config::parse(&cfg("7"), "x.toml").expect_err("a number");
        assert!(e.to_string().contains("an address like"), "{e}");
    }

    #[test]
    fn wrong_type_names_line_and_field() {
        let text = "[server]\nreactors = \"two\"\n";
        let e = Config::parse(text, "x.toml").unwrap_err();
        assert_eq!(e.line, Some(2));
        assert_eq!(e.field.as_deref(), Some("reactors"));
    }

    #[test]
    fn semantic_error_names_line_and_field() {
        let text = "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n\n[[export]]\nname = \"a\"\nbdev = \"m\"\n\n[[export]]\nname = \"a\"\nbdev = \"m\"\n";
        let e = Config::parse(text, "x.toml").unwrap_err();
        assert_eq!(e.line, Some(11), "{e}");
        assert_eq!(e.field.as_deref(), Some("export.name"));
        assert!(
            e.to_string().starts_with("x.toml:11: field `export.name`"),
            "{e}"
        );
    }

    #[test]
    fn bad_buffer_size_is_rejected() {
        let text = "[buffers]\nbuffer_size = 1000\n[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n[[export]]\nname = \"a\"\nbdev = \"m\"\n";
        let e = Config::parse(text, "x.toml").unwrap_err();
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn small_buffers_are_checked_and_only_used_below_the_buffer_size() {
        let cfg = |buffers: &str| {
            format!(
                "[buffers]\n{buffers}\n[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n\
                 [[export]]\nname = \"a\"\nbdev = \"m\"\n"
            )
        };
        let pool = |buffers: &str| {
            let c = Config::parse(&cfg(buffers), "x.toml").expect("valid");
            c.config.buffers.pool()
        };
        assert_eq!(pool("").num_small_buffers, 8192, "on by default");
        assert_eq!(pool("").small_buffer_size, 8192);
        assert_eq!(pool("num_small_buffers = 0").num_small_buffers, 0);
        // A small size that is not smaller than the large one: no small class.
        assert_eq!(pool("buffer_size = \"8K\"").num_small_buffers, 0);
        for bad in [
            "small_buffer_size = 1000",
            "small_buffer_size = \"32M\"",
            "num_small_buffers = 2000000",
            "num_small_buffers = 1000000\nsmall_buffer_size = \"1M\"",
        ] {
            let e = Config::parse(&cfg(bad), "x.toml").unwrap_err();
            let field = bad.split(' ').next().map(|f| format!("buffers.{f}"));
            assert_eq!(e.field, field, "{bad}: {e}");
            assert_eq!(e.line, Some(2), "{bad}: {e}");
        }
    }

    #[test]
    fn max_request_size_is_bounded_and_need_not_fit_the_pool() {
        let cfg = |max: &str| {
            format!(
                "[buffers]\nnum_shared_buffers = 4\nbuf_cache_size = 0\nmax_request_size = {max}\n\
                 [[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n\
                 [[export]]\nname = \"a\"\nbdev = \"m\"\n"
            )
        };
        let c = Config::parse(&cfg("\"1G\""), "x.toml").expect("1 GiB with a 512 KiB pool");
        assert_eq!(c.max_request_bytes(), 1 << 30);
        for bad in ["1000", "\"4G\"", "0"] {
            let e = Config::parse(&cfg(bad), "x.toml").unwrap_err();
            assert_eq!(
                e.field.as_deref(),
                Some("buffers.max_request_size"),
                "{bad}: {e}"
            );
            assert_eq!(e.line, Some(4), "{bad}: {e}");
        }
    }

    #[test]
    fn readme_example_config_parses() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("```toml\n").expect("README has a toml block") + 8;
        let len = readme[start..].find("```").expect("block ends");
        let c = Config::parse(&readme[start..start + len], "README.md").expect("valid config");
        assert!(c.config.qos.contains_key("disk"));
    }

    #[test]
    fn a_bad_latency_target_names_line_and_field() {
        let text = "[[bdev]]\nname = \"m\"\nkind = \"null\"\nsize = \"1MiB\"\n[[export]]\nname = \"e\"\nbdev = \"m\"\n[qos.m]\nrpct = 95\nrlat_us = 0\n";
        let e = Config::parse(text, "t.toml").expect_err("rlat_us = 0 is refused");
        assert_eq!(e.field.as_deref(), Some("qos.m.rlat_us"));
        assert_eq!(e.line, Some(10));
    }

    #[test]
    fn vrate_bounds_may_sit_below_100_but_not_cross() {
        let qos = "[[bdev]]\nname = \"m\"\nkind = \"null\"\nsize = \"1MiB\"\n[[export]]\nname = \"e\"\nbdev = \"m\"\n[qos.m]\n";
        // Held at 30%: no latency target needed.
        let c = Config::parse(&format!("{qos}min = 30.0\nmax = 30.0\n"), "t.toml").expect("held");
        assert_eq!((c.config.qos["m"].min, c.config.qos["m"].max), (30.0, 30.0));
        let e = Config::parse(&format!("{qos}min = 40.0\nmax = 30.0\n"), "t.toml")
            .expect_err("max under min is refused");
        assert_eq!(e.field.as_deref(), Some("qos.m.max"));
        assert_eq!(e.line, Some(10));
        let e = Config::parse(&format!("{qos}min = 20.0\nmax = 30.0\n"), "t.toml")
            .expect_err("a range needs a target to move in it");
        assert_eq!(e.field.as_deref(), Some("qos.m.rpct"));
    }

    #[test]
    fn a_light_depth_needs_tenants_and_a_sane_count() {
        let bdevs = "[[bdev]]\nname = \"m\"\nkind = \"null\"\nsize = \"1MiB\"\n[[export]]\nname = \"e\"\nbdev = \"m\"\n[[export]]\nname = \"f\"\nbdev = \"m\"\n";
        let tenants = "[pacing]\ntenants = [{ name = \"a\", exports = [\"e\"] }, { name = \"b\", exports = [\"f\"] }]\n";
        let c = Config::parse(
            &format!("{tenants}{bdevs}[qos.m]\nlight_depth = 16\n"),
            "t.toml",
        )
        .expect("a cap alone");
        assert_eq!(c.config.qos["m"].light_depth, Some(16));
        let e = Config::parse(&format!("{bdevs}[qos.m]\nlight_depth = 16\n"), "t.toml")
            .expect_err("no tenants");
        assert_eq!(e.field.as_deref(), Some("qos.m.light_depth"));
        assert_eq!(e.line, Some(12));
        let e = Config::parse(
            &format!("{tenants}{bdevs}[qos.m]\nlight_depth = 0\n"),
            "t.toml",
        )
        .expect_err("a cap of 0");
        assert_eq!(e.field.as_deref(), Some("qos.m.light_depth"));
        assert_eq!(e.line, Some(14));
    }

    const ONE_EXPORT: &str =
        "[[bdev]]\nname = \"m\"\nkind = \"null\"\nsize = \"1MiB\"\n[[export]]\nname = \"e\"\nbdev = \"m\"\n";

    #[test]
    fn absurd_server_values_name_their_field() {
        for (line, field) in [
            (
                "max_requests_per_reactor = 1000000000",
                "server.max_requests_per_reactor",
            ),
            ("reactors = 100000", "server.reactors"),
            ("drain_timeout_s = 99999999", "server.drain_timeout_s"),
            ("payload_timeout_s = 0", "server.payload_timeout_s"),
            ("poll_spin_us = 1000000", "server.poll_spin_us"),
            ("batch_wait_us = 5000", "server.batch_wait_us"),
            ("unix_send_buffer = \"1GiB\"", "server.unix_send_buffer"),
            ("tcp = [\"no.such.host.invalid:10809\"]", "server.tcp"),
        ] {
            let text = format!("[server]\n{line}\n{ONE_EXPORT}");
            let e = Config::parse(&text, "x.toml").expect_err(line);
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
            assert_eq!(e.line, Some(2), "{e}");
        }
    }

    #[test]
    fn an_unknown_splice_mode_names_the_choices() {
        let text = format!("[server]\nsplice = \"tcp\"\n{ONE_EXPORT}");
        let e = Config::parse(&text, "x.toml").expect_err("tcp");
        assert_eq!(e.line, Some(2), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("splice") && msg.contains("`off`, `unix`, `all`"),
            "{msg}"
        );
        let ok = format!("[server]\nsplice = \"all\"\nunix_send_buffer = \"1MiB\"\n{ONE_EXPORT}");
        let c = Config::parse(&ok, "x.toml").expect("valid");
        assert_eq!(c.config.server.splice, SpliceMode::All);
        assert_eq!(c.config.server.unix_send_buffer.0, 1 << 20);
    }

    #[test]
    fn socket_paths_a_listener_cannot_take_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("file.txt");
        std::fs::write(&file, "x").expect("write");
        let long = dir.path().join("s".repeat(MAX_SOCKET_PATH));
        for (path, why) in [
            (long.as_path(), "longer than"),
            (Path::new("/nonexistent-dir/a.sock"), "does not exist"),
            (file.as_path(), "not a socket"),
        ] {
            let e = check_socket_path(path).expect_err(why);
            assert!(e.contains(why), "{e}");
        }
        check_socket_path(&dir.path().join("ok.sock")).expect("a new socket in a directory");
        check_socket_path(Path::new("relative.sock")).expect("the working directory");
    }

    #[test]
    fn an_unknown_poll_mode_lists_the_known_ones() {
        let text = format!("[server]\npoll = \"spin\"\n{ONE_EXPORT}");
        let e = Config::parse(&text, "x.toml").expect_err("no such mode");
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("adaptive"), "{e}");
    }

    #[test]
    fn host_names_resolve() {
        let text = format!("[server]\ntcp = [\"localhost:10809\"]\n{ONE_EXPORT}");
        Config::parse(&text, "x.toml").expect("localhost resolves");
    }

    #[test]
    fn bad_cost_models_are_refused_with_a_line() {
        for value in ["nan", "inf", "0.0", "-1.0"] {
            let text = format!(
                "{ONE_EXPORT}[cost.m]\nrbps = 1e9\nrseqiops = {value}\nrrandiops = 1.0\nwbps = 1.0\nwseqiops = 1.0\nwrandiops = 1.0\n"
            );
            let e = Config::parse(&text, "x.toml").expect_err(value);
            assert_eq!(e.field.as_deref(), Some("cost.m.rseqiops"), "{e}");
            assert_eq!(e.line, Some(10), "{e}");
        }
    }

    #[test]
    fn inline_table_errors_carry_a_line() {
        let text = format!(
            "{ONE_EXPORT}\ncost = {{ m = {{ rbps = 1.0, rseqiops = 1.0, rrandiops = 1.0, wbps = -1.0, wseqiops = 1.0, wrandiops = 1.0 }} }}\n"
        );
        let e = Config::parse(&text, "x.toml").expect_err("negative wbps");
        assert_eq!(e.line, Some(9), "{e}");
        let text = "export = [{ name = \"a\", bdev = \"m\" },\n  { name = \"a\", bdev = \"m\" }]\n";
        let e = Config::parse(text, "x.toml").expect_err("duplicate");
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn a_config_that_is_not_a_regular_file_is_refused() {
        let e = read_text(Path::new("/dev/urandom")).expect_err("a device");
        assert!(e.message.contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().expect("tempdir");
        let e = read_text(dir.path()).expect_err("a directory");
        assert!(e.message.contains("not a regular file"), "{e}");
    }

    #[test]
    fn locate_falls_back_to_header() {
        let text = "[[bdev]]\nname = \"a\"\n[[bdev]]\nname = \"b\"\n";
        assert_eq!(locate(text, "bdev", 1, "base"), Some(3));
        assert_eq!(locate(text, "bdev", 1, "name"), Some(4));
    }

    #[test]
    fn locate_finds_top_level_keys_before_any_table() {
        let text = "name = \"a\"\nqds = []\n[t]\nqds = 1\n";
        assert_eq!(locate(text, "", 0, "qds"), Some(2));
        assert_eq!(locate(text, "", 0, "seed"), None);
    }
}
