//! One direction of a target port: flows (one per host) share its bytes by
//! deficit round robin, as fq or competing TCP flows do, and each flow also
//! crosses its host's own link, which may be slower than its share.

use std::collections::VecDeque;

use pace::Nanos;

/// Bytes a port sends at once (a TSO segment), and each flow's quantum.
pub const SEGMENT: u32 = 128 << 10;

/// A message queued on a flow: a reply, or a write payload piece.
#[derive(Debug, Clone, Copy)]
struct Message {
    token: u64,
    /// Bytes not yet sent.
    left: u32,
}

#[derive(Debug, Default)]
struct Flow {
    queue: VecDeque<Message>,
    /// Bytes this flow may still send in its turn.
    deficit: u64,
    /// The host link's payload rate, bits/s; `None`: as fast as the port.
    link_bps: Option<f64>,
    /// When the host link has carried everything sent so far.
    link_free_at: Nanos,
}

impl Flow {
    /// How far ahead of its host link a flow may send: one segment may wait
    /// at the switch, so the link never idles while the port serves others.
    fn lead(&self) -> Nanos {
        self.link_bps
            .map_or(0, |bps| (f64::from(SEGMENT) * 8.0 / bps * 1e9) as Nanos)
    }

    /// A flow whose host link still has a segment to carry waits: what a TCP
    /// sender paced to its bottleneck does, instead of filling the switch's
    /// queue in front of that link.
    fn ready(&self, now: Nanos) -> bool {
        self.link_free_at <= now + self.lead()
    }
}

/// What [`Port::start`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A segment left: the port is busy until `port_done`.
    Sent(Segment),
    /// Data waits behind host links; look again at this time.
    WaitUntil(Nanos),
    /// Busy, or nothing to send.
    Nothing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The message's token if this segment was its last.
    pub finished: Option<u64>,
    /// When the port has sent it.
    pub port_done: Nanos,
    /// When it has crossed the host link too.
    pub link_done: Nanos,
}

pub struct Port {
    rate_bps: f64,
    busy: bool,
    flows: Vec<Flow>,
    /// Flows with queued messages, in turn order; the front is sending.
    active: VecDeque<usize>,
    /// The front flow has had its quantum for this turn.
    turn_started: bool,
    /// A `WaitUntil` already asked for, so it is asked once.
    pub wake_at: Option<Nanos>,
}

impl Port {
    pub fn new(rate_bps: f64) -> Port {
        debug_assert!(rate_bps > 0.0);
        Port {
            rate_bps,
            busy: false,
            flows: Vec::new(),
            active: VecDeque::new(),
            turn_started: false,
            wake_at: None,
        }
    }

    pub fn set_rate(&mut self, rate_bps: f64) {
        debug_assert!(rate_bps > 0.0);
        self.rate_bps = rate_bps;
    }

    /// Flow `flow`'s host link is down until `until` (a link flap): it
    /// sends nothing before then.
    pub fn hold(&mut self, flow: usize, until: Nanos) {
        if let Some(f) = self.flows.get_mut(flow) {
            f.link_free_at = f.link_free_at.max(until);
        }
    }

    /// Flow `flow` crosses a host link of `link_bps` (bits/s), if any.
    pub fn add_flow(&mut self, flow: usize, link_bps: Option<f64>) {
        if self.flows.len() <= flow {
            self.flows.resize_with(flow + 1, Flow::default);
        }
        self.flows[flow].link_bps = link_bps;
    }

    pub fn push(&mut self, flow: usize, token: u64, bytes: u32) {
        if self.flows.len() <= flow {
            self.flows.resize_with(flow + 1, Flow::default);
        }
        let f = &mut self.flows[flow];
        if f.queue.is_empty() {
            self.active.push_back(flow);
        }
        f.queue.push_back(Message {
            token,
            left: bytes.max(1),
        });
    }

    /// The port finished its segment.
    pub fn done(&mut self) {
        debug_assert!(self.busy);
        self.busy = false;
    }

