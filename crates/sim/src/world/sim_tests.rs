//! What tests ask of a run beyond its row: a wind-down until every IO
//! is answered, and what is left outstanding.

use super::Sim;

impl Sim<'_> {
    /// Hosts stop issuing; the run goes on until every IO issued has its
    /// reply (false: not within 10 simulated seconds).
    pub(crate) fn finish(&mut self) -> bool {
        self.quiesce = true;
        let end = self.clock.now() + 10_000_000_000;
        while !self.meter.all_answered() {
            if !self.next_event(end) {
                return false;
            }
        }
        true
    }

    /// Commands in flight on the NVMe/TCP queues, and IOs waiting for one.
    pub(crate) fn nvme_outstanding(&self) -> (usize, usize) {
        let queues = self.net.socks().iter().filter_map(|s| s.nvme.as_deref());
        queues.fold((0, 0), |(f, b), q| (f + q.in_flight(), b + q.backlog.len()))
    }

    pub(crate) fn nvme_errors(&self) -> &[String] {
        &self.nvme_errors
    }

    pub(crate) fn engines(&self) -> &[server::engine::Engine] {
        self.drive.engines()
    }
}
