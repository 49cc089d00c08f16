//! [`Boots`]: the boot history `decide` reads to give up: whether any worker has ever been
//! ready, how many boots failed before one was, how the last failed boot exited, when a
//! worker was last ready; and why the master must stop with `exit::NO_CUDA` (a worker
//! placed on a GPU came up without CUDA). Updated by the control messages (ready) and by
//! reaping (failed boots).

use std::time::Instant;

/// The boot history.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Boots {
    /// A worker has been ready at least once.
    pub ever_ready: bool,
    /// Failed boots before any worker was ever ready.
    pub first_failures: u32,
    /// How the last failed boot exited (`decide::gave_up_booting`).
    pub last_code: Option<i32>,
    /// When a worker was last seen ready.
    pub last_ready_at: Instant,
    /// Why the master must stop with `exit::NO_CUDA`, once it must.
    pub no_cuda: Option<String>,
}

impl Boots {
    pub fn new(now: Instant) -> Boots {
        Boots {
            ever_ready: false,
            first_failures: 0,
            last_code: None,
            last_ready_at: now,
            no_cuda: None,
        }
    }

    /// A worker became ready.
    pub fn ready(&mut self, now: Instant) {
        self.ever_ready = true;
        self.last_ready_at = now;
    }

    /// A worker is ready now (seen at a turn of the loop).
    pub fn seen_ready(&mut self, now: Instant) {
        self.last_ready_at = now;
    }

    /// A boot failed, exiting with `code` (`None`: killed, or no status that says more).
    pub fn failed(&mut self, code: Option<i32>) {
        self.last_code = code;
        if !self.ever_ready {
            self.first_failures += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_before_the_first_ready_count_towards_giving_up() {
        let t0 = Instant::now();
        let mut b = Boots::new(t0);
        b.failed(Some(3));
        b.failed(None);
        assert_eq!((b.first_failures, b.last_code), (2, None));
        let t1 = t0 + std::time::Duration::from_secs(1);
        b.ready(t1);
        b.failed(Some(3));
        assert_eq!((b.first_failures, b.last_code), (2, Some(3)));
        assert_eq!((b.ever_ready, b.last_ready_at), (true, t1));
    }
}
