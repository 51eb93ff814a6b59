//! Deterministic discrete-event simulator driving the `pace` crate's pacer —
//! the same code the target runs — at data-centre scale.
//!
//! Model (reads only): initiator hosts keep `qd` IOs outstanding each, to
//! devices chosen at random; a request reaches the target after half the
//! RTT, waits in its reactor's pacer, takes buffers from a shared pool (FIFO
//! waiters), is served by its device (NVMe-like: `parallel` channels, each
//! busy for the linear cost model's service time, the IO done a fixed latency
//! after its service; or a delay device: fixed latency, unlimited
//! parallelism), then leaves on its host's
//! port. A port sends at its rate scaled down by a memory/DDIO factor when
//! the bytes held in buffers exceed a cache budget, serving its hosts'
//! replies round robin; the buffer is freed when
//! its data has been sent. The reply reaches the host half an RTT later and
//! the host issues its next IO.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use pace::pacer::{
    CostModel, DeviceQos, IoKind, LinkWindow, PacedIo, Pacer, PacingConfig, QosConfig, TenantClock,
};
use pace::stats::{LatencyHist, TimeAvg};
use pace::Nanos;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "one_u64")]
    pub seed: u64,
    #[serde(default = "default_duration")]
    pub duration_ms: u64,
    #[serde(default = "default_warmup")]
    pub warmup_ms: u64,
    /// Outstanding IOs per host, one row each.
    pub qds: Vec<u32>,
    pub target: TargetModel,
    pub ports: Vec<PortModel>,
    pub devices: Vec<DeviceGroup>,
    pub hosts: Vec<HostGroup>,
    /// One table per entry: a pacing config (and optional buffer count) to compare.
    pub runs: Vec<RunConfig>,
    /// Print each reactor's pacer state every simulated millisecond to
    /// stderr (`iopace sim --trace`): how the estimates move over a run.
    #[serde(skip)]
    pub trace: bool,
}

