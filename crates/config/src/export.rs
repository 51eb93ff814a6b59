//! `[[export]]`: what is served under which name, to whom.

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
}

impl ExportConfig {
    /// The NVMe subsystem NQN this export is served as.
    pub fn subsystem_nqn(&self) -> String {
        self.nqn
            .clone()
            .unwrap_or_else(|| format!("nqn.2026-11.io.iopace:{}", self.name))
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
