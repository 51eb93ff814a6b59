//! Flows that share a full port pool their windows, so the tenants' order
//! (the tenant clock) decides which of them goes next.
//!
//! A flow's own window is sized from what it drains. Where its own link
//! binds, that is right: it keeps the link busy and no more. But behind a
//! port that several hosts fill, what each flow drains is the port's split
//! between their sockets (TCP's, 1:1 for two busy sockets), not what they
//! could take: each flow's window holds its half, a released IO only
//! replaces one of its own flow's that landed, and the tenants' weights
//! never choose (tenants 2:1 on equal 1 Gbit/s links behind a full 1 Gbit/s
//! port split it 1.00:1, `docs/evidence.md#tenants-port-pool`).
//!
//! So on a port the target knows to be full (see `ports.rs`), a flow's
//! window gives way to the pool's: the sum of those flows' own windows on
//! this reactor. Each flow may hold up to `POOL_CAP` times its part of the
//! pool by rate (or its own bandwidth-delay product, if larger: a flow on
//! slow devices needs more in flight for the same rate), so a flow whose
//! own slower link binds, on a port that others fill, cannot fill the pool
//! with IO that waits for its link: it grows only as fast as its rate does.
//! Its host's window gives way too (a host is its flows on this reactor),
//! to the same cap over all its pooled flows: a host with a flow per drive
//! would otherwise send one IO on each, whatever its rate. A flow's part of
//! the pool is taken of at most the reactor's window: the pool sums its
//! flows' floors, and 48 flows of 2 IOs each made a 12 MiB pool on a
//! reactor whose window was 2 MiB.

use rustc_hash::FxHashMap;

/// A pooled flow holds at most this many times its part of the pool by
/// rate: room for a port-bound flow's rate to grow to its tenant's share
/// (doubling at each of its rate samples), and a bound on one held by a
/// slower link of its own.
const POOL_CAP: f64 = 2.0;

#[derive(Debug, Clone, Copy, Default)]
struct Pool {
    /// The sum of its flows' own windows.
    window: u64,
    /// Its draining flows' bytes in the pipeline.
    piped: u64,
    /// The sum of its flows' rates, bytes/s.
    rate: f64,
    /// Its flows' tenants, one bit each (tenant % 64).
    tenants: u64,
}

/// The pools of this reactor's flows, one per full port.
#[derive(Debug, Clone, Default)]
pub(super) struct Pools {
    map: FxHashMap<usize, Pool>,
}

impl Pools {
    /// Forgets every pool, before `join` rebuilds them.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// A flow of tenant `tenant` on port `port` with window `window`, rate
    /// `rate` and `piped` bytes in the pipeline (0 if it has stalled) joins
    /// its pool.
    pub fn join(&mut self, port: usize, tenant: usize, window: u64, rate: f64, piped: u64) {
        let p = self.map.entry(port).or_default();
        p.window += window;
        p.rate += rate;
        p.piped += piped;
        p.tenants |= 1 << (tenant % 64);
    }

    /// Flows on `port` share a pool here: two or more tenants' flows joined
    /// it, so there is an order to keep. One tenant's flows keep their own
    /// windows (TCP splits a port equally between a tenant's hosts, as the
    /// weights would), and so does a tenant alone on its reactor (the
    /// tenant clock orders the reactors).
    pub fn shared(&self, port: usize) -> bool {
        self.map
            .get(&port)
            .is_some_and(|p| p.tenants.count_ones() > 1)
    }

    /// The most a flow (or a host's pooled flows) of rate `rate` and
    /// bandwidth-delay product `bdp` on `port` may hold: `POOL_CAP` times
    /// the larger of its product and its part by rate of the pool's
    /// window, that window taken at most as the reactor's (`reactor`).
    pub fn cap(&self, port: usize, rate: f64, bdp: u64, reactor: u64) -> u64 {
        let Some(p) = self.map.get(&port) else {
            return bdp;
        };
        debug_assert!(p.rate >= rate && p.rate > 0.0, "a flow's pool has its rate");
        let part = p.window.min(reactor) as f64 * rate / p.rate;
        (POOL_CAP * part.max(bdp as f64)) as u64
    }

