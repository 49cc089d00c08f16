//! A job's claim (shared by the model thread and the HTTP side: who has the job, when its
//! latest pass started) and the ticket the HTTP side holds while it waits for the answer.
//! One atomic decides between the model thread taking a job and the HTTP side withdrawing
//! it ([`Claim::withdraw`]). The runner's count of jobs still queued ([`Queued`]) follows
//! the claims: one more when a job is submitted, one less when it leaves the queue (taken,
//! withdrawn, or dropped untaken), by the lane it waits in.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;
use vramfork::lanes::{Lane, LANES};

use super::{RunError, RunOutput};

/// A job's claim: who gets it first, the model thread or a withdrawal.
pub(super) const QUEUED: u8 = 0;
pub(super) const STARTED: u8 = 1;
pub(super) const WITHDRAWN: u8 = 2;

/// Jobs submitted to the model thread that it has not taken yet, by lane: what `/metrics`
/// shows as the worker's model queue. Cheap to clone (shared counters).
#[derive(Clone, Default)]
pub struct Queued(Arc<[AtomicU32; LANES.len()]>);

impl Queued {
    /// All lanes.
    pub fn get(&self) -> u32 {
        self.lanes().iter().sum()
    }

    /// By lane, highest first ([`LANES`]).
    pub fn lanes(&self) -> [u32; LANES.len()] {
        LANES.map(|l| self.0[l.index()].load(Ordering::Relaxed))
    }
}

/// What the model thread and the HTTP side share about one job: who has it, and when its
/// latest pass started.
pub struct Claim {
    pub(super) state: AtomicU8,
    /// Set when it is taken, and again when it runs alone after its batch failed, so that
    /// `--request-timeout` counts its own pass.
    started: Mutex<Option<Instant>>,
    /// The count it is in while it is queued.
    queued: Queued,
    lane: Lane,
}

impl Claim {
    /// A job's claim, counted in `queued` under `lane` until it leaves the queue.
    pub(super) fn queued(queued: &Queued, lane: Lane) -> Claim {
        queued.0[lane.index()].fetch_add(1, Ordering::Relaxed);
        Claim {
            state: AtomicU8::new(QUEUED),
            started: Mutex::new(None),
            queued: queued.clone(),
            lane,
        }
    }

    /// Moves it out of the queue to `to` (started or withdrawn) if it is still queued:
    /// `true` when this call moved it.
    fn leave_queue(&self, to: u8) -> bool {
        let moved = self
            .state
            .compare_exchange(QUEUED, to, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if moved {
            self.queued.0[self.lane.index()].fetch_sub(1, Ordering::Relaxed);
        }
        moved
    }

    /// Claims it for the model thread: `false` when it was withdrawn first.
    pub(super) fn take(&self) -> bool {
        self.leave_queue(STARTED)
    }

    /// When its latest pass started; `None` before the model thread took it.
    pub fn started_at(&self) -> Option<Instant> {
        *self.started.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the job back if the model has not started it: `true` means it never runs.
    pub fn withdraw(&self) -> bool {
        self.leave_queue(WITHDRAWN)
    }

    pub(super) fn start_now(&self) {
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
}

impl Drop for Claim {
    /// A job dropped while still queued (its client gone, the model thread ended) leaves
    /// the count too.
    fn drop(&mut self) {
        self.leave_queue(WITHDRAWN);
    }
}

/// A submitted job, as the HTTP side holds it.
pub struct Ticket {
    pub(super) claim: Arc<Claim>,
    pub(super) reply: oneshot::Receiver<Result<RunOutput, RunError>>,
}

impl Ticket {
    /// Its claim: to withdraw it, or to read when its pass started, while
    /// [`Ticket::result_within`] waits.
    pub fn claim(&self) -> Arc<Claim> {
        self.claim.clone()
    }

    /// The job's outcome, or `None` when its pass ran past `limit`. The limit counts from
    /// the start of the job's latest pass (a request run again alone after its batch failed
    /// gets the whole limit for its own pass). Nothing wakes this when a pass starts: a pass
    /// cannot run past `limit` before `limit` has passed from now, so the timer is set that
    /// far and, when it fires, set again from the start the model thread wrote.
    pub async fn result_within(
        &mut self,
        limit: std::time::Duration,
    ) -> Option<Result<RunOutput, RunError>> {
        let mut at = self.claim.started_at().unwrap_or_else(Instant::now) + limit;
        loop {
            tokio::select! {
                r = &mut self.reply => {
                    return Some(r.map_err(|_| RunError::Gone).and_then(|r| r));
                }
                _ = tokio::time::sleep_until(at.into()) => {
                    let now = Instant::now();
                    match self.claim.started_at() {
                        Some(since) if since + limit <= now => return None,
                        Some(since) => at = since + limit,
                        None => at = now + limit,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queued_count_follows_each_job_until_it_leaves_the_queue() {
        let q = Queued::default();
        let (taken, withdrawn, dropped) = (
            Claim::queued(&q, Lane::High),
            Claim::queued(&q, Lane::Low),
            Arc::new(Claim::queued(&q, Lane::Low)),
        );
        assert_eq!(q.get(), 3);
        assert_eq!(q.lanes(), [1, 0, 2]);
        assert!(taken.take());
        assert_eq!(q.get(), 2, "the model thread took one");
        assert!(!taken.withdraw(), "a started job cannot be withdrawn");
        assert_eq!(q.get(), 2);
        assert_eq!(q.lanes(), [0, 0, 2], "by the lane it waited in");
        assert!(withdrawn.withdraw());
        assert!(!withdrawn.take(), "a withdrawn job is never taken");
        assert_eq!(q.get(), 1);
        let other = dropped.clone();
        drop(dropped);
        assert_eq!(q.get(), 1, "still queued while one holder has it");
        drop(other);
        assert_eq!(q.get(), 0, "dropped untaken");
        drop((taken, withdrawn));
        assert_eq!(q.get(), 0, "taken and withdrawn jobs had left already");
    }
}
