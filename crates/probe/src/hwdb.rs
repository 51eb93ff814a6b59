//! iocost-benchmarks' result file: the udev hwdb that systemd's `iocost`
//! tool reads to configure a disk by its model. Each entry matches a model
//! (and firmware) and names solutions, each an `io.cost.model` and an
//! `io.cost.qos` without the device number:
//!
//! ```text
//! block:*:name:HFS256GD9TNG-62A0A:fwver:*:
//!  IOCOST_SOLUTIONS=isolation bandwidth
//!  IOCOST_MODEL_ISOLATION=rbps=1091439492 rseqiops=52286 rrandiops=63784 wbps=192329466 wseqiops=12309 wrandiops=16119
//!  IOCOST_QOS_ISOLATION=rpct=0.00 rlat=8807 wpct=0.00 wlat=59023 min=100.00 max=100.00
//!  ...
//! ```
//!
//! The first solution listed is the default. [`print`] writes entries in
//! that form and [`parse`] reads them back, with the comment lines right
//! above each match.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::iocost::{ModelParams, QosParams};

/// A named solution: the cost model and QoS it applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solution {
    pub name: String,
    pub model: ModelParams,
    pub qos: QosParams,
}

/// One device model's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub model: String,
    /// The firmware matched, `*` for any.
    pub firmware: String,
    /// The comment lines right above the match, without their `# `.
    pub comment: Vec<String>,
    pub solutions: Vec<Solution>,
}

/// A solution's name as a property suffix: `isolated-bandwidth` is `ISOLATED_BANDWIDTH`.
fn key(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}

/// Model and firmware may not hold what would end the match or the line.
fn check_match_text(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() || s.contains(':') || s.contains('\n') || s != s.trim() {
        return Err(format!(
            "{what} `{s}`: empty, or holds ':', a newline or edge blanks"
        ));
    }
    Ok(())
}

/// The hwdb text of `entries`.
pub fn print(entries: &[Entry]) -> Result<String, String> {
    let mut t = String::from(
        "# iocost solutions by device model, written by `iopace probe db export`.\n\
         # Match key format:\n# block:<devpath>:name:<model name>:fwver:<firmware>:\n",
    );
    for e in entries {
        check_match_text("model", &e.model)?;
        check_match_text("firmware", &e.firmware)?;
        if e.solutions.is_empty() {
            return Err(format!("{}: no solutions", e.model));
        }
        t.push('\n');
        for c in &e.comment {
            let _ = writeln!(t, "# {}", c.replace('\n', " "));
        }
        let names: Vec<&str> = e.solutions.iter().map(|s| s.name.as_str()).collect();
        let _ = writeln!(
            t,
            "block:*:name:{}:fwver:{}:\n IOCOST_SOLUTIONS={}",
            e.model,
            e.firmware,
            names.join(" ")
        );
        for s in &e.solutions {
            if s.name.is_empty()
                || !s
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(format!("{}: solution name `{}`", e.model, s.name));
            }
            let k = key(&s.name);
            let _ = writeln!(t, " IOCOST_MODEL_{k}={}", s.model.params_text());
            let _ = writeln!(t, " IOCOST_QOS_{k}={}", s.qos.params_text());
        }
    }
    Ok(t)
}

/// `block:*:name:MODEL:fwver:FW:` (or without `fwver`, any firmware).
fn parse_match(line: &str) -> Result<(String, String), String> {
    let bad = || format!("`{line}`: not block:<devpath>:name:<model>:[fwver:<firmware>:]");
    let rest = line.strip_prefix("block:").ok_or_else(bad)?;
    let (_, after) = rest.split_once(":name:").ok_or_else(bad)?;
    let after = after.strip_suffix(':').unwrap_or(after);
    let (model, fw) = match after.split_once(":fwver:") {
        Some((m, f)) => (m, f),
        None => (after, "*"),
    };
    if model.is_empty() || fw.is_empty() {
        return Err(bad());
    }
    Ok((model.to_string(), fw.to_string()))
}

/// An entry being read: its match, its comment and its properties so far.
struct Open {
    model: String,
    firmware: String,
    comment: Vec<String>,
    props: BTreeMap<String, String>,
}

/// One entry from its match and properties.
fn entry(o: Open) -> Result<Entry, String> {
    let Open {
        model,
        firmware,
        comment,
        props,
    } = o;
    let names = props
        .get("IOCOST_SOLUTIONS")
        .ok_or_else(|| format!("{model}: no IOCOST_SOLUTIONS"))?;
    let mut solutions = Vec::new();
    for name in names.split_ascii_whitespace() {
        let prop = |kind: &str| {
            let k = format!("IOCOST_{kind}_{}", key(name));
            props
                .get(&k)
                .ok_or_else(|| format!("{model}: {k} missing for solution `{name}`"))
        };
        let at = |e: String| format!("{model}: solution `{name}`: {e}");
        solutions.push(Solution {
            name: name.to_string(),
            model: ModelParams::parse_params(prop("MODEL")?).map_err(at)?,
            qos: QosParams::parse_params(prop("QOS")?).map_err(at)?,
        });
    }
    if solutions.is_empty() {
        return Err(format!("{model}: IOCOST_SOLUTIONS is empty"));
    }
    Ok(Entry {
        model,
        firmware,
        comment,
        solutions,
    })
}