    /// `bytes` of a draining flow on `port` entered the pipeline.
    pub fn enter(&mut self, port: Option<usize>, bytes: u64) {
        if let Some(p) = port.and_then(|p| self.map.get_mut(&p)) {
            p.piped += bytes;
        }
    }

    /// `bytes` of a draining flow on `port` left the pipeline (or its
    /// flow stalled).
    pub fn leave(&mut self, port: Option<usize>, bytes: u64) {
        if let Some(p) = port.and_then(|p| self.map.get_mut(&p)) {
            debug_assert!(p.piped >= bytes, "a pool loses more than it holds");
            p.piped -= bytes;
        }
    }

    /// `port`'s pool has room for `bytes` more in the pipeline, its window
    /// made `deepen`ed (or it has nothing in the pipeline).
    pub fn open(&self, port: usize, bytes: u64, deepen: impl Fn(u64) -> u64) -> bool {
        self.map
            .get(&port)
            .is_none_or(|p| p.piped == 0 || p.piped + bytes <= deepen(p.window))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fair::Landing;
    use super::super::DeviceNs;
    use super::*;

    #[test]
    fn a_flow_may_hold_twice_its_part_of_the_pool_by_rate() {
        let mut pools = Pools::default();
        // Two flows on port 3: 1 MB/s and 3 MB/s, 400 and 600 KB windows.
        pools.join(3, 0, 400_000, 1e6, 0);
        assert!(!pools.shared(3), "one tenant");
        pools.join(3, 1, 600_000, 3e6, 100_000);
        assert_eq!(
            pools.cap(3, 1e6, 10_000, u64::MAX),
            500_000,
            "2 x a quarter of 1 MB"
        );
        assert_eq!(
            pools.cap(3, 1e6, 300_000, u64::MAX),
            600_000,
            "its own product is larger"
        );
        assert_eq!(pools.cap(3, 3e6, 0, u64::MAX), 1_500_000);
        assert_eq!(pools.cap(4, 1e6, 7, u64::MAX), 7, "no pool: its product");
        assert!(pools.shared(3) && !pools.shared(4));
        pools.join(4, 2, 1, 1.0, 0);
        pools.join(4, 2, 1, 1.0, 0);
        assert!(!pools.shared(4), "two flows of one tenant");
        let same = |w| w;
        assert!(pools.open(3, 900_000, same));
        assert!(!pools.open(3, 900_001, same));
        pools.enter(Some(3), 200_000);
        pools.enter(None, 1 << 40);
        assert!(!pools.open(3, 700_001, same));
        pools.leave(Some(3), 300_000);
        assert!(pools.open(3, 1_000_000, same), "an empty pool lets one go");
        assert!(pools.open(4, u64::MAX, same), "no pool");
        pools.clear();
        assert!(pools.open(3, u64::MAX, same));
    }

    /// Flows 1 (tenant 0, host 10) and 2 (tenant 1, host 20) each deliver
    /// 128 KiB every 2.2 ms (60 MB/s) and keep IO queued; `tenant2` is
    /// flow 2's tenant.
    /// The sizing the flows learn under: gain 2, 128 KiB IO, 100 us.
    fn sizing() -> super::super::sizing::Sizing {
        super::super::sizing::Sizing {
            gain: 2.0,
            max_io: IO,
            max_window: 1 << 30,
            latency: Some(100_000),
            hold: None,
            queued: None,
        }
    }

    const IO: u64 = 128 << 10;

    /// Flow `f` of tenant `t` queues, releases and delivers one IO at `now`.
    fn deliver_one(flows: &mut super::super::flows::Flows, f: u64, t: usize, now: u64) {
        flows.queued(f, (0, t), IO, IO, now);
        flows.released(f, IO);
        flows.enter_pipe(f, IO, IO, now);
        flows.leave_pipe(f, IO, IO);
        flows.landed(f, IO);
        flows.delivered(f, Landing::bytes(IO), now, sizing());
    }

    fn two_flows(tenant2: usize) -> super::super::flows::Flows {
        use super::super::flows::Flows;
        let io = IO;
        let mut flows = Flows::default();
        flows.join(1, 10);
        flows.join(2, 20);
        for i in 0..200 {
            let now = i * 2_200_000;
            for (f, t) in [(1, 0), (2, tenant2)] {
                deliver_one(&mut flows, f, t, now);
            }
        }
        for (f, t) in [(1, 0), (2, tenant2)] {
            for _ in 0..8 {
                flows.queued(f, (0, t), io, io, 0);
            }
        }
        flows
    }

    #[test]
    fn two_tenants_flows_on_a_full_port_share_one_window() {
        use super::super::sizing::Floors;
        let io = 128 << 10;
        // Each host's window: its part of the shared floor, 4 IOs.
        let floors = Floors {
            host: 2 * io,
            shared: 8 * io,
        };
        let same = |w| w;
        let host = |_, own| own;
        for (port, tenant2, pooled) in [(Some(0), 1, true), (None, 1, false), (Some(0), 0, false)] {
            let mut flows = two_flows(tenant2);
            flows.window_sum(floors, |_, _| port, |_| 1.0);
            assert_eq!(flows.pooled(1), pooled, "port {port:?}, tenant {tenant2}");
            // Flow 1 has 5 IOs in the pipeline: past its own window (4),
            // within the pool (8) and its cap (2 x half of 8).
            for _ in 0..5 {
                flows.released(1, io);
                flows.enter_pipe(1, io, io, 0);
            }
            assert_eq!(
                flows.open(1, io, same, host, |_| (DeviceNs::ZERO, 0)),
                pooled
            );
            for _ in 0..3 {
                flows.released(2, io);
                flows.enter_pipe(2, io, io, 0);
            }
            assert!(
                !flows.open(1, io, same, host, |_| (DeviceNs::ZERO, 0)),
                "the pool (or its window) is full"
            );
            assert!(!flows.at_pool_cap(1, io, same));
        }
    }

    #[test]
    fn a_host_with_a_flow_per_drive_is_capped_as_one() {
        use super::super::flows::Flows;
        use super::super::sizing::Floors;
        let io = IO;
        // Host 10 (tenant 0) reads 8 drives over 8 flows behind its own
        // slow link, 128 KiB per flow every 17.6 ms; host 20 (tenant 1)
        // one flow, 128 KiB every 0.55 ms: a fifth of the pool's rate is
        // host 10's.
        let mut flows = Flows::default();
        let slow: Vec<u64> = (1..=8).collect();
        for &f in &slow {
            flows.join(f, 10);
        }
        flows.join(20, 20);
        for i in 0..3200u64 {
            let now = i * 550_000;
            let mut go = vec![(20, 1)];
            if i % 32 == 0 {
                go.extend(slow.iter().map(|&f| (f, 0)));
            }
            for (f, t) in go {
                deliver_one(&mut flows, f, t, now);
            }
        }
        for &f in slow.iter().chain([20].iter()) {
            let t = usize::from(f == 20);
            for _ in 0..4 {
                flows.queued(f, (f as usize, t), io, io, 0);
            }
        }
        let floors = Floors {
            host: 2 * io,
            shared: 8 * io,
        };
        flows.window_sum(floors, |_, _| Some(0), |_| 1.0);
        let (same, host) = (|w| w, |_, own| own);
        // Each of host 10's flows has nothing in flight, so each alone
        // may send one IO; together they stop at the host's cap.
        let mut sent = 0;
        for &f in &slow {
            if flows.open(f, io, same, host, |_| (DeviceNs::ZERO, 0)) {
                flows.released(f, io);
                flows.enter_pipe(f, io, io, 0);
                sent += 1;
            }
        }
        assert!((1..8).contains(&sent), "host 10 sent {sent} of 8");
        assert!(flows.at_pool_cap(slow[7], io, same));
        assert!(
            flows.open(20, io, same, host, |_| (DeviceNs::ZERO, 0)),
            "host 20 still may go"
        );
    }
}