fn one_u64() -> u64 {
    1
}
fn default_duration() -> u64 {
    100
}
fn default_warmup() -> u64 {
    30
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub label: String,
    pub pacing: PacingConfig,
    /// Overrides the target's buffer count for this run.
    pub num_shared_buffers: Option<u32>,
    /// Overrides every host group's block-size split for this run.
    #[serde(default)]
    pub bssplit: Option<Vec<(u32, u32)>>,
    /// Latency targets for every NVMe device in this run (overrides the groups').
    #[serde(default)]
    pub qos: Option<QosConfig>,
    /// The seed's measured rows for the same settings, for the side-by-side table:
    /// (qd, BW Gb/s, bufs MiB).
    #[serde(default)]
    pub seed_rows: Vec<(u32, f64, f64)>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetModel {
    pub reactors: usize,
    pub buffer_size: u32,
    pub num_shared_buffers: u32,
    /// Bytes in buffers the caches hold before throughput degrades, MiB.
    pub ddio_budget_mib: f64,
    /// Throughput lost per doubling of bytes in flight past the budget.
    pub ddio_slope: f64,
    /// Least fraction of the port rate left however much is in flight.
    pub ddio_floor: f64,
    /// Wire bytes per payload byte (headers), for the WIRE BW column.
    #[serde(default = "default_wire_overhead")]
    pub wire_overhead: f64,
}

fn default_wire_overhead() -> f64 {
    1.063
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortModel {
    /// Payload rate, Gb/s.
    pub rate_gbps: f64,
    pub rtt_us: f64,
    /// Optional step change: (time ms, new rate Gb/s).
    #[serde(default)]
    pub step: Option<(u64, f64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Nvme,
    Delay,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceGroup {
    pub count: usize,
    pub kind: DeviceKind,
    /// Fixed latency added to every IO, us (the whole latency for delay devices).
    pub latency_us: f64,
    #[serde(default = "one_usize")]
    pub parallel: usize,
    #[serde(default)]
    pub cost: Option<CostModel>,
    /// Latency targets (iocost's QoS) for each device of the group.
    #[serde(default)]
    pub qos: Option<QosConfig>,
}

fn one_usize() -> usize {
    1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostGroup {
    pub count: usize,
    /// (bytes, weight) pairs; fio's bssplit.
    pub bssplit: Vec<(u32, u32)>,
    /// Device indexes this host uses (default: all).
    #[serde(default)]
    pub devices: Vec<usize>,
    /// Multiplies the scenario QD for this group (e.g. 0 for idle).
    #[serde(default = "one_f64")]
    pub qd_scale: f64,
    /// Tenant index in the run's pacing config.
    #[serde(default)]
    pub tenant: usize,
    /// Fixed QD for this group regardless of the row.
    #[serde(default)]
    pub fixed_qd: Option<u32>,
    /// One connection per host (all its IO on one reactor), as an NBD client
    /// has; by default one per (host, device), spread like the seed's qpairs.
    #[serde(default)]
    pub one_connection: bool,
}

fn one_f64() -> f64 {
    1.0
}

/// One row of results.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub qd: u32,
    pub bw_gbps: f64,
    pub wire_gbps: f64,
    pub avg_lat_us: f64,
    pub p99_us: f64,
    pub bw_stddev: f64,
    pub bufs_mib_avg: f64,
    pub bufs_mib_max: f64,
    pub period_us: f64,
    /// Payload Gb/s per host group.
    pub per_group_gbps: Vec<f64>,
    /// p99 per host group, us.
    pub per_group_p99_us: Vec<f64>,
    /// p99 of the time at the device (start to device completion), us.
    pub device_p99_us: f64,
    /// Mean vrate over the devices with latency targets at the end (1.0 without).
    pub vrate: f64,
    /// Every IO issued has completed or is accounted in flight at the end.
    pub conserved: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrive(u32),
    Poll(u32),
    DeviceDone(u32),
    TxDone(u32),
    Reply(u32),
    Rate(u32),
}

#[derive(Debug, Clone, Default)]
struct Io {
    host: usize,
    device: usize,
    bytes: u32,
    issued: Nanos,
    /// When the device started it (took its buffers).
    started: Nanos,
    bufs: u32,
    live: bool,
}

struct Dev {
    kind: DeviceKind,
    latency: Nanos,
    /// When each channel is next free (FIFO: an IO takes the earliest).
    channels: Vec<Nanos>,
    cost: CostModel,
    qos: Option<QosConfig>,
}

struct Port {
    rate_bps: f64,
    rtt: Nanos,
    busy: bool,
    /// Replies waiting, one queue per host (flow), served round robin as a
    /// flow-fair qdisc (fq_codel, Linux's default) or a NIC's queue pairs
    /// do: a host with little in flight does not wait behind a busy one.
    flows: Vec<VecDeque<u32>>,
    next_flow: usize,
    step: Option<(Nanos, f64)>,
}

impl Port {
    fn push(&mut self, flow: usize, id: u32) {
        if self.flows.len() <= flow {
            self.flows.resize_with(flow + 1, VecDeque::new);
        }
        self.flows[flow].push_back(id);
    }

    fn pop(&mut self) -> Option<u32> {
        let n = self.flows.len();
        let f = (0..n)
            .map(|i| (self.next_flow + i) % n)
            .find(|&f| !self.flows[f].is_empty())?;
        self.next_flow = (f + 1) % n;
        self.flows[f].pop_front()
    }
}

struct Host {
    group: usize,
    port: usize,
    reactor: usize,
    one_connection: bool,
    qd: u32,
    devices: Vec<usize>,
    tenant: usize,
    bssplit: Vec<(u32, u32)>,
    delivered: u64,
    /// Bytes per 10 ms slot, for the BW STDDEV column.
    slots: Vec<u64>,
}

struct Sim<'a> {
    sc: &'a Scenario,
    now: Nanos,
    seq: u64,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    ios: Vec<Io>,
    free_ios: Vec<u32>,
    hosts: Vec<Host>,
    devs: Vec<Dev>,
    ports: Vec<Port>,
    pacers: Vec<Pacer>,
    poll_at: Vec<Option<Nanos>>,
    free_bufs: u32,
    buf_waiters: VecDeque<u32>,
    bufs_gauge: TimeAvg,
    in_use: u64,
    rng: SmallRng,
    lat: LatencyHist,
    group_lat: Vec<LatencyHist>,
    device_lat: LatencyHist,
    qos: std::sync::Arc<DeviceQos>,
    measuring: bool,
    released: Vec<u64>,
    issued: u64,
    completed: u64,
    /// Names the run in `--trace` lines.
    trace_tag: String,
}

const SLOT_NS: Nanos = 10_000_000;

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, run: &RunConfig, qd: u32) -> Sim<'a> {
        let mut devs = Vec::new();
        for g in &sc.devices {
            for _ in 0..g.count {
                devs.push(Dev {
                    kind: g.kind,
                    latency: (g.latency_us * 1000.0) as Nanos,
                    channels: vec![0; g.parallel.max(1)],
                    cost: g.cost.unwrap_or_default(),
                    qos: g.qos,
                });
            }
        }
        let ports: Vec<Port> = sc
            .ports
            .iter()
            .map(|p| Port {
                rate_bps: p.rate_gbps * 1e9,
                rtt: (p.rtt_us * 1000.0) as Nanos,
                busy: false,
                flows: Vec::new(),
                next_flow: 0,
                step: p.step.map(|(ms, g)| (ms * 1_000_000, g * 1e9)),
            })
            .collect();
        let mut hosts = Vec::new();
        for (gi, g) in sc.hosts.iter().enumerate() {
            for _ in 0..g.count {
                let i = hosts.len();
                let devices = if g.devices.is_empty() {
                    (0..devs.len()).collect()
                } else {
                    g.devices.clone()
                };
                let q = g
                    .fixed_qd
                    .unwrap_or(((f64::from(qd) * g.qd_scale).round()) as u32);
                hosts.push(Host {
                    group: gi,
                    port: i % ports.len().max(1),
                    reactor: i % sc.target.reactors.max(1),
                    one_connection: g.one_connection,
                    qd: q,
                    devices,
                    tenant: g.tenant,
                    bssplit: run.bssplit.clone().unwrap_or_else(|| g.bssplit.clone()),
                    delivered: 0,
                    slots: Vec::new(),
                });
            }
        }
        let bufs = run
            .num_shared_buffers
            .unwrap_or(sc.target.num_shared_buffers);
        // One tenant clock for all reactors, as the target has.
        let clock =
            TenantClock::with_reactors(run.pacing.tenants.len().max(1), sc.target.reactors.max(1));
        let qos_targets: Vec<_> = devs
            .iter()
            .map(|d| match d.kind {
                DeviceKind::Nvme => run.qos.or(d.qos),
                DeviceKind::Delay => d.qos,
            })
            .collect();
        let qos = DeviceQos::new(&qos_targets, 0);
        let link = LinkWindow::new(sc.target.reactors.max(1));
        let pacers = (0..sc.target.reactors.max(1))
            .map(|r| {
                let mut p = Pacer::new(
                    run.pacing.clone(),
                    devs.len(),
                    sc.target.buffer_size,
                    None,
                    0,
                );
                for (i, d) in devs.iter().enumerate() {
                    p.set_cost_model(i, d.cost);
                }
                p.share_tenants(clock.clone());
                p.share_qos(qos.clone());
                p.share_link(link.clone(), r);
                p
            })
            .collect();
        Sim {
            sc,
            trace_tag: format!("run={:?} qd={qd}", run.label),
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            ios: Vec::new(),
            free_ios: Vec::new(),
            hosts,
            devs,
            ports,
            pacers,
            poll_at: vec![None; sc.target.reactors.max(1)],
            free_bufs: bufs,
            buf_waiters: VecDeque::new(),
            bufs_gauge: TimeAvg::new(0),
            in_use: 0,
            rng: SmallRng::seed_from_u64(sc.seed ^ u64::from(qd) << 20),
            lat: LatencyHist::new(),
            group_lat: sc.hosts.iter().map(|_| LatencyHist::new()).collect(),
            device_lat: LatencyHist::new(),
            qos,
            measuring: false,
            released: Vec::new(),
            issued: 0,
            completed: 0,
        }
    }

    fn at(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    fn issue(&mut self, host: usize) {
        let h = &self.hosts[host];
        let total: u32 = h.bssplit.iter().map(|b| b.1).sum();
        let mut pick = self.rng.gen_range(0..total.max(1));
        let mut bytes = h.bssplit.first().map_or(131072, |b| b.0);
        for &(b, w) in &h.bssplit {
            if pick < w {
                bytes = b;
                break;
            }
            pick -= w;
        }
        let device = h.devices[self.rng.gen_range(0..h.devices.len())];
        let rtt = self.ports[h.port].rtt;
        let io = Io {
            host,
            device,
            bytes,
            issued: self.now,
            started: 0,
            bufs: bytes.div_ceil(self.sc.target.buffer_size),
            live: true,
        };
        let id = match self.free_ios.pop() {
            Some(i) => {
                self.ios[i as usize] = io;
                i
            }
            None => {
                self.ios.push(io);
                (self.ios.len() - 1) as u32
            }
        };
        self.issued += 1;
        self.at(self.now + rtt / 2, Ev::Arrive(id));
    }

    /// The reactor whose connection carries IO `id`.
    fn reactor_of(&self, id: u32) -> usize {
        let io = &self.ios[id as usize];
        let h = &self.hosts[io.host];
        let conn = if h.one_connection { 0 } else { io.device };
        (h.reactor + conn) % self.pacers.len()
    }

    fn schedule_poll(&mut self, reactor: usize, t: Nanos) {
        if self.poll_at[reactor].is_none_or(|p| p > t) {
            self.poll_at[reactor] = Some(t);
            self.at(t, Ev::Poll(reactor as u32));
        }
    }

    fn ddio_factor(&self) -> f64 {
        let t = &self.sc.target;
        let mib = (self.in_use * u64::from(t.buffer_size)) as f64 / (1u64 << 20) as f64;
        if mib <= t.ddio_budget_mib {
            return 1.0;
        }
        (1.0 - t.ddio_slope * (mib / t.ddio_budget_mib).log2()).max(t.ddio_floor)
    }

    fn set_in_use(&mut self, v: u64) {
        self.in_use = v;
        self.bufs_gauge.update(self.now, v);
    }

    fn start_device(&mut self, id: u32) {
        let d = self.ios[id as usize].device;
        self.ios[id as usize].started = self.now;
        let dev = &mut self.devs[d];
        match dev.kind {
            DeviceKind::Delay => {
                let t = self.now + dev.latency;
                self.at(t, Ev::DeviceDone(id));
            }
            DeviceKind::Nvme => {
                let service = dev
                    .cost
                    .cost(IoKind::Read, self.ios[id as usize].bytes, false)
                    as Nanos;
                let now = self.now;
                let latency = dev.latency;
                let Some(channel) = dev.channels.iter_mut().min() else {
                    return;
                };
                let start = (*channel).max(now);
                *channel = start + service;
                self.at(start + service + latency, Ev::DeviceDone(id));
            }
        }
    }

    fn take_buffers(&mut self, id: u32) {
        let n = self.ios[id as usize].bufs;
        if self.buf_waiters.is_empty() && self.free_bufs >= n {
            self.free_bufs -= n;
            self.set_in_use(self.in_use + u64::from(n));
            self.start_device(id);
        } else {
            self.buf_waiters.push_back(id);
        }
    }

    fn start_tx(&mut self, port: usize) {
        let p = &mut self.ports[port];
        if p.busy {
            return;
        }
        let Some(id) = p.pop() else {
            return;
        };
        p.busy = true;
        let rate = p.rate_bps * self.ddio_factor();
        let t = self.now + (f64::from(self.ios[id as usize].bytes) * 8.0 / rate * 1e9) as Nanos;
        self.at(t.max(self.now + 1), Ev::TxDone(id));
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive(id) => {
                let io = &self.ios[id as usize];
                let h = &self.hosts[io.host];
                let r = self.reactor_of(id);
                let paced = PacedIo {
                    id: u64::from(id),
                    flow: io.host as u64,
                    device: io.device,
                    tenant: h.tenant,
                    bytes: io.bytes,
                    kind: IoKind::Read,
                    offset: self.rng.gen::<u32>() as u64 * 4096,
                };
                self.pacers[r].enqueue(paced, self.now);
                self.schedule_poll(r, self.now);
            }
            Ev::Poll(r) => {
                let r = r as usize;
                if self.poll_at[r] != Some(self.now) {
                    return; // superseded by an earlier poll
                }
                self.poll_at[r] = None;
                let mut out = std::mem::take(&mut self.released);
                self.pacers[r].poll(self.now, &mut out);
                for id in out.drain(..) {
                    self.take_buffers(id as u32);
                }
                self.released = out;
                if let Some(t) = self.pacers[r].next_wakeup(self.now) {
                    self.schedule_poll(r, t.max(self.now + 1));
                }
            }
            Ev::DeviceDone(id) => {
                let d = self.ios[id as usize].device;
                let r = self.reactor_of(id);
                let started = self.ios[id as usize].started;
                if self.measuring {
                    self.device_lat.record(self.now.saturating_sub(started));
                }
                self.pacers[r].on_device_complete(
                    d,
                    IoKind::Read,
                    self.now.saturating_sub(started),
                    self.now,
                );
                let host = self.ios[id as usize].host;
                let port = self.hosts[host].port;
                self.ports[port].push(host, id);
                self.start_tx(port);
            }
            Ev::TxDone(id) => {
                let io = self.ios[id as usize].clone();
                let host = io.host;
                let port = self.hosts[host].port;
                self.ports[port].busy = false;
                self.free_bufs += io.bufs;
                self.set_in_use(self.in_use - u64::from(io.bufs));
                while let Some(&w) = self.buf_waiters.front() {
                    let n = self.ios[w as usize].bufs;
                    if self.free_bufs < n {
                        break;
                    }
                    self.buf_waiters.pop_front();
                    self.free_bufs -= n;
                    self.set_in_use(self.in_use + u64::from(n));
                    self.start_device(w);
                }
                let r = self.reactor_of(id);
                self.pacers[r].on_complete(u64::from(id), self.now);
                self.schedule_poll(r, self.now);
                self.start_tx(port);
                let rtt = self.ports[port].rtt;
                self.at(self.now + rtt / 2, Ev::Reply(id));
            }
            Ev::Reply(id) => {
                let io = self.ios[id as usize].clone();
                self.ios[id as usize].live = false;
                self.free_ios.push(id);
                self.completed += 1;
                if self.measuring {
                    let lat = self.now - io.issued;
                    self.lat.record(lat);
                    let g = self.hosts[io.host].group;
                    self.group_lat[g].record(lat);
                    let h = &mut self.hosts[io.host];
                    h.delivered += u64::from(io.bytes);
                    let slot = ((self.now - self.sc.warmup_ms * 1_000_000) / SLOT_NS) as usize;
                    if h.slots.len() <= slot {
                        h.slots.resize(slot + 1, 0);
                    }
                    h.slots[slot] += u64::from(io.bytes);
                }
                self.issue(io.host);
            }
            Ev::Rate(p) => {
                if let Some((_, rate)) = self.ports[p as usize].step.take() {
                    self.ports[p as usize].rate_bps = rate;
                }
            }
        }
    }

    /// One `--trace` line: time, buffers in use, and per reactor its
    /// window, rate and latency estimates, bytes in flight and queue.
    fn trace_line(&self, t: Nanos) {
        let mib = |b: f64| b / f64::from(1u32 << 20);
        let bufs = mib((self.in_use * u64::from(self.sc.target.buffer_size)) as f64);
        let mut line = format!(
            "trace {} t_ms={} bufs_mib={bufs:.2}",
            self.trace_tag,
            t / 1_000_000
        );
        for (i, p) in self.pacers.iter().enumerate() {
            let s = p.stats(t);
            line += &format!(
                " | r{i} window_mib={:.2} rate_gbps={:.1} min_lat_us={:.0} in_flight_mib={:.2} queued={}",
                mib(s.window_bytes as f64),
                s.rate_bps * 8e-9,
                s.min_latency_us,
                mib(s.bytes_in_flight as f64),
                s.queued
            );
        }
        eprintln!("{line}");
    }

    fn run(mut self) -> Row {
        for h in 0..self.hosts.len() {
            for _ in 0..self.hosts[h].qd {
                self.issue(h);
            }
        }
        for p in 0..self.ports.len() {
            if let Some((t, _)) = self.ports[p].step {
                self.at(t, Ev::Rate(p as u32));
            }
        }
        let warm = self.sc.warmup_ms * 1_000_000;
        let end = warm + self.sc.duration_ms * 1_000_000;
        let mut next_trace = 0;
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            if t > end {
                break;
            }
            if !self.measuring && t >= warm {
                self.measuring = true;
                self.bufs_gauge.update(t, self.in_use);
                self.bufs_gauge.reset(t);
            }
            self.now = t;
            self.handle(ev);
            if self.sc.trace && t >= next_trace {
                next_trace += 1_000_000;
                self.trace_line(t);
            }
        }
        self.now = end;
        let secs = self.sc.duration_ms as f64 / 1e3;
        let delivered: u64 = self.hosts.iter().map(|h| h.delivered).sum();
        let bw = delivered as f64 * 8.0 / secs / 1e9;
        let mib = f64::from(self.sc.target.buffer_size) / (1u64 << 20) as f64;
        let groups = self.sc.hosts.len();
        let mut per_group = vec![0.0; groups];
        for h in &self.hosts {
            per_group[h.group] += h.delivered as f64 * 8.0 / secs / 1e9;
        }
        // The seed's BW STDDEV: RMS over hosts of each host's bandwidth stddev over time.
        let mut sq = 0.0;
        for h in &self.hosts {
            let n = h.slots.len().max(1) as f64;
            let rates: Vec<f64> = h
                .slots
                .iter()
                .map(|b| *b as f64 * 8.0 / (SLOT_NS as f64 / 1e9) / 1e9)
                .collect();
            let mean = rates.iter().sum::<f64>() / n;
            let var = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
            sq += var;
        }
        let stddev = (sq / self.hosts.len().max(1) as f64).sqrt();
        let period = self
            .pacers
            .iter()
            .map(|p| p.stats(end).period_us)
            .sum::<f64>()
            / self.pacers.len() as f64;
        let live = self.ios.iter().filter(|i| i.live).count() as u64;
        let targeted: Vec<f64> = (0..self.devs.len())
            .filter(|&d| self.qos.has_targets(d))
            .map(|d| self.qos.vrate(d))
            .collect();
        let vrate = if targeted.is_empty() {
            1.0
        } else {
            targeted.iter().sum::<f64>() / targeted.len() as f64
        };
        Row {
            qd: 0,
            bw_gbps: bw,
            wire_gbps: bw * self.sc.target.wire_overhead,
            avg_lat_us: self.lat.mean() / 1e3,
            p99_us: self.lat.percentile(99.0) as f64 / 1e3,
            bw_stddev: stddev,
            bufs_mib_avg: self.bufs_gauge.avg(end) * mib,
            bufs_mib_max: self.bufs_gauge.max() as f64 * mib,
            period_us: period,
            per_group_gbps: per_group,
            per_group_p99_us: self
                .group_lat
                .iter()
                .map(|h| h.percentile(99.0) as f64 / 1e3)
                .collect(),
            device_p99_us: self.device_lat.percentile(99.0) as f64 / 1e3,
            vrate,
            conserved: self.issued == self.completed + live,
        }
    }
}

