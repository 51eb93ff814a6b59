//! `[[export]]`: what is served under which name, to whom.

use std::path::{Path, PathBuf};

use bdev::ByteSize;
use serde::Deserialize;

use crate::{access, ConfigError, LoadedConfig};

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
    /// `qemu:dirty-bitmap:NAME`.
    #[serde(default)]
    pub dirty_bitmaps: Vec<String>,
    /// Their granularity (and the default of those added by RPC); 64 KiB.
    #[serde(default)]
    pub dirty_granularity: Option<ByteSize>,
    /// Where the export's bitmaps persist: saved at a clean shutdown,
    /// restored at start (`bdev::dirty_file`). Absent: in memory only,
    /// the config's bitmaps start clean.
    #[serde(default)]
    pub dirty_bitmap_file: Option<PathBuf>,
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
        if self
            .dirty_bitmap_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(("dirty_bitmap_file", "an empty path".into()));
        }
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

/// No two exports share a bitmap file, and none is a file bdev's image
/// (its first save would replace the image).
pub(crate) fn check_bitmap_files(cfg: &LoadedConfig) -> Result<(), ConfigError> {
    let exports = &cfg.config.exports;
    for (i, e) in exports.iter().enumerate() {
        let Some(path) = &e.dirty_bitmap_file else {
            continue;
        };
        let twice = exports[..i]
            .iter()
            .find(|o| o.dirty_bitmap_file.as_ref() == Some(path));
        if let Some(o) = twice {
            let msg = format!(
                "{} is export `{}`'s bitmap file too",
                path.display(),
                o.name
            );
            return Err(cfg.error_at("export", i, "dirty_bitmap_file", msg));
        }
        let image = cfg.bdevs.iter().find(
            |b| matches!(&b.kind, bdev::BdevKind::File { path: p, .. } if Path::new(p) == path),
        );
        if let Some(b) = image {
            let msg = format!("{} is the image of bdev `{}`", path.display(), b.name);
            return Err(cfg.error_at("export", i, "dirty_bitmap_file", msg));
        }
    }
    Ok(())
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
        let kept = config("dirty_bitmap_file = \"/var/lib/e.bitmaps\"\n").expect("valid");
        let file = kept.config.exports[0].dirty_bitmap_file.as_deref();
        assert_eq!(file, Some(std::path::Path::new("/var/lib/e.bitmaps")));
        for (bad, field) in [
            ("dirty_granularity = 1000\n", "export.dirty_granularity"),
            ("dirty_granularity = 256\n", "export.dirty_granularity"),
            ("dirty_bitmaps = [\"a\", \"a\"]\n", "export.dirty_bitmaps"),
            ("dirty_bitmaps = [\"\"]\n", "export.dirty_bitmaps"),
            ("dirty_bitmap_file = \"\"\n", "export.dirty_bitmap_file"),
        ] {
            let e = config(bad).expect_err(bad);
            assert_eq!(e.field.as_deref(), Some(field), "{bad}: {e:?}");
        }
    }

    #[test]
    fn a_bitmap_file_is_no_other_exports_and_no_image() {
        let text = "[[bdev]]\nname = \"f\"\nkind = \"file\"\npath = \"/tmp/x.img\"\nsize = 4096\n\
            [[export]]\nname = \"a\"\nbdev = \"f\"\ndirty_bitmap_file = \"/tmp/a.bm\"\n\
            [[export]]\nname = \"b\"\nbdev = \"f\"\ndirty_bitmap_file = \"/tmp/a.bm\"\n";
        let e = Config::parse(text, "x.toml").expect_err("shared");
        assert_eq!(e.field.as_deref(), Some("export.dirty_bitmap_file"), "{e}");
        assert_eq!(e.line, Some(13), "{e}");
        assert!(e.message.contains("export `a`"), "{e}");
        let image = text.replace("/tmp/a.bm\"\n[[export]]", "/tmp/x.img\"\n[[export]]");
        let e = Config::parse(&image, "x.toml").expect_err("image");
        assert_eq!(e.line, Some(9), "{e}");
        assert!(e.message.contains("image of bdev `f`"), "{e}");
    }
}
