//! SIGHUP: re-read the config file and apply what can change while serving
//! (the `[pacing]` table, tenant weights included); every other change is
//! logged, item by item and field by field, as needing a restart, and is not
//! applied.

use pace::pacer::PacingConfig;
use serde_json::Value;

use crate::rpc::RpcState;
use config::{Config, LoadedConfig};

/// Sections whose changes need a restart: they shape sockets, memory, threads
/// or the devices the reactors hold (cost models and QoS targets are built
/// into each reactor's pacer devices at start).
const RESTART_SECTIONS: [&str; 8] = [
    "server", "buffers", "bdev", "export", "cost", "qos", "cost_db", "tls",
];

pub fn reload(running: &LoadedConfig, state: &RpcState) {
    let Some(path) = running.path.as_deref() else {
        tracing::warn!("SIGHUP: serving the embedded default config; nothing to re-read");
        return;
    };
    let new = match Config::load(Some(path)) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("SIGHUP: config not reloaded, the running one stays: {e}");
            return;
        }
    };
    let (old_json, new_json) = (running.to_json(), new.to_json());
    let needs_restart: Vec<String> = RESTART_SECTIONS
        .into_iter()
        .flat_map(|s| changes(s, old_json.get(s), new_json.get(s)))
        .collect();
    for change in &needs_restart {
        tracing::warn!("SIGHUP: {change}: needs a restart, not applied");
    }
    let current = state
        .pacing
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    match with_tenants_of(&current, new.config.pacing) {
        Ok(pacing) if pacing == current => tracing::info!("SIGHUP: pacing unchanged"),
        Ok(pacing) => match state.replace_pacing(pacing) {
            Ok(p) => tracing::info!(mode = ?p.mode, "SIGHUP: pacing reloaded"),
            Err(e) => tracing::error!("SIGHUP: pacing not reloaded: {e}"),
        },
        Err(e) => tracing::warn!("SIGHUP: pacing not reloaded: {e}"),
    }
}

/// What differs in one config section, each change named down to the item
/// and field: "export `b` added", "cost `disk`: read_bps", "server: reactors".
fn changes(section: &str, old: Option<&Value>, new: Option<&Value>) -> Vec<String> {
    let empty = Value::Null;
    let (old, new) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
    if old == new {
        return Vec::new();
    }
    match (named_items(old), named_items(new)) {
        (Some(o), Some(n)) => {
            let mut out = Vec::new();
            for (name, item) in &o {
                match n.iter().find(|(k, _)| k == name) {
                    None => out.push(format!("{section} `{name}` removed")),
                    Some((_, now)) if now != item => out.push(format!(
                        "{section} `{name}`: {}",
                        changed_fields(item, now).join(", ")
                    )),
                    Some(_) => {}
                }
            }
            for (name, _) in n.iter().filter(|(k, _)| !o.iter().any(|(j, _)| j == k)) {
                out.push(format!("{section} `{name}` added"));
            }
            out
        }
        _ => vec![format!(
            "{section}: {}",
            changed_fields(old, new).join(", ")
        )],
    }
}

/// A section's items by name: an array of tables with `name` (bdevs,
/// exports) or a table of tables (cost models, QoS by bdev).
fn named_items(v: &Value) -> Option<Vec<(String, &Value)>> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| Some((i.get("name")?.as_str()?.to_string(), i)))
            .collect(),
        Value::Object(m) if m.values().all(Value::is_object) => {
            Some(m.iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Null => Some(Vec::new()),
        _ => None,
    }
}

/// The keys whose values differ between two tables (or "value" for scalars).
fn changed_fields(old: &Value, new: &Value) -> Vec<String> {
    match (old.as_object(), new.as_object()) {
        (Some(o), Some(n)) => {
            let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter()
                .filter(|k| o.get(*k) != n.get(*k))
                .map(|k| k.to_string())
                .collect()
        }
        _ => vec!["value".into()],
    }
}

/// `new` with the running tenant list, taking only new weights: the tenants
/// themselves (names, exports) are fixed while serving.
fn with_tenants_of(running: &PacingConfig, mut new: PacingConfig) -> Result<PacingConfig, String> {
    let mut tenants = running.tenants.clone();
    for t in &new.tenants {
        match tenants.iter_mut().find(|r| r.name == t.name) {
            Some(r) if r.exports == t.exports => r.weight = t.weight,
            _ => {
                return Err(format!(
                    "tenant `{}` is new or has other exports; that needs a restart",
                    t.name
                ))
            }
        }
    }
    new.tenants = tenants;
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pace::pacer::TenantConfig;

    fn tenant(name: &str, weight: f64) -> TenantConfig {
        TenantConfig {
            exports: vec![name.into()],
            ..TenantConfig::new(name, weight)
        }
    }

    #[test]
    fn changes_name_items_and_fields() {
        let old = serde_json::json!([{"name": "a", "bdev": "m0"}, {"name": "b", "bdev": "m1"}]);
        let new = serde_json::json!([{"name": "a", "bdev": "m2"}, {"name": "c", "bdev": "m1"}]);
        assert_eq!(
            changes("export", Some(&old), Some(&new)),
            ["export `a`: bdev", "export `b` removed", "export `c` added"]
        );
        let old = serde_json::json!({"disk": {"read_bps": 1.0, "write_bps": 2.0}});
        let new = serde_json::json!({"disk": {"read_bps": 3.0, "write_bps": 2.0}});
        assert_eq!(
            changes("cost", Some(&old), Some(&new)),
            ["cost `disk`: read_bps"]
        );
        assert_eq!(
            changes(
                "qos",
                None,
                Some(&serde_json::json!({"disk": {"read_p99_us": 1}}))
            ),
            ["qos `disk` added"]
        );
        let old = serde_json::json!({"reactors": 1, "tcp": []});
        let new = serde_json::json!({"reactors": 2, "tcp": []});
        assert_eq!(
            changes("server", Some(&old), Some(&new)),
            ["server: reactors"]
        );
        assert!(changes("server", Some(&old), Some(&old)).is_empty());
    }

    #[test]
    fn weights_change_and_tenants_stay() {
        let running = PacingConfig {
            tenants: vec![tenant("a", 1.0), tenant("default", 1.0)],
            ..PacingConfig::default()
        };
        let new = PacingConfig {
            tenants: vec![tenant("a", 3.0)],
            gain: 4.0,
            ..PacingConfig::default()
        };
        let merged = with_tenants_of(&running, new).expect("weights may change");
        assert_eq!(merged.tenants[0].weight, 3.0);
        assert_eq!(merged.tenants.len(), 2);
        assert_eq!(merged.gain, 4.0);
        let added = PacingConfig {
            tenants: vec![tenant("b", 1.0)],
            ..PacingConfig::default()
        };
        assert!(with_tenants_of(&running, added).is_err());
    }
}
