//! A request on its way to the model thread ([`Job`]) and once the model thread has
//! claimed it ([`Taken`]): what it carries, when it may still run, and how it is answered.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tch::Device;
use tokio::sync::oneshot;

use super::claim::QUEUED;
use super::lanes::Place;
use super::{forward, guarded, Claim, Encoding, Model, RunError, RunOutput};
use crate::args::Inputs;

/// A request sent to the model thread.
pub(super) struct Job {
    /// The request's id (`X-Request-Id`), for the model thread's log lines.
    pub(super) id: Arc<str>,
    pub(super) input: Inputs,
    pub(super) encoding: Encoding,
    /// The client's deadline: past it, the job never starts.
    pub(super) deadline: Option<Instant>,
    /// Its lane, and since when it waits: where it stands in the queue.
    pub(super) place: Place,
    pub(super) claim: Arc<Claim>,
    pub(super) reply: oneshot::Sender<Result<RunOutput, RunError>>,
}

/// A job the model thread has claimed: it runs.
pub(super) struct Taken {
    pub(super) id: Arc<str>,
    pub(super) input: Inputs,
    pub(super) encoding: Encoding,
    /// Its rows, when it is part of a batch.
    pub(super) rows: usize,
    pub(super) claim: Arc<Claim>,
    pub(super) reply: oneshot::Sender<Result<RunOutput, RunError>>,
}

impl Taken {
    /// Its own pass starts now (a re-run after a failed batch).
    pub(super) fn restart(&self) {
        self.claim.start_now();
    }

    /// Runs it on a pass of its own and answers it.
    pub(super) fn run_alone(self, module: &Model, device: Device) {
        // The `request` span only when the one line logged inside it (`forward`, at debug)
        // is on: at the default level the span cost every request its fields formatted.
        let _span = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| tracing::info_span!("request", request_id = %self.id).entered());
        let result = guarded(|| forward(module, device, &self.input, &self.encoding));
        self.answer(result);
    }

    /// Sends its outcome, freeing its input first, so that what the request used is gone by
    /// the time its answer is out (and a trim after it can give the memory back).
    pub(super) fn answer(self, result: Result<RunOutput, RunError>) {
        let Taken { input, reply, .. } = self;
        drop(input);
        let _ = reply.send(result);
    }
}

impl Job {
    /// Whether it may still run: not withdrawn, its client still waits, and its client's
    /// deadline has not passed.
    pub(super) fn live(&self) -> bool {
        self.claim.state.load(Ordering::SeqCst) == QUEUED
            && !self.reply.is_closed()
            && self.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Claims the job for the model (telling its ticket it started); `None` when it was
    /// withdrawn, its client is gone or its deadline passed: it never runs (and a job past
    /// its deadline is answered [`RunError::Expired`], so it never joins a batch either).
    pub(super) fn take(self) -> Option<Taken> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            if self.claim.withdraw() {
                let _ = self.reply.send(Err(RunError::Expired));
            }
            return None;
        }
        if !self.claim.take() || self.reply.is_closed() {
            return None;
        }
        self.claim.start_now();
        Some(Taken {
            id: self.id,
            input: self.input,
            encoding: self.encoding,
            rows: 0,
            claim: self.claim,
            reply: self.reply,
        })
    }
}
