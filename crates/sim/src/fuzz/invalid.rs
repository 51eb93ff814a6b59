//! Broken scenarios: a valid case with one field made invalid, which the
//! loader must reject naming the file, the line and that field.

use rand::rngs::SmallRng;
use rand::Rng;

use crate::parse;

/// (key as the case writes it, bad value, the field the error must name).
const BREAKS: [(&str, &str, &str); 7] = [
    ("rate_gbps = ", "-1.0", "ports[0].rate_gbps"),
    ("reactors = ", "0", "target.reactors"),
    ("latency_us = ", "-3", "devices[0].latency_us"),
    ("parallel = ", "0", "devices[0].parallel"),
    ("read_pct = ", "150", "hosts[0].read_pct"),
    ("bssplit = ", "[[0, 1]]", "hosts[0].bssplit"),
    ("rtt_us = ", "1e12", "ports[0].rtt_us"),
];

/// Breaks the first line of `text` that sets a key drawn at random.
/// Returns the broken text and the field the error must name.
pub fn break_case(r: &mut SmallRng, text: &str) -> (String, &'static str) {
    let (key, bad, field) = BREAKS[r.gen_range(0..BREAKS.len())];
    let mut done = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if !done && l.starts_with(key) {
                done = true;
                format!("{key}{bad}")
            } else {
                l.to_string()
            }
        })
        .collect();
    (lines.join("\n") + "\n", field)
}

/// Whether the loader rejects `text` naming `field` and a line.
pub fn rejected_well(text: &str, source: &str, field: &str) -> Result<(), String> {
    match parse(text, source) {
        Ok(_) => Err(format!("accepted a scenario with a bad {field}")),
        Err(e) if e.line.is_none() => Err(format!("no line in: {e}")),
        Err(e) if e.field.as_deref() != Some(field) => {
            Err(format!("named {:?}, not {field}: {e}", e.field))
        }
        Err(_) => Ok(()),
    }
}
