//! A host's IO mix, spread evenly rather than drawn at random: over any
//! stretch of a run its sizes and directions hold to its `bssplit` and
//! `read_pct`, and each of its devices gets the same mix. The oracle
//! allocates for the mix's mean, so a short run's sampling noise (a QD 1
//! host that drew a few more small IOs) would otherwise read as a pacer's
//! miss.

/// The next size (smooth weighted round robin over `bssplit`), direction
/// (a running sum of `read_pct`) and device (round robin per size and
/// direction, so every device sees the host's whole mix).
pub(crate) struct Mix {
    sizes: Vec<(u32, i64)>,
    /// Each size's running credit; the largest goes next.
    credit: Vec<i64>,
    read_pct: u32,
    /// Percent points of reads owed, per size (so that each size, not
    /// just the whole, holds to `read_pct`); a read goes at 100.
    read_owed: Vec<u32>,
    /// The next device, per size and direction.
    next_device: Vec<[usize; 2]>,
    devices: usize,
}

/// One IO's draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Draw {
    pub bytes: u32,
    pub read: bool,
    /// Index into the host's devices.
    pub device: usize,
}

impl Mix {
    /// `phase` (the host's index) starts each host at a different point of
    /// its cycles, so hosts of one group do not move in step.
    pub fn new(bssplit: &[(u32, u32)], read_pct: u32, devices: usize, phase: usize) -> Mix {
        assert!(devices > 0, "a host uses at least one device");
        let mut sizes: Vec<(u32, i64)> = bssplit
            .iter()
            .filter(|s| s.1 > 0)
            .map(|&(b, w)| (b, i64::from(w)))
            .collect();
        if sizes.is_empty() {
            sizes.push((bssplit.first().map_or(131_072, |s| s.0), 1));
        }
        let mut mix = Mix {
            credit: vec![0; sizes.len()],
            next_device: vec![[phase % devices; 2]; sizes.len()],
            read_owed: vec![(phase as u32 * 37) % 100; sizes.len()],
            sizes,
            read_pct: read_pct.min(100),
            devices,
        };
        let cycle: i64 = mix.sizes.iter().map(|s| s.1).sum();
        for _ in 0..(phase as i64 % cycle) {
            mix.next_size();
        }
        mix
    }

    fn next_size(&mut self) -> usize {
        let total: i64 = self.sizes.iter().map(|s| s.1).sum();
        for (c, s) in self.credit.iter_mut().zip(&self.sizes) {
            *c += s.1;
        }
        let pick = (0..self.sizes.len())
            .max_by_key(|&i| (self.credit[i], std::cmp::Reverse(i)))
            .expect("at least one size");
        self.credit[pick] -= total;
        pick
    }

    fn next_read(&mut self, size: usize) -> bool {
        let owed = &mut self.read_owed[size];
        *owed += self.read_pct;
        let read = *owed >= 100;
        if read {
            *owed -= 100;
        }
        read
    }

    pub fn draw(&mut self) -> Draw {
        let size = self.next_size();
        let read = self.next_read(size);
        let slot = &mut self.next_device[size][usize::from(read)];
        let device = *slot;
        *slot = (device + 1) % self.devices;
        Draw {
            bytes: self.sizes[size].0,
            read,
            device,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(mix: &mut Mix, n: usize) -> Vec<Draw> {
        (0..n).map(|_| mix.draw()).collect()
    }

    #[test]
    fn sizes_follow_the_split_over_every_cycle() {
        let mut mix = Mix::new(&[(8192, 4), (262_144, 3)], 100, 1, 5);
        for _ in 0..3 {
            let cycle = draws(&mut mix, 7);
            assert_eq!(cycle.iter().filter(|d| d.bytes == 8192).count(), 4);
            assert!(cycle.iter().all(|d| d.read));
        }
    }

    #[test]
    fn reads_follow_read_pct() {
        let mut mix = Mix::new(&[(4096, 1)], 70, 1, 3);
        let reads = draws(&mut mix, 100).iter().filter(|d| d.read).count();
        assert_eq!(reads, 70);
        let mut none = Mix::new(&[(4096, 1)], 0, 1, 3);
        assert!(draws(&mut none, 50).iter().all(|d| !d.read));
    }

    #[test]
    fn every_device_gets_the_whole_mix() {
        // Two sizes alternate, and so would reads and writes: plain round
        // robins would send all the small IOs to one device and all the
        // large to the other, or make every small IO a write.
        let mut mix = Mix::new(&[(4096, 1), (1 << 20, 1)], 50, 2, 0);
        let all = draws(&mut mix, 400);
        for dev in 0..2 {
            for bytes in [4096, 1 << 20] {
                for read in [false, true] {
                    let n = all
                        .iter()
                        .filter(|d| d.device == dev && d.bytes == bytes && d.read == read)
                        .count();
                    assert!((45..=55).contains(&n), "device {dev} {bytes} {read}: {n}");
                }
            }
        }
    }

    #[test]
    fn a_zero_weight_size_is_never_drawn_and_an_empty_split_has_a_default() {
        let mut mix = Mix::new(&[(4096, 0), (65536, 2)], 100, 3, 1);
        assert!(draws(&mut mix, 20).iter().all(|d| d.bytes == 65536));
        let mut none = Mix::new(&[], 100, 1, 0);
        assert_eq!(none.draw().bytes, 131_072);
    }
}
