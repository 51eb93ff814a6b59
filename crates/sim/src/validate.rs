//! Loads a scenario and checks every field serde cannot: each error names
//! the file, the line and the field, as the target's config errors do.

use std::path::Path;

use config::{from_toml, locate, read_text, ConfigError, DEFAULT_MAX_REQUEST_BYTES};

use crate::scenario::{HostGroup, Protocol, RunConfig, Scenario};

/// Reads, parses and validates the scenario at `path`.
pub fn load(path: &str) -> Result<Scenario, ConfigError> {
    let text = read_text(Path::new(path))?;
    parse(&text, path)
}

/// Parses and validates scenario `text`; `source` names it in errors.
pub fn parse(text: &str, source: &str) -> Result<Scenario, ConfigError> {
    let sc: Scenario = from_toml(text, source)?;
    let check = Check { text, source };
    check.top(&sc)?;
    check.target(&sc)?;
    check.ports(&sc)?;
    check.devices(&sc)?;
    for (i, g) in sc.hosts.iter().enumerate() {
        check.host(&sc, i, g)?;
    }
    for (i, r) in sc.runs.iter().enumerate() {
        check.run(&sc, i, r)?;
    }
    Ok(sc)
}

/// Longest simulated stretch accepted, ms: keeps a typo from running for hours.
const MAX_SIM_MS: u64 = 60_000;
/// Most outstanding IOs per host.
const MAX_QD: u32 = 1 << 16;
const MAX_REACTORS: usize = 1024;
/// As the server's bound on a pool class.
const MAX_SMALL_BUFFERS: u32 = 1 << 20;

struct Check<'a> {
    text: &'a str,
    source: &'a str,
}

type Checked = Result<(), ConfigError>;

