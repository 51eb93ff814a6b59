//! `[[export]]`: what is served under which name, to whom.

use bdev::ByteSize;
use serde::Deserialize;

use crate::access;

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
    /// Dirty bitmaps kept from start (names), served as
    /// `qemu:dirty-bitmap:NAME`; in memory only, clean at every start.
    #[serde(default)]
    pub dirty_bitmaps: Vec<String>,
    /// Their granularity (and the default of those added by RPC); 64 KiB.
    #[serde(default)]
    pub dirty_granularity: Option<ByteSize>,
}

impl ExportConfig {
    /// The NVMe subsystem NQN this export is served as.
    pub fn subsystem_nqn(&self) -> String {
        self.nqn
            .clone()
            .unwrap_or_else(|| format!("nqn.2026-11.io.iopace:{}", self.name))
    }

    /// The granularity of this export's dirty bitmaps.
    pub fn granularity(&self) -> u64 {
        self.dirty_granularity
            .map_or(bdev::dirty::DEFAULT_GRANULARITY, |g| g.0)
    }

    /// The dirty bitmap settings, or the field and message of the first bad one.
    pub fn check_bitmaps(&self) -> Result<(), (&'static str, String)> {
        bdev::dirty::check_granularity(self.granularity()).map_err(|m| ("dirty_granularity", m))?;
        for (i, name) in self.dirty_bitmaps.iter().enumerate() {
            bdev::dirty::check_name(name).map_err(|m| ("dirty_bitmaps", m))?;
            if self.dirty_bitmaps[..i].contains(name) {
                return Err(("dirty_bitmaps", format!("`{name}` is listed twice")));
            }
        }
        Ok(())
    }

    /// The export's access rules, or the field and message of the first bad one.
    pub fn rules(&self) -> Result<access::ExportRules, (&'static str, String)> {
        let parse = |field: &'static str, list: &[String]| {
            list.iter()
                .map(|r| access::Rule::parse(r))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| (field, m))
        };
        Ok(access::ExportRules {
            allow: self
                .allow
                .as_deref()
                .map(|a| parse("allow", a))
                .transpose()?,
            read_only_for: parse("read_only_for", &self.read_only_for)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn config(extra: &str) -> Result<crate::LoadedConfig, crate::ConfigError> {
        let text = format!(
            "[[bdev]]\nname = \"n\"\nkind = \"null\"\nsize = 4096\n\
             [[export]]\nname = \"e\"\nbdev = \"n\"\n{extra}"
        );
        Config::parse(&text, "x.toml")
    }

    #[test]
    fn dirty_bitmaps_take_names_and_a_granularity() {
        let c = config("dirty_bitmaps = [\"backup\", \"b2\"]\ndirty_granularity = \"4K\"\n");
        let c = c.expect("valid");
        let e = &c.config.exports[0];
        assert_eq!(e.dirty_bitmaps, ["backup", "b2"]);
        assert_eq!(e.granularity(), 4096);
        let plain = config("").expect("valid");
        assert_eq!(plain.config.exports[0].granularity(), 64 << 10);
        for (bad, field) in [
            ("dirty_granularity = 1000\n", "export.dirty_granularity"),
            ("dirty_granularity = 256\n", "export.dirty_granularity"),
            ("dirty_bitmaps = [\"a\", \"a\"]\n", "export.dirty_bitmaps"),
            ("dirty_bitmaps = [\"\"]\n", "export.dirty_bitmaps"),
        ] {
            let e = config(bad).expect_err(bad);
            assert_eq!(e.field.as_deref(), Some(field), "{bad}: {e:?}");
        }
    }
}
