//! SIGHUP: re-read the config file and apply what can change while serving
//! (the `[pacing]` table, tenant weights included); every other change is
//! logged as needing a restart and is not applied.

use pace::pacer::PacingConfig;

use crate::config::{Config, LoadedConfig};
use crate::rpc::RpcState;

/// Sections whose changes need a restart: they shape sockets, memory, threads
/// or the devices the reactors hold.
const RESTART_SECTIONS: [&str; 6] = ["server", "buffers", "bdev", "export", "cost", "qos"];

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
    let needs_restart: Vec<&str> = RESTART_SECTIONS
        .into_iter()
        .filter(|s| old_json.get(*s) != new_json.get(*s))
        .collect();
    if !needs_restart.is_empty() {
        tracing::warn!(
            sections = ?needs_restart,
            "SIGHUP: these changes need a restart and were not applied"
        );
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
            name: name.into(),
            weight,
            exports: vec![name.into()],
        }
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
