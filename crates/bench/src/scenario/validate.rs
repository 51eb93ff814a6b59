//! Scenario checks: every error names the file, line and field.

use tomlfile::ConfigError;

use super::{
    parse_size, parse_tc_rate, value_text, HostKind, Loaded, PortGbps, TargetKind, Transport,
    PORT_RATE_VAR, WIRE,
};

/// The most a told port capacity may be, Gb/s (the target's own bound).
const MAX_PORT_GBPS: f64 = 100_000.0;

fn ok_name(n: &str) -> bool {
    !n.is_empty()
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The checks of one loaded scenario.
struct Checks<'a>(&'a Loaded);

/// Checks a loaded scenario: the first error, located.
pub(super) fn validate(loaded: &Loaded) -> Result<(), ConfigError> {
    Checks(loaded).all()
}

impl Checks<'_> {
    /// Err with the field's location unless `ok`.
    fn ensure(
        &self,
        ok: bool,
        table: &str,
        index: usize,
        field: &str,
        message: impl Into<String>,
    ) -> Result<(), ConfigError> {
        if ok {
            Ok(())
        } else {
            Err(self.0.error(table, index, field, message.into()))
        }
    }

    fn all(&self) -> Result<(), ConfigError> {
        let s = &self.0.scenario;
        self.ensure(
            ok_name(&s.test.name),
            "test",
            0,
            "name",
            "use letters, digits, - and _",
        )?;
        self.validate_targets()?;
        self.validate_hosts()?;
        self.validate_workload()?;
        self.validate_sweep()?;
        if let Some(x) = &s.test.x {
            self.ensure(
                s.sweep.contains_key(x),
                "test",
                0,
                "x",
                format!("`{x}` is not swept"),
            )?;
        }
        Ok(())
    }

    fn validate_targets(&self) -> Result<(), ConfigError> {
        let targets = &self.0.scenario.target;
        self.ensure(
            !targets.is_empty(),
            "target",
            0,
            "name",
            "at least one [[target]]",
        )?;
        for (i, t) in targets.iter().enumerate() {
            let iopace = t.kind == TargetKind::Iopace;
            self.ensure(
                ok_name(&t.name),
                "target",
                i,
                "name",
                "use letters, digits, - and _",
            )?;
            let twice = targets[..i].iter().any(|o| o.name == t.name);
            self.ensure(!twice, "target", i, "name", format!("`{}` twice", t.name))?;
            let config = t.config.is_some() || t.config_file.is_some();
            let msg = "only iopace targets take a config; peers take `args`";
            self.ensure(iopace || !config, "target", i, "config", msg)?;
            let msg = "only iopace targets take another binary";
            self.ensure(iopace || t.bin.is_none(), "target", i, "bin", msg)?;
            let both = t.config.is_some() && t.config_file.is_some();
            let msg = "give `config` or `config_file`, not both";
            self.ensure(!both, "target", i, "config_file", msg)?;
            if let Some(size) = &t.file_size {
                let msg = format!("`{size}` is not a size like 1GiB or 512m");
                self.ensure(parse_size(size).is_some(), "target", i, "file_size", msg)?;
            }
            if let Some(g) = &t.port_gbps {
                self.validate_port_gbps(i, iopace, g)?;
            }
        }
        Ok(())
    }

    fn validate_port_gbps(&self, i: usize, iopace: bool, g: &PortGbps) -> Result<(), ConfigError> {
        let msg = "only iopace targets are told their port's capacity";
        self.ensure(iopace, "target", i, "port_gbps", msg)?;
        match g {
            PortGbps::Gbps(g) => {
                let ok = *g > 0.0 && *g <= MAX_PORT_GBPS;
                let msg = format!("{g}: Gb/s above 0 and at most {MAX_PORT_GBPS}");
                self.ensure(ok, "target", i, "port_gbps", msg)
            }
            PortGbps::Wire(w) => {
                let msg = format!("`{w}`: a capacity in Gb/s, or \"{WIRE}\" (the port_rate)");
                self.ensure(w == WIRE, "target", i, "port_gbps", msg)?;
                let msg = format!(
                    "\"{WIRE}\" needs a shaped port: [hosts] port_rate, or `{PORT_RATE_VAR}` swept"
                );
                self.ensure(
                    super::port_shaped(&self.0.scenario),
                    "target",
                    i,
                    "port_gbps",
                    msg,
                )
            }
        }
    }

    fn validate_hosts(&self) -> Result<(), ConfigError> {
        let h = &self.0.scenario.hosts;
        self.ensure(
            (1..=64).contains(&h.count),
            "hosts",
            0,
            "count",
            "1 to 64 hosts",
        )?;
        if h.kind == HostKind::Remote {
            let msg = "remote hosts need their fio --server addresses";
            self.ensure(!h.addresses.is_empty(), "hosts", 0, "addresses", msg)?;
            let msg = "remote hosts need the target's address";
            self.ensure(
                h.target_address.is_some(),
                "hosts",
                0,
                "target_address",
                msg,
            )?;
        }
        for (field, v) in [
            ("rate", &h.rate),
            ("delay", &h.delay),
            ("export", &h.export),
        ] {
            let ok = v.as_ref().is_none_or(|v| v.len_matches(h.count));
            let msg = format!("one value per host: count is {}", h.count);
            self.ensure(ok, "hosts", 0, field, msg)?;
        }
        if let Some(bad) = (0..h.count)
            .filter_map(|i| h.rate.as_ref()?.host(i))
            .find(|r| parse_tc_rate(r).is_none())
        {
            let msg = format!("`{bad}` is not a tc rate like 1gbit or 250mbit");
            return Err(self.0.error("hosts", 0, "rate", msg));
        }
        if let Some(bad) = h.port_rate.as_ref().filter(|r| parse_tc_rate(r).is_none()) {
            let msg = format!("`{bad}` is not a tc rate like 1gbit or 250mbit");
            return Err(self.0.error("hosts", 0, "port_rate", msg));
        }
        let msg = "a shaped target port needs kind = \"netns\"";
        let port_ok = h.kind == HostKind::Netns || !super::port_shaped(&self.0.scenario);
        self.ensure(port_ok, "hosts", 0, "port_rate", msg)?;
        let exports = &self.0.scenario.workload.exports;
        if let Some(bad) = (0..h.count)
            .filter_map(|i| h.export.as_ref()?.host(i))
            .find(|e| !exports.iter().any(|x| x == e))
        {
            let msg = format!("`{bad}` is not in [workload] exports");
            return Err(self.0.error("hosts", 0, "export", msg));
        }
        let shaped = h.rate.is_some() || h.delay.is_some();
        let msg = "a shaped wire needs kind = \"netns\"";
        self.ensure(
            h.kind == HostKind::Netns || !shaped,
            "hosts",
            0,
            "rate",
            msg,
        )?;
        let unix_remote = h.transport == Transport::Unix && h.kind != HostKind::Local;
        let msg = "Unix sockets only reach local hosts";
        self.ensure(!unix_remote, "hosts", 0, "transport", msg)
    }

    fn validate_workload(&self) -> Result<(), ConfigError> {
        let s = &self.0.scenario;
        let w = &s.workload;
        let sized = w.bs.is_some() || w.bssplit.is_some() || s.sweep.contains_key("bs");
        self.ensure(sized, "workload", 0, "bs", "give `bs` or `bssplit`")?;
        let msg = "at least one export";
        self.ensure(!w.exports.is_empty(), "workload", 0, "exports", msg)?;
        self.ensure(w.runtime > 0, "workload", 0, "runtime", "at least 1 second")
    }

    fn validate_sweep(&self) -> Result<(), ConfigError> {
        for (k, vals) in &self.0.scenario.sweep {
            self.ensure(!vals.is_empty(), "sweep", 0, k, "an empty list")?;
            let scalars = vals.iter().all(|v| value_text(v).is_some());
            self.ensure(scalars, "sweep", 0, k, "values must be strings or numbers")?;
            let positive = |v: &toml::Value| {
                value_text(v)
                    .and_then(|t| t.parse::<u32>().ok())
                    .is_some_and(|n| n > 0)
            };
            let counts = matches!(k.as_str(), "qd" | "iodepth" | "numjobs");
            let ok = !counts || vals.iter().all(positive);
            self.ensure(ok, "sweep", 0, k, "positive integers")?;
            let rate = |v: &toml::Value| value_text(v).and_then(|t| parse_tc_rate(&t));
            let ok = k != PORT_RATE_VAR || vals.iter().all(|v| rate(v).is_some());
            self.ensure(ok, "sweep", 0, k, "tc rates like 1gbit or 250mbit")?;
            let jobs = |v: &toml::Value| value_text(v).and_then(|t| super::jobs::parse(&t));
            let ok = k != "jobs" || vals.iter().all(|v| jobs(v).is_some());
            let msg = "exports and their depths, like \"gold:1 bronze:32\"";
            self.ensure(ok, "sweep", 0, k, msg)?;
        }
        Ok(())
    }
}