    /// Sends the next segment if idle; `speed` scales the port's rate (the
    /// memory/DDIO factor).
    pub fn start(&mut self, now: Nanos, speed: f64) -> Start {
        if self.busy || self.active.is_empty() {
            return Start::Nothing;
        }
        let Some(flow) = self.pick(now) else {
            let wake = self
                .active
                .iter()
                .map(|&f| self.flows[f].link_free_at - self.flows[f].lead())
                .min()
                .unwrap_or(now);
            return Start::WaitUntil(wake.max(now + 1));
        };
        self.busy = true;
        let f = &mut self.flows[flow];
        let Some(head) = f.queue.front_mut() else {
            debug_assert!(false, "an active flow has a message");
            return Start::Nothing;
        };
        let bytes = head.left.min(SEGMENT);
        head.left -= bytes;
        f.deficit -= u64::from(bytes);
        let bits = f64::from(bytes) * 8.0;
        let port_done = now + ((bits / (self.rate_bps * speed) * 1e9) as Nanos).max(1);
        let link_done = match f.link_bps {
            Some(bps) => {
                f.link_free_at = f.link_free_at.max(now) + (bits / bps * 1e9) as Nanos;
                f.link_free_at.max(port_done)
            }
            None => port_done,
        };
        let finished = (head.left == 0).then_some(head.token);
        if finished.is_some() {
            f.queue.pop_front();
            if f.queue.is_empty() {
                f.deficit = 0;
                self.active.pop_front();
                self.turn_started = false;
            }
        }
        Start::Sent(Segment {
            finished,
            port_done,
            link_done,
        })
    }

    /// Deficit round robin by bytes over the flows ready to send: the front
    /// flow sends while its deficit lasts, then the next gets a quantum.
    /// Flows held by their host link are passed over, keeping what they had.
    fn pick(&mut self, now: Nanos) -> Option<usize> {
        for _ in 0..2 * self.active.len() + 1 {
            let flow = *self.active.front()?;
            let f = &mut self.flows[flow];
            let next = f.queue.front().map_or(0, |m| m.left.min(SEGMENT));
            if !f.ready(now) {
                self.active.rotate_left(1);
                self.turn_started = false;
                continue;
            }
            if !self.turn_started {
                f.deficit += u64::from(SEGMENT);
                self.turn_started = true;
            }
            if f.deficit >= u64::from(next) {
                return Some(flow);
            }
            self.active.rotate_left(1);
            self.turn_started = false;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends until idle; returns the tokens in the order they finished.
    fn drain(p: &mut Port) -> Vec<u64> {
        let mut now = 0;
        let mut order = Vec::new();
        loop {
            match p.start(now, 1.0) {
                Start::Sent(s) => {
                    now = s.port_done;
                    p.done();
                    if let Some(t) = s.finished {
                        order.push(t);
                    }
                }
                Start::WaitUntil(t) => now = t,
                Start::Nothing => break,
            }
        }
        order
    }

    #[test]
    fn flows_share_bytes_not_messages() {
        // Flow 0 sends 1 MiB replies, flow 1 64 KiB ones: by the time flow
        // 0's first reply is out, flow 1 has sent 16 of its own.
        let mut p = Port::new(8e9);
        p.push(0, 100, 1 << 20);
        for t in 0..20 {
            p.push(1, t, 64 << 10);
        }
        let order = drain(&mut p);
        let big = order.iter().position(|&t| t == 100).expect("sent");
        assert!((14..=17).contains(&big), "{order:?}");
    }

    #[test]
    fn a_slow_host_link_leaves_the_port_to_others() {
        // 10 Gb/s port; host 0 behind a 1 Gb/s link, host 1 direct: host 1's
        // 10 MiB go out at nearly the port's rate beside host 0's.
        let mut p = Port::new(10e9);
        p.add_flow(0, Some(1e9));
        p.push(0, 0, 10 << 20);
        p.push(1, 1, 10 << 20);
        let mut now = 0;
        let mut fast_done = 0;
        let mut slow_done = 0;
        loop {
            match p.start(now, 1.0) {
                Start::Sent(s) => {
                    now = s.port_done;
                    p.done();
                    match s.finished {
                        Some(0) => slow_done = s.link_done,
                        Some(1) => fast_done = s.port_done,
                        _ => {}
                    }
                }
                Start::WaitUntil(t) => now = t,
                Start::Nothing => break,
            }
        }
        let bits = f64::from(10u32 << 20) * 8.0;
        let fast_gbps = bits / fast_done as f64;
        let slow_gbps = bits / slow_done as f64;
        assert!(fast_gbps > 8.5, "fast host {fast_gbps} Gb/s");
        assert!(
            (0.95..=1.0).contains(&slow_gbps),
            "slow host {slow_gbps} Gb/s"
        );
    }
}