/// Runs one configuration at one QD.
pub fn simulate(sc: &Scenario, run: &RunConfig, qd: u32) -> Row {
    let mut row = Sim::new(sc, run, qd).run();
    row.qd = qd;
    row
}

/// Every run of a scenario at every QD.
pub fn run_scenario(sc: &Scenario) -> Vec<(String, Vec<Row>)> {
    sc.runs
        .iter()
        .map(|r| {
            (
                r.label.clone(),
                sc.qds.iter().map(|&q| simulate(sc, r, q)).collect(),
            )
        })
        .collect()
}

pub fn load(path: &str) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let sc: Scenario = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| text[..s.start].matches('\n').count() + 1);
        format!(
            "{path}:{}: {}",
            line.map_or("?".into(), |l| l.to_string()),
            e.message()
        )
    })?;
    for r in &sc.runs {
        r.pacing
            .validate()
            .map_err(|(f, m)| format!("{path}: run `{}`: pacing.{f}: {m}", r.label))?;
        if let Some(q) = &r.qos {
            q.validate()
                .map_err(|(f, m)| format!("{path}: run `{}`: qos.{f}: {m}", r.label))?;
        }
    }
    for (i, g) in sc.devices.iter().enumerate() {
        if let Some(q) = &g.qos {
            q.validate()
                .map_err(|(f, m)| format!("{path}: devices[{i}]: qos.{f}: {m}"))?;
        }
    }
    if sc.ports.is_empty() || sc.devices.is_empty() || sc.hosts.is_empty() {
        return Err(format!(
            "{path}: needs at least one port, device group and host group"
        ));
    }
    Ok(sc)
}

