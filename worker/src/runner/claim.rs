//! A job's claim (shared by the model thread and the HTTP side: who has the job, when its
//! latest pass started) and the ticket the HTTP side holds while it waits for the answer.
//! One atomic decides between the model thread taking a job and the HTTP side withdrawing
//! it ([`Claim::withdraw`]).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use super::{RunError, RunOutput};

/// A job's claim: who gets it first, the model thread or a withdrawal.
pub(super) const QUEUED: u8 = 0;
pub(super) const STARTED: u8 = 1;
pub(super) const WITHDRAWN: u8 = 2;

/// What the model thread and the HTTP side share about one job: who has it, and when its
/// latest pass started.
#[derive(Default)]
pub struct Claim {
    pub(super) state: AtomicU8,
    /// Set when it is taken, and again when it runs alone after its batch failed, so that
    /// `--request-timeout` counts its own pass.
    started: Mutex<Option<Instant>>,
}

impl Claim {
    /// When its latest pass started; `None` before the model thread took it.
    pub fn started_at(&self) -> Option<Instant> {
        *self.started.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the job back if the model has not started it: `true` means it never runs.
    pub fn withdraw(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, WITHDRAWN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    pub(super) fn start_now(&self) {
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
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
