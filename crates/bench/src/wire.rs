//! The "wire": one network namespace per initiator host, each joined by a
//! veth pair to a bridge in the root namespace where the target listens.
//! Both ends of every veth can be shaped (tc tbf, optional netem delay).
//! Where the target's port is shaped too, the target's address sits on a
//! veth of its own to the bridge (its port, which all hosts share), shaped
//! on both ends like the hosts'. Nothing leaves the machine: the bridge has
//! no uplink.

use std::process::Command;

use crate::scenario::HostWire;

/// The target's address on the bridge.
pub const TARGET_ADDR: &str = "10.77.0.1";
const BRIDGE: &str = "iopbr0";

pub fn ns(i: usize) -> String {
    format!("iopace-h{i}")
}

/// Host `i` (1-based) in its namespace.
pub fn host_addr(i: usize) -> String {
    format!("10.77.0.{}", 10 + i)
}

fn root_if(i: usize) -> String {
    format!("iopv{i}t")
}

fn host_if(i: usize) -> String {
    format!("iopv{i}h")
}

/// The target port's veth: the target's end, and the bridge's.
const PORT_TARGET_IF: &str = "iopvpt";
const PORT_BRIDGE_IF: &str = "iopvpb";

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let hint = match args.iter().find(|a| ["tbf", "netem"].contains(a)) {
        Some(kind) if err.contains("qdisc kind is unknown") => format!(
            " (this kernel has no sch_{kind}: `modprobe sch_{kind}`, or install the \
             kernel's extra modules, e.g. linux-modules-extra-$(uname -r))"
        ),
        _ => String::new(),
    };
    Err(format!("`{}` failed: {}{hint}", args.join(" "), err.trim()))
}

fn in_ns(i: usize, args: &[&str]) -> Result<(), String> {
    let name = ns(i);
    let mut all = vec!["ip", "netns", "exec", name.as_str()];
    all.extend_from_slice(args);
    run(&all)
}

/// Checks for root, iproute2 and namespace support before touching anything.
pub fn preflight() -> Result<(), String> {
    crate::procs::require("ip", "iproute2")?;
    crate::procs::require("tc", "iproute2")?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("netns hosts need root (network namespaces, veth, tc)".into());
    }
    if !std::path::Path::new("/proc/self/ns/net").exists() {
        return Err("this kernel has no network namespaces (CONFIG_NET_NS)".into());
    }
    Ok(())
}

/// The namespaces and links of one run; removed on drop.
pub struct Wire {
    hosts: usize,
    /// The target's port is a veth of its own (it can be shaped).
    port: bool,
}

impl Wire {
    /// The bridge and `hosts` namespaces; with `port`, the target's
    /// address on a veth of its own to the bridge, else on the bridge.
    pub fn up(hosts: usize, port: bool) -> Result<Wire, String> {
        preflight()?;
        remove(hosts);
        // Constructed first so a failure half-way still cleans up.
        let wire = Wire { hosts, port };
        run(&["ip", "link", "add", BRIDGE, "type", "bridge"])?;
        let target_if = if port {
            let (t, b) = (PORT_TARGET_IF, PORT_BRIDGE_IF);
            run(&["ip", "link", "add", t, "type", "veth", "peer", "name", b])?;
            run(&["ip", "link", "set", b, "master", BRIDGE])?;
            run(&["ip", "link", "set", b, "up"])?;
            run(&["ip", "link", "set", t, "up"])?;
            t
        } else {
            BRIDGE
        };
        let addr = format!("{TARGET_ADDR}/24");
        run(&["ip", "addr", "add", &addr, "dev", target_if])?;
        run(&["ip", "link", "set", BRIDGE, "up"])?;
        for i in 1..=hosts {
            let (r, h) = (root_if(i), host_if(i));
            run(&["ip", "netns", "add", &ns(i)])?;
            run(&["ip", "link", "add", &r, "type", "veth", "peer", "name", &h])?;
            run(&["ip", "link", "set", &h, "netns", &ns(i)])?;
            run(&["ip", "link", "set", &r, "master", BRIDGE])?;
            run(&["ip", "link", "set", &r, "up"])?;
            in_ns(
                i,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/24", host_addr(i)),
                    "dev",
                    &h,
                ],
            )?;
            in_ns(i, &["ip", "link", "set", &h, "up"])?;
            in_ns(i, &["ip", "link", "set", "lo", "up"])?;
        }
        Ok(wire)
    }

    /// Sets (or clears) each host's rate and delay on both ends of its
    /// veth, and the target port's rate on both ends of its own.
    pub fn shape(&self, wires: &[HostWire], port_rate: Option<&str>) -> Result<(), String> {
        debug_assert_eq!(wires.len(), self.hosts);
        assert!(
            self.port || port_rate.is_none(),
            "a port rate needs the port's veth (Wire::up with port)"
        );
        if self.port {
            let root = |args: &[&str]| run(args);
            shape_dev(&root, PORT_TARGET_IF, port_rate, None)?;
            shape_dev(&root, PORT_BRIDGE_IF, port_rate, None)?;
        }
        for (i, w) in (1..=self.hosts).zip(wires) {
            let (r, h) = (root_if(i), host_if(i));
            let (rate, delay) = (w.rate.as_deref(), w.delay.as_deref());
            let root = |args: &[&str]| run(args);
            let host = |args: &[&str]| in_ns(i, args);
            shape_dev(&root, &r, rate, delay)?;
            shape_dev(&host, &h, rate, delay)?;
        }
        Ok(())
    }

    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// Bytes through each host's link (both directions), from the root end.
    pub fn counters(&self) -> Vec<u64> {
        (1..=self.hosts).map(|i| link_bytes(&root_if(i))).collect()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        remove(self.hosts);
    }
}

fn shape_dev(
    run: &dyn Fn(&[&str]) -> Result<(), String>,
    dev: &str,
    rate: Option<&str>,
    delay: Option<&str>,
) -> Result<(), String> {
    // Clearing a qdisc that is not there fails harmlessly.
    let _ = run(&["tc", "qdisc", "del", "dev", dev, "root"]);
    let delay = delay.filter(|d| !d.is_empty() && *d != "0");
    match (rate, delay) {
        (None, None) => Ok(()),
        (Some(rate), _) => {
            // tbf's burst must exceed a GSO super-packet (64 KiB) or it stalls.
            run(&[
                "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", rate,
                "burst", "512kb", "latency", "20ms",
            ])?;
            if let Some(d) = delay {
                run(&[
                    "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
                    "delay", d, "limit", "100000",
                ])?;
            }
            Ok(())
        }
        (None, Some(d)) => run(&[
            "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", d, "limit", "100000",
        ]),
    }
}

/// rx + tx bytes of an interface in this namespace (0 if it is gone).
pub fn link_bytes(dev: &str) -> u64 {
    ["rx_bytes", "tx_bytes"]
        .iter()
        .filter_map(|f| {
            std::fs::read_to_string(format!("/sys/class/net/{dev}/statistics/{f}"))
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Removes what `up` made, also leftovers of a run that was killed.
fn remove(hosts: usize) {
    for i in 1..=hosts.max(8) {
        let _ = run(&["ip", "link", "del", &root_if(i)]);
        let _ = run(&["ip", "netns", "del", &ns(i)]);
    }
    let _ = run(&["ip", "link", "del", PORT_TARGET_IF]);
    let _ = run(&["ip", "link", "del", BRIDGE]);
}
