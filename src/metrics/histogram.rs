//! Latency histograms with one fixed bucket layout (100 µs to 60 s), so that what workers
//! count can be added up by the master: [`Hist`] is a plain value (sent over the control
//! channel, summed across workers), [`AtomicHist`] is what a worker observes into on its
//! serving path (a few relaxed atomic adds, no lock).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds in seconds; a last bucket (+Inf) takes the rest.
pub const BOUNDS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// Buckets including +Inf.
pub const BUCKETS: usize = BOUNDS.len() + 1;

/// The bucket a duration falls in (`le` semantics: a value equal to a bound is in it).
pub fn bucket_of(secs: f64) -> usize {
    BOUNDS.partition_point(|b| *b < secs)
}

/// Observations per bucket (not cumulative; the last is +Inf) and their sum in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hist {
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Default for Hist {
    fn default() -> Hist {
        Hist {
            counts: vec![0; BUCKETS],
            sum: 0.0,
        }
    }
}

impl Hist {
    pub fn observe(&mut self, secs: f64) {
        if secs.is_nan() || secs < 0.0 {
            return;
        }
        self.counts[bucket_of(secs)] += 1;
        self.sum += secs;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds another histogram of the same layout (a shorter one, from an older sender, is
    /// added bucket by bucket as far as it goes).
    pub fn add(&mut self, other: &Hist) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        // Rounded to whole nanoseconds (what the workers measure in): floating-point
        // addition is not associative, and the master adds a worker's totals to the live
        // sum and, once it exits, to the totals of the gone ones, in another order; unrounded,
        // a scrape's `_sum` could come out a few 1e-17 below the one before, which
        // Prometheus reads as a counter reset.
        self.sum = ((self.sum + other.sum) * 1e9).round() / 1e9;
    }

    /// `(upper bound, count in that bucket)`, +Inf last.
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        BOUNDS
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().copied())
    }
}

/// A histogram observed from many threads: relaxed atomic adds only.
pub struct AtomicHist {
    counts: [AtomicU64; BUCKETS],
    /// Sum in nanoseconds (584 years before it wraps).
    sum_ns: AtomicU64,
}

impl Default for AtomicHist {
    fn default() -> AtomicHist {
        AtomicHist {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl AtomicHist {
    pub fn observe(&self, d: Duration) {
        self.counts[bucket_of(d.as_secs_f64())].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    pub fn load(&self) -> Hist {
        Hist {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The master adds workers' totals in whatever order they exit: the sum must not depend
    /// on it (a `_sum` that goes down is a counter reset to Prometheus).
    #[test]
    fn sums_do_not_depend_on_the_order_they_are_added_in() {
        let h = |secs: f64| Hist {
            counts: vec![0; BUCKETS],
            sum: secs,
        };
        // Unrounded, (0.1 + 0.2) + 0.3 is 0.6000000000000001 and 0.1 + (0.2 + 0.3) is 0.6.
        let (a, b, c) = (h(0.1), h(0.2), h(0.3));
        let mut left = a.clone();
        left.add(&b);
        left.add(&c);
        let mut bc = b.clone();
        bc.add(&c);
        let mut right = a.clone();
        right.add(&bc);
        assert_eq!(
            left.sum.to_bits(),
            right.sum.to_bits(),
            "{} vs {}",
            left.sum,
            right.sum
        );
    }

    #[test]
    fn buckets_follow_le_and_span_100us_to_60s() {
        assert_eq!(bucket_of(0.0), 0);
        assert_eq!(bucket_of(0.0001), 0);
        assert_eq!(bucket_of(0.00011), 1);
        assert_eq!(bucket_of(60.0), BOUNDS.len() - 1);
        assert_eq!(bucket_of(61.0), BOUNDS.len());
        assert!(BOUNDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn atomic_and_plain_histograms_agree_and_add_up() {
        let a = AtomicHist::default();
        let mut h = Hist::default();
        for ms in [0.05, 3.0, 3.0, 700.0, 90_000.0] {
            a.observe(Duration::from_secs_f64(ms / 1e3));
            h.observe(ms / 1e3);
        }
        let l = a.load();
        assert_eq!(l.counts, h.counts);
        assert!((l.sum - h.sum).abs() < 1e-6);
        assert_eq!(h.count(), 5);
        let mut twice = h.clone();
        twice.add(&h);
        assert_eq!(twice.count(), 10);
        assert_eq!(twice.counts[bucket_of(0.003)], 4);
        assert_eq!(h.buckets().last(), Some((f64::INFINITY, 1)));
    }
}