impl Check<'_> {
    /// An error about `field` of the `index`-th `[[table]]`, of `[target]`, or
    /// (`table` "") of the top level.
    fn error(&self, table: &str, index: usize, field: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.source.to_string(),
            line: locate(self.text, table, index, field),
            field: Some(match table {
                "" => field.to_string(),
                "target" => format!("{table}.{field}"),
                _ => format!("{table}[{index}].{field}"),
            }),
            message,
        }
    }

    /// `Err` naming the field unless `ok`.
    fn ensure(
        &self,
        ok: bool,
        at: (&str, usize, &str),
        message: impl FnOnce() -> String,
    ) -> Checked {
        if ok {
            Ok(())
        } else {
            Err(self.error(at.0, at.1, at.2, message()))
        }
    }

    /// A finite number in `range`.
    fn number(
        &self,
        v: f64,
        range: std::ops::RangeInclusive<f64>,
        at: (&str, usize, &str),
    ) -> Checked {
        self.ensure(v.is_finite() && range.contains(&v), at, || {
            format!("{v} is out of range {}..={}", range.start(), range.end())
        })
    }

    /// A finite rate above zero.
    fn positive(&self, v: f64, at: (&str, usize, &str)) -> Checked {
        self.ensure(v.is_finite() && v > 0.0, at, || {
            format!("{v} must be above 0")
        })
    }

    fn top(&self, sc: &Scenario) -> Checked {
        self.ensure(!sc.qds.is_empty(), ("", 0, "qds"), || {
            "needs at least one QD".into()
        })?;
        let big = sc.qds.iter().find(|&&q| q > MAX_QD);
        self.ensure(big.is_none(), ("", 0, "qds"), || {
            format!("QD {big:?} is above {MAX_QD}")
        })?;
        self.ensure(
            (1..=MAX_SIM_MS).contains(&sc.duration_ms),
            ("", 0, "duration_ms"),
            || format!("must be 1..={MAX_SIM_MS}"),
        )?;
        self.ensure(sc.warmup_ms <= MAX_SIM_MS, ("", 0, "warmup_ms"), || {
            format!("must be at most {MAX_SIM_MS}")
        })?;
        for (table, empty) in [
            ("ports", sc.ports.is_empty()),
            ("devices", sc.devices.is_empty()),
            ("hosts", sc.hosts.is_empty()),
            ("runs", sc.runs.is_empty()),
        ] {
            self.ensure(!empty, ("", 0, table), || {
                format!("needs at least one [[{table}]]")
            })?;
        }
        Ok(())
    }

    fn target(&self, sc: &Scenario) -> Checked {
        let t = &sc.target;
        let at = |field| ("target", 0, field);
        self.ensure(
            (1..=MAX_REACTORS).contains(&t.reactors),
            at("reactors"),
            || format!("must be 1..={MAX_REACTORS}"),
        )?;
        self.ensure(
            t.buffer_size > 0 && t.buffer_size.is_multiple_of(4096),
            at("buffer_size"),
            || "must be a non-zero multiple of 4096".into(),
        )?;
        self.buffers(t.num_shared_buffers, t.buf_cache_size, ("target", 0))?;
        if let Some(size) = t.small_buffer_size {
            self.ensure(
                size >= 4096 && size.is_multiple_of(4096),
                at("small_buffer_size"),
                || "must be a non-zero multiple of 4096".into(),
            )?;
        }
        if let Some(n) = t.num_small_buffers {
            self.ensure(n <= MAX_SMALL_BUFFERS, at("num_small_buffers"), || {
                format!("must be at most {MAX_SMALL_BUFFERS}")
            })?;
        }
        let defaults = config::BufferConfig::default();
        let n = t.num_small_buffers.unwrap_or(defaults.num_small_buffers);
        let size = t
            .small_buffer_size
            .map_or(defaults.small_buffer_size.0, u64::from);
        self.ensure(
            u64::from(n) * size <= config::MAX_SMALL_CLASS_BYTES,
            at("num_small_buffers"),
            || "x small_buffer_size must be at most 16 GiB".into(),
        )?;
        self.positive(t.ddio_budget_mib, at("ddio_budget_mib"))?;
        self.number(t.ddio_slope, 0.0..=1.0, at("ddio_slope"))?;
        self.number(t.ddio_floor, 0.01..=1.0, at("ddio_floor"))?;
        self.number(t.wire_overhead, 1.0..=10.0, at("wire_overhead"))
    }

    /// A pool of `total` buffers with caches of `cache`.
    fn buffers(&self, total: u32, cache: u32, at: (&str, usize)) -> Checked {
        self.ensure(total >= 1, (at.0, at.1, "num_shared_buffers"), || {
            "must be at least 1".into()
        })?;
        self.ensure(cache <= total, (at.0, at.1, "buf_cache_size"), || {
            format!("{cache} is more than the {total} buffers")
        })
    }

    fn ports(&self, sc: &Scenario) -> Checked {
        for (i, p) in sc.ports.iter().enumerate() {
            self.positive(p.rate_gbps, ("ports", i, "rate_gbps"))?;
            self.number(p.rtt_us, 0.0..=1e6, ("ports", i, "rtt_us"))?;
            if let Some((_, rate)) = p.step {
                self.positive(rate, ("ports", i, "step"))?;
            }
        }
        Ok(())
    }

    fn devices(&self, sc: &Scenario) -> Checked {
        for (i, g) in sc.devices.iter().enumerate() {
            let at = |field| ("devices", i, field);
            self.ensure((1..=1 << 16).contains(&g.count), at("count"), || {
                "must be 1..=65536".into()
            })?;
            self.number(g.latency_us, 0.0..=1e7, at("latency_us"))?;
            self.ensure((1..=1 << 16).contains(&g.parallel), at("parallel"), || {
                "must be 1..=65536".into()
            })?;
            if let Some(c) = &g.cost {
                for (name, rate) in c.named() {
                    self.ensure(rate.is_finite() && rate >= 0.0, at("cost"), || {
                        format!("{name} must be a finite number, 0 or more")
                    })?;
                }
            }
            if let Some(q) = &g.qos {
                q.validate()
                    .map_err(|(f, m)| self.error("devices", i, "qos", format!("qos.{f}: {m}")))?;
            }
        }
        Ok(())
    }

    fn host(&self, sc: &Scenario, i: usize, g: &HostGroup) -> Checked {
        let at = |field| ("hosts", i, field);
        self.ensure((1..=1 << 16).contains(&g.count), at("count"), || {
            "must be 1..=65536".into()
        })?;
        self.bssplit(&g.bssplit, at("bssplit"))?;
        self.ensure(g.read_pct <= 100, at("read_pct"), || {
            "must be 0..=100".into()
        })?;
        let devices: usize = sc.devices.iter().map(|d| d.count).sum();
        let bad = g.devices.iter().find(|&&d| d >= devices);
        self.ensure(bad.is_none(), at("devices"), || {
            format!(
                "device {} is past the last of {devices} devices",
                bad.copied().unwrap_or(0)
            )
        })?;
        self.number(g.qd_scale, 0.0..=1024.0, at("qd_scale"))?;
        if let Some(q) = g.fixed_qd {
            self.ensure(q <= MAX_QD, at("fixed_qd"), || {
                format!("must be at most {MAX_QD}")
            })?;
        }
        if let Some(p) = g.port {
            self.ensure(p < sc.ports.len(), at("port"), || {
                format!("port {p} is past the last of {} ports", sc.ports.len())
            })?;
        }
        if let Some(rate) = g.link_gbps {
            self.positive(rate, at("link_gbps"))?;
        }
        if let Some(rtt) = g.rtt_us {
            self.number(rtt, 0.0..=1e6, at("rtt_us"))?;
        }
        Ok(())
    }

    /// A block-size split: sizes 512-byte multiples up to the largest
    /// request the target accepts, weights not all 0.
    fn bssplit(&self, split: &[(u32, u32)], at: (&str, usize, &str)) -> Checked {
        self.ensure(!split.is_empty(), at, || {
            "needs at least one [bytes, weight] pair".into()
        })?;
        let bad = split
            .iter()
            .find(|(b, _)| *b == 0 || b % 512 != 0 || *b > DEFAULT_MAX_REQUEST_BYTES);
        self.ensure(bad.is_none(), at, || {
            format!(
                "size {:?} must be a multiple of 512, 512..={DEFAULT_MAX_REQUEST_BYTES}",
                bad.map(|b| b.0)
            )
        })?;
        self.ensure(split.iter().any(|(_, w)| *w > 0), at, || {
            "every weight is 0".into()
        })
    }

    fn run(&self, sc: &Scenario, i: usize, r: &RunConfig) -> Checked {
        let at = |field| ("runs", i, field);
        r.pacing
            .validate()
            .map_err(|(f, m)| self.error("runs", i, "pacing", format!("pacing.{f}: {m}")))?;
        if let Some(q) = &r.qos {
            q.validate()
                .map_err(|(f, m)| self.error("runs", i, "qos", format!("qos.{f}: {m}")))?;
        }
        let total = r.num_shared_buffers.unwrap_or(sc.target.num_shared_buffers);
        let cache = r.buf_cache_size.unwrap_or(sc.target.buf_cache_size);
        self.buffers(total, cache, ("runs", i))?;
        if let Some(n) = r.reactors {
            self.ensure((1..=MAX_REACTORS).contains(&n), at("reactors"), || {
                format!("must be 1..={MAX_REACTORS}")
            })?;
        }
        if let Some(pct) = r.read_pct {
            self.ensure(pct <= 100, at("read_pct"), || "must be 0..=100".into())?;
        }
        if let Some(split) = &r.bssplit {
            self.bssplit(split, at("bssplit"))?;
        }
        // A tenant past the run's list is the pacer's last (a run without
        // tenants puts every host in one), so tenants need no check here.
        for (h, g) in sc.hosts.iter().enumerate() {
            // A read takes all its buffers at once: more than the pool never fits.
            let split = r.bssplit.as_ref().unwrap_or(&g.bssplit);
            let most = split.iter().map(|b| b.0).max().unwrap_or(0);
            let needs = most.div_ceil(sc.target.buffer_size);
            self.ensure(needs <= total, at("num_shared_buffers"), || {
                format!(
                    "a {most}-byte IO of hosts[{h}] needs {needs} buffers, the pool has {total}"
                )
            })?;
            if r.protocol.unwrap_or(g.protocol) == Protocol::NvmeTcp {
                // The target's MDTS: a quarter of the pool, at most 1 MiB.
                let pool = u64::from(total) * u64::from(sc.target.buffer_size);
                let mdts = server::nvmf::max_transfer(DEFAULT_MAX_REQUEST_BYTES, pool);
                self.ensure(most <= mdts, at("num_shared_buffers"), || {
                    format!("a {most}-byte IO of NVMe/TCP hosts[{h}] is past the target's MDTS, {mdts} bytes with {total} buffers")
                })?;
            }
        }
        Ok(())
    }
}