/// The seed's sweep table, with the seed's measured rows beside ours.
pub fn render(sc: &Scenario, results: &[(String, Vec<Row>)]) -> String {
    let mut s = format!("### {}\n\n", sc.name);
    if !sc.description.is_empty() {
        s += &format!("{}\n\n", sc.description);
    }
    for ((label, rows), run) in results.iter().zip(&sc.runs) {
        s += &format!("**{label}**\n\n");
        s += "| QD | BW | WIRE BW | AVG LAT, us | p99, us | BW STDDEV | Bufs in-flight (MiB) | Pacer period, us | seed BW | seed Bufs (MiB) |";
        let groups = sc.hosts.len() > 1;
        if groups {
            s += " per group Gb/s (p99 us) |";
        }
        let qos = run.qos.is_some() || sc.devices.iter().any(|g| g.qos.is_some());
        if qos {
            s += " device p99, us | vrate |";
        }
        s += "\n|---|---|---|---|---|---|---|---|---|---|";
        if groups {
            s += "---|";
        }
        if qos {
            s += "---|---|";
        }
        s += "\n";
        for r in rows {
            let seed = run.seed_rows.iter().find(|x| x.0 == r.qd);
            let (sbw, sbuf) = seed.map_or(("".into(), "".into()), |x| {
                (format!("{:.1}", x.1), format!("{:.1}", x.2))
            });
            s += &format!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} ({:.1}) | {:.2} | {sbw} | {sbuf} |",
                r.qd, r.bw_gbps, r.wire_gbps, r.avg_lat_us, r.p99_us, r.bw_stddev, r.bufs_mib_avg, r.bufs_mib_max, r.period_us
            );
            if groups {
                let g: Vec<String> = r
                    .per_group_gbps
                    .iter()
                    .zip(&r.per_group_p99_us)
                    .map(|(b, p)| format!("{b:.1} ({p:.0})"))
                    .collect();
                s += &format!(" {} |", g.join(", "));
            }
            if qos {
                s += &format!(" {:.0} | {:.2} |", r.device_p99_us, r.vrate);
            }
            s += "\n";
        }
        s += "\n";
    }
    s
}

/// `iopace sim SCENARIO.toml [--json]`.
pub fn cli_main(args: &[String]) -> i32 {
    let json = args.iter().any(|a| a == "--json");
    let trace = args.iter().any(|a| a == "--trace");
    let paths: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if paths.is_empty() {
        eprintln!("usage: iopace sim SCENARIO.toml... [--json] [--trace]");
        return 2;
    }
    for p in paths {
        let sc = match load(p) {
            Ok(s) => Scenario { trace, ..s },
            Err(e) => {
                eprintln!("iopace sim: {e}");
                return 2;
            }
        };
        let results = run_scenario(&sc);
        if json {
            let v: Vec<_> = results
                .iter()
                .map(|(l, rows)| serde_json::json!({"scenario": sc.name, "run": l, "rows": rows}))
                .collect();
            println!("{}", serde_json::Value::Array(v));
        } else {
            print!("{}", render(&sc, &results));
        }
    }
    0
}

#[cfg(test)]
mod tests;
