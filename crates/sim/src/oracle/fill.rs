//! Hierarchical weighted max-min fairness by progressive filling.
//!
//! Every flow (a host) belongs to a group (a tenant) of some weight. A
//! single level `L` rises from zero; each group's total is `weight x L`,
//! split equally among its flows that are still free to grow, beside what
//! its frozen flows already hold. A flow freezes when it reaches its own
//! cap or when any constraint it loads fills. So a flow held back by its
//! own link, device or queue depth leaves its group's share to the group's
//! other flows, and a group that cannot use its share leaves it to the
//! others: the allocation is work-conserving at both levels.

/// One flow: its group, its own cap, and what each unit of its rate costs
/// each constraint it loads.
#[derive(Debug, Clone)]
pub struct Flow {
    pub group: usize,
    /// The most the flow can carry on its own (its queue depth by Little's law).
    pub cap: f64,
    /// (constraint index, load per unit of rate), coefficients above zero.
    pub loads: Vec<(usize, f64)>,
}

/// The constraints' capacities, the groups' weights and the flows.
#[derive(Debug, Clone, Default)]
pub struct Problem {
    pub capacity: Vec<f64>,
    pub weights: Vec<f64>,
    pub flows: Vec<Flow>,
}

/// Relative slack under which a constraint counts as full.
const FULL: f64 = 1e-9;

/// Each flow's rate in the hierarchical weighted max-min fair allocation.
pub fn solve(p: &Problem) -> Vec<f64> {
    solve_limits(p).0
}

/// Each flow's rate, and what froze it: `None` its own cap, `Some(c)` the
/// first full constraint `c` it loads.
pub fn solve_limits(p: &Problem) -> (Vec<f64>, Vec<Option<usize>>) {
    let n = p.flows.len();
    let mut rate = vec![0.0; n];
    let mut limit = vec![None; n];
    let mut frozen: Vec<bool> = p.flows.iter().map(|f| f.cap <= 0.0).collect();
    while frozen.iter().any(|f| !f) {
        let level = Level::of(p, &rate, &frozen);
        let Some(l) = next_level(p, &level, &frozen, &rate) else {
            break;
        };
        let full = full_constraints(p, &level, &frozen, &rate, l);
        for (i, f) in p.flows.iter().enumerate() {
            if frozen[i] {
                continue;
            }
            let r = level.rate(f.group, l).min(f.cap);
            let capped = r >= f.cap * (1.0 - FULL);
            let blocked = f.loads.iter().find(|(c, _)| full[*c]).map(|(c, _)| *c);
            if capped || blocked.is_some() {
                rate[i] = r.max(0.0);
                frozen[i] = true;
                limit[i] = if capped { None } else { blocked };
            }
        }
    }
    (rate, limit)
}

/// Per group: the rate its frozen flows hold and how many flows still grow.
struct Level<'a> {
    weights: &'a [f64],
    held: Vec<f64>,
    growing: Vec<usize>,
}

