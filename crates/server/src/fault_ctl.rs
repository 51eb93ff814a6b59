//! The `set_fault` and `get_faults` RPCs: fault bdevs' parameters changed
//! while they serve (`bdev::Fault`). Control plane: a mutex per layer is fine.

use std::sync::Arc;
use std::time::Instant;

use bdev::{Fault, FaultParams};
use serde_json::{json, Value};

/// Every fault bdev's layer, and the reactors' clock to time stalls on.
pub struct FaultControl {
    faults: Vec<Arc<Fault>>,
    /// The reactors' time origin: a stall window set here ends at the
    /// same engine time for all of them.
    origin: Instant,
}

impl FaultControl {
    pub fn new(faults: Vec<Arc<Fault>>, origin: Instant) -> FaultControl {
        FaultControl { faults, origin }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Merges `params` (`bdev` and some fault fields) into that fault bdev's
    /// parameters and puts them in force; fields not given keep their
    /// values, and a timed stall (re)starts only when `stall_ms` is given.
    pub fn set(&self, params: &Value) -> Result<Value, String> {
        let Some(fields) = params.as_object() else {
            return Err("params must be an object: {\"bdev\": NAME, fault fields...}".into());
        };
        let Some(name) = fields.get("bdev").and_then(Value::as_str) else {
            return Err("params need \"bdev\": the fault bdev's name".into());
        };
        let Some(fault) = self.faults.iter().find(|f| f.name() == name) else {
            let known: Vec<&str> = self.faults.iter().map(|f| f.name()).collect();
            return Err(format!(
                "no fault bdev named `{name}` (fault bdevs: {})",
                known.join(", ")
            ));
        };
        let mut merged = serde_json::to_value(fault.params()).map_err(|e| e.to_string())?;
        for (k, v) in fields.iter().filter(|(k, _)| *k != "bdev") {
            merged[k.as_str()] = v.clone();
        }
        let p: FaultParams = serde_json::from_value(merged).map_err(|e| e.to_string())?;
        p.check().map_err(|(field, m)| format!("{field}: {m}"))?;
        let now = self.now();
        fault.set(p, now, fields.contains_key("stall_ms"));
        serde_json::to_value(fault.status(now)).map_err(|e| e.to_string())
    }

    /// Every fault bdev's parameters and counters.
    pub fn get(&self) -> Value {
        let now = self.now();
        let all: Vec<Value> = self
            .faults
            .iter()
            .map(|f| serde_json::to_value(f.status(now)).unwrap_or_default())
            .collect();
        json!(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control() -> FaultControl {
        let mut m = bdev::BdevTable::new("m", bdev::BdevKindName::Malloc);
        m.size = Some(bdev::ByteSize(1 << 20));
        let mut f = bdev::BdevTable::new("flaky", bdev::BdevKindName::Fault);
        f.base = Some("m".into());
        f.error_rate = Some(0.5);
        let specs = bdev::specs(&[m, f]).expect("specs");
        let set = bdev::build(&specs).expect("build");
        FaultControl::new(set.faults(), Instant::now())
    }

    #[test]
    fn set_fault_merges_checks_and_names_what_is_wrong() {
        let c = control();
        let r = c
            .set(&json!({"bdev": "flaky", "errno": "ENOSPC", "stall_ms": 60000}))
            .expect("set");
        assert_eq!(r["params"]["errno"], "ENOSPC");
        assert_eq!(r["params"]["error_rate"], 0.5, "kept: {r}");
        assert_ne!(r["stall"], "no", "{r}");
        let r = c
            .set(&json!({"bdev": "flaky", "error_rate": 0.1}))
            .expect("set");
        assert_ne!(r["stall"], "no", "the window goes on: {r}");
        let r = c
            .set(&json!({"bdev": "flaky", "stall_ms": 0}))
            .expect("set");
        assert_eq!(r["stall"], "no", "{r}");
        for (bad, says) in [
            (
                json!({"bdev": "m", "error_rate": 1}),
                "no fault bdev named `m`",
            ),
            (json!({"error_rate": 1}), "\"bdev\""),
            (json!({"bdev": "flaky", "error_rate": 2}), "error_rate"),
            (json!({"bdev": "flaky", "errno": "EWHAT"}), "EWHAT"),
            (json!({"bdev": "flaky", "colour": 1}), "colour"),
        ] {
            let e = c.set(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(c.get()[0]["params"]["error_rate"], 0.1);
    }

    #[test]
    fn the_readmes_fault_example_serves() {
        let readme = include_str!("../../../README.md");
        let at = readme
            .find("kind = \"fault\"")
            .expect("README has a fault bdev");
        let start = readme[..at].rfind("```toml\n").expect("in a toml block") + 8;
        let len = readme[start..].find("```").expect("block ends");
        let text = format!(
            "[[bdev]]\nname = \"ram\"\nkind = \"malloc\"\nsize = \"16MiB\"\n\n{}",
            &readme[start..start + len]
        );
        let loaded = config::Config::parse(&text, "README.md").expect("valid config");
        let catalog = crate::exports::Catalog::check(&loaded).expect("it builds");
        let fault = catalog.bdevs.fault("flaky").expect("a fault layer");
        assert_eq!(fault.params().spike_rate, 0.001);
    }
}
