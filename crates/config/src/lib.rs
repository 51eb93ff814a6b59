//! The target's configuration: TOML with an embedded default, validated up
//! front so that every error names the file, line and field. The target
//! (`server`) and the tools (`probe`, `sim`) read it through this crate,
//! which links no network stack.
//!
//! Each section is its own module with its own checks: [`server`],
//! [`buffers`], [`export`], [`tls`], and the listeners' wires [`ports`]; the cost database is [`cost_db`],
//! the access rules of exports [`access`], shared bounds [`bounds`].

pub mod access;
pub mod bounds;
mod buffers;
pub mod cost_db;
mod export;
pub mod ports;
mod server;
pub mod tls;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bdev::{BdevSpec, BdevTable};
use pace::pacer::{CostModel, PacingConfig, QosConfig};
use serde::Deserialize;

pub use buffers::{BufferConfig, MAX_SMALL_CLASS_BYTES};
pub use export::ExportConfig;
pub use ports::WirePorts;
pub use server::{
    check_socket_path, check_tcp_address, PollMode, ServerConfig, SpliceMode, TcpListenerConfig,
    MAX_SOCKET_PATH,
};
pub use tls::TlsConfig;
pub use tomlfile::{from_toml, locate, read_text, ConfigError};

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
    /// `[[bdev]]` as written; checked into [`LoadedConfig::bdevs`].
    #[serde(default, rename = "bdev")]
    pub bdev_tables: Vec<BdevTable>,
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

/// A parsed, validated configuration with the text it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    pub source_name: String,
    pub text: String,
    /// The file it was read from; `None` for the embedded default.
    pub path: Option<PathBuf>,
    /// The bdevs, typed (one variant per kind), from `config.bdev_tables`.
    pub bdevs: Vec<BdevSpec>,
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
        let mut loaded = LoadedConfig {
            config,
            source_name: source_name.to_string(),
            text: text.to_string(),
            path: None,
            bdevs: Vec::new(),
        };
        loaded.bdevs = bdev::specs(&loaded.config.bdev_tables)
            .map_err(|e| loaded.error_at("bdev", e.index, e.field, e.message))?;
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
    pub(crate) fn field_error(
        &self,
        table: &str,
        (field, message): bounds::FieldError,
    ) -> ConfigError {
        self.error_at(table, 0, field, message)
    }

    /// Semantic checks serde cannot do. Bdev stack errors are checked when
    /// the stack is built, and reported through [`LoadedConfig::error_at`] too.
    fn validate(&self) -> Result<(), ConfigError> {
        self.config.server.check(self)?;
        self.config.buffers.check(self)?;
        self.validate_pacing()?;
        self.validate_exports()
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
        export::check_bitmap_files(self)?;
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
            if let Err((field, m)) = e.rules().map(|_| ()).and_then(|()| e.check_bitmaps()) {
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
            "tcp_notsent_lowat": s.tcp_notsent_lowat.0,
            "tcp_send_buffer": s.tcp_send_buffer.0,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TlsMode;

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
    fn the_removed_tls_max_sessions_is_an_error_naming_its_line() {
        let text = "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n\
                    [[export]]\nname = \"a\"\nbdev = \"m\"\n\
                    [tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nmax_sessions = 256\n";
        let e = Config::parse(text, "x.toml").expect_err("removed key");
        assert_eq!(e.line, Some(11), "{e}");
        assert_eq!(e.field.as_deref(), Some("tls.max_sessions"), "{e}");
        assert!(e.message.contains("removed"), "{e}");
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
        // The full example: the toml block that starts with [server].
        let start = readme
            .find("```toml\n[server]")
            .expect("README has the example")
            + 8;
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
            ("tcp_notsent_lowat = \"1GiB\"", "server.tcp_notsent_lowat"),
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