impl<'a> Level<'a> {
    fn of(p: &'a Problem, rate: &[f64], frozen: &[bool]) -> Level<'a> {
        let mut held = vec![0.0; p.weights.len()];
        let mut growing = vec![0; p.weights.len()];
        for (i, f) in p.flows.iter().enumerate() {
            if frozen[i] {
                held[f.group] += rate[i];
            } else {
                growing[f.group] += 1;
            }
        }
        Level {
            weights: &p.weights,
            held,
            growing,
        }
    }

    /// A growing flow's rate in `group` at level `l`.
    fn rate(&self, group: usize, l: f64) -> f64 {
        (self.weights[group] * l - self.held[group]) / self.growing[group] as f64
    }

    /// d(rate)/dL of a growing flow of `group`.
    fn slope(&self, group: usize) -> f64 {
        self.weights[group] / self.growing[group] as f64
    }

    /// The level at which a growing flow of `group` has rate `r`.
    fn level_at(&self, group: usize, r: f64) -> f64 {
        (r * self.growing[group] as f64 + self.held[group]) / self.weights[group]
    }
}

/// The lowest level at which a growing flow reaches its cap or a
/// constraint fills.
fn next_level(p: &Problem, level: &Level, frozen: &[bool], rate: &[f64]) -> Option<f64> {
    let mut best = f64::INFINITY;
    let (fixed, slope) = constraint_lines(p, level, frozen, rate);
    for (i, f) in p.flows.iter().enumerate() {
        if !frozen[i] {
            best = best.min(level.level_at(f.group, f.cap));
        }
    }
    for c in 0..p.capacity.len() {
        if slope[c] > 0.0 {
            best = best.min((p.capacity[c] - fixed[c]) / slope[c]);
        }
    }
    best.is_finite().then_some(best)
}

/// Each constraint's load as `fixed + slope x L`.
fn constraint_lines(
    p: &Problem,
    level: &Level,
    frozen: &[bool],
    rate: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let mut fixed = vec![0.0; p.capacity.len()];
    let mut slope = vec![0.0; p.capacity.len()];
    for (i, f) in p.flows.iter().enumerate() {
        for &(c, a) in &f.loads {
            if frozen[i] {
                fixed[c] += a * rate[i];
            } else {
                // rate = slope x L - held / growing
                let s = level.slope(f.group);
                fixed[c] -= a * level.held[f.group] / level.growing[f.group] as f64;
                slope[c] += a * s;
            }
        }
    }
    (fixed, slope)
}

/// The constraints full at level `l`.
fn full_constraints(
    p: &Problem,
    level: &Level,
    frozen: &[bool],
    rate: &[f64],
    l: f64,
) -> Vec<bool> {
    let (fixed, slope) = constraint_lines(p, level, frozen, rate);
    p.capacity
        .iter()
        .enumerate()
        .map(|(c, &cap)| slope[c] > 0.0 && fixed[c] + slope[c] * l >= cap * (1.0 - FULL))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(group: usize, cap: f64, loads: &[(usize, f64)]) -> Flow {
        Flow {
            group,
            cap,
            loads: loads.to_vec(),
        }
    }

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6 * y.abs().max(1.0), "{a:?} vs {b:?}");
        }
    }

    /// Three equal flows on one link of 90 share it equally.
    #[test]
    fn equal_flows_share_a_link_equally() {
        let p = Problem {
            capacity: vec![90.0],
            weights: vec![1.0],
            flows: (0..3).map(|_| flow(0, 1e9, &[(0, 1.0)])).collect(),
        };
        close(&solve(&p), &[30.0, 30.0, 30.0]);
    }

    /// A flow capped at 10 (its queue depth) leaves the rest to the other.
    #[test]
    fn a_capped_flow_leaves_the_rest() {
        let p = Problem {
            capacity: vec![100.0],
            weights: vec![1.0],
            flows: vec![flow(0, 10.0, &[(0, 1.0)]), flow(0, 1e9, &[(0, 1.0)])],
        };
        close(&solve(&p), &[10.0, 90.0]);
    }

    /// Tenants 2:1 behind one port of 92.4; the weight-2 tenant's one host
    /// sits on its own 9.24 link. It takes its link; the weight-1 tenant's
    /// two hosts split the rest, not half of what the link lets through.
    #[test]
    fn a_tenant_held_by_its_own_link_holds_no_one_back() {
        let port = 0;
        let link = 1;
        let p = Problem {
            capacity: vec![92.4, 9.24],
            weights: vec![2.0, 1.0],
            flows: vec![
                flow(0, 1e9, &[(port, 1.0), (link, 1.0)]),
                flow(1, 1e9, &[(port, 1.0)]),
                flow(1, 1e9, &[(port, 1.0)]),
            ],
        };
        close(&solve(&p), &[9.24, 41.58, 41.58]);
    }

    /// Tenants 2:1 on one port with no other bound: 2:1, and the hosts of
    /// a tenant equal.
    #[test]
    fn tenants_split_a_shared_port_by_weight() {
        let p = Problem {
            capacity: vec![90.0],
            weights: vec![2.0, 1.0],
            flows: vec![
                flow(0, 1e9, &[(0, 1.0)]),
                flow(0, 1e9, &[(0, 1.0)]),
                flow(1, 1e9, &[(0, 1.0)]),
            ],
        };
        close(&solve(&p), &[30.0, 30.0, 30.0]);
    }

    /// Inside a tenant, a host held by its own link leaves the tenant's
    /// share to its tenant-mate: tenants stay equal.
    #[test]
    fn a_host_held_by_its_link_leaves_its_share_to_its_tenant() {
        let p = Problem {
            capacity: vec![92.4, 9.24],
            weights: vec![1.0, 1.0],
            flows: vec![
                flow(0, 1e9, &[(0, 1.0), (1, 1.0)]),
                flow(0, 1e9, &[(0, 1.0)]),
                flow(1, 1e9, &[(0, 1.0)]),
            ],
        };
        close(&solve(&p), &[9.24, 36.96, 46.2]);
    }

    /// A shared device of 1e9 ns/s: host 0 pays 2 ns per byte, host 1
    /// 1 ns per byte (smaller IO costs more per byte). Max-min on rate:
    /// equal rates x with 3x = 1e9.
    #[test]
    fn a_shared_device_divides_by_rate_not_time() {
        let p = Problem {
            capacity: vec![1e9],
            weights: vec![1.0],
            flows: vec![flow(0, 1e12, &[(0, 2.0)]), flow(0, 1e12, &[(0, 1.0)])],
        };
        let x = 1e9 / 3.0;
        close(&solve(&p), &[x, x]);
    }

    /// A port of 50 shared by a 10 link and a 100 link: 10 and 40.
    #[test]
    fn a_port_shared_by_unequal_links() {
        let p = Problem {
            capacity: vec![50.0, 10.0, 100.0],
            weights: vec![1.0],
            flows: vec![
                flow(0, 1e9, &[(0, 1.0), (1, 1.0)]),
                flow(0, 1e9, &[(0, 1.0), (2, 1.0)]),
            ],
        };
        close(&solve(&p), &[10.0, 40.0]);
    }

    /// Flows on disjoint constraints each fill their own.
    #[test]
    fn disjoint_bottlenecks_fill_independently() {
        let p = Problem {
            capacity: vec![10.0, 70.0],
            weights: vec![1.0, 5.0],
            flows: vec![flow(0, 1e9, &[(0, 1.0)]), flow(1, 1e9, &[(1, 1.0)])],
        };
        close(&solve(&p), &[10.0, 70.0]);
    }

    /// A tenant with no flow left (all capped) does not stop the others.
    #[test]
    fn a_fully_capped_tenant_stops_no_one() {
        let p = Problem {
            capacity: vec![100.0],
            weights: vec![8.0, 1.0],
            flows: vec![flow(0, 5.0, &[(0, 1.0)]), flow(1, 1e9, &[(0, 1.0)])],
        };
        close(&solve(&p), &[5.0, 95.0]);
    }
}