/// The entries of an hwdb text; an error names the line or entry at fault.
pub fn parse(text: &str) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    let mut cur: Option<Open> = None;
    let mut comment = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}", n + 1);
        let trimmed = line.trim();
        if trimmed.is_empty() {
            comment.clear();
            continue;
        }
        if let Some(c) = trimmed.strip_prefix('#') {
            comment.push(c.strip_prefix(' ').unwrap_or(c).to_string());
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            if let Some(o) = cur.take() {
                entries.push(entry(o)?);
            }
            let (model, firmware) = parse_match(line).map_err(at)?;
            cur = Some(Open {
                model,
                firmware,
                comment: std::mem::take(&mut comment),
                props: BTreeMap::new(),
            });
            continue;
        }
        comment.clear();
        let (k, v) = trimmed
            .split_once('=')
            .ok_or_else(|| at(format!("`{trimmed}`: not KEY=VALUE")))?;
        let Some(o) = cur.as_mut() else {
            return Err(at("a property before any match line".into()));
        };
        o.props.insert(k.to_string(), v.to_string());
    }
    if let Some(o) = cur {
        entries.push(entry(o)?);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    // An entry as iocost-benchmarks generates it (two solutions of four).
    const BENCHMARKS: &str = r"# This file was auto-generated
# 12 points, MOF=[1.346,1.346], aMOF=[1.249,1.249]
block:*:name:HFS256GD9TNG-62A0A:fwver:*:
  IOCOST_SOLUTIONS=isolation isolated-bandwidth
  IOCOST_MODEL_ISOLATION=rbps=1091439492 rseqiops=52286 rrandiops=63784 wbps=192329466 wseqiops=12309 wrandiops=16119
  IOCOST_QOS_ISOLATION=rpct=0.00 rlat=8807 wpct=0.00 wlat=59023 min=100.00 max=100.00
  IOCOST_MODEL_ISOLATED_BANDWIDTH=rbps=1091439492 rseqiops=52286 rrandiops=63784 wbps=192329466 wseqiops=12309 wrandiops=16119
  IOCOST_QOS_ISOLATED_BANDWIDTH=rpct=0.00 rlat=8807 wpct=0.00 wlat=59023 min=75.00 max=100.00
";

    #[test]
    fn an_iocost_benchmarks_entry_is_read_and_round_trips() {
        let e = parse(BENCHMARKS).expect("parsed");
        assert_eq!(e.len(), 1);
        assert_eq!(
            (e[0].model.as_str(), e[0].firmware.as_str()),
            ("HFS256GD9TNG-62A0A", "*")
        );
        let names: Vec<&str> = e[0].solutions.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["isolation", "isolated-bandwidth"]);
        assert_eq!(e[0].solutions[1].model.rbps, 1091439492);
        assert_eq!(e[0].solutions[1].qos.min.0, 7500);
        assert_eq!(
            e[0].comment,
            [
                "This file was auto-generated",
                "12 points, MOF=[1.346,1.346], aMOF=[1.249,1.249]"
            ]
        );
        let text = print(&e).expect("printed");
        assert_eq!(parse(&text).expect("again"), e);
        assert_eq!(print(&parse(&text).expect("again")).expect("printed"), text);
        assert!(text.contains("block:*:name:HFS256GD9TNG-62A0A:fwver:*:\n IOCOST_SOLUTIONS=isolation isolated-bandwidth\n"), "{text}");
    }

    #[test]
    fn a_broken_entry_is_refused_with_where() {
        let missing = BENCHMARKS.replace("  IOCOST_QOS_ISOLATION=", "  IOCOST_QOZ=");
        let e = parse(&missing).expect_err("missing qos");
        assert!(e.contains("IOCOST_QOS_ISOLATION missing"), "{e}");
        let bad = BENCHMARKS.replace("min=75.00", "min=175.00");
        let e = parse(&bad).expect_err("min above max");
        assert!(
            e.contains("isolated-bandwidth") && e.contains("above max"),
            "{e}"
        );
        let e = parse(" IOCOST_SOLUTIONS=x\n").expect_err("orphan");
        assert!(e.contains("line 1"), "{e}");
        let e = parse("usb:*:name:x:\n").expect_err("not block");
        assert!(e.contains("line 1"), "{e}");
        let mut entries = parse(BENCHMARKS).expect("parsed");
        entries[0].model = "a:b".into();
        assert!(print(&entries).is_err());
    }
}
