//! Running one model request once its input is made: inline on the event loop or handed to
//! the model thread (where the batcher may join it to others), bounded by the queue wait,
//! the client's deadline and `--request-timeout`, withdrawn for a hand-off when one resolves
//! first; then what its outcome means for the worker (the retire decision).

use std::time::{Duration, Instant};

use vramfork::protocol::RetireReason;

use super::{queue_wait_refusal, Deadline, Handoff, Job};
use crate::app::App;
use crate::error::ApiError;
use crate::observe::access_log::Trace;
use crate::runner::{RunError, RunOutput};

/// A job's end on the model thread's side.
pub(super) enum Pass<H> {
    Ran(RunOutput),
    /// Withdrawn unstarted for its hand-off.
    Withdrawn(H),
}

/// Waits for the hand-off, if there is one (else forever).
async fn handed<H>(h: &mut Option<Handoff<'_, H>>) -> H {
    match h {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Runs one input on the model: waits for the model thread, bounded by `--max-queue-wait`
/// and the client's deadline (both counted from the request's arrival; a request past its
/// deadline never starts, and never joins a batch) and by the model becoming unusable; then
/// for the
/// pass, bounded by `--request-timeout`. A request that never reached the model is refused
/// with 503 and `Retry-After`, never 504.
/// Withdrawn for `handoff` before its pass started: [`Pass::Withdrawn`].
pub(super) async fn run<H>(
    app: &App,
    job: Job,
    trace: Option<&Trace>,
    mut handoff: Option<Handoff<'_, H>>,
) -> Result<Pass<H>, ApiError> {
    let Job {
        id,
        input,
        encoding,
        arrived,
        queue_from,
        deadline,
        lane,
    } = job;
    if let Some(t) = trace {
        t.lane(lane);
    }
    if app.shared.get().model_unusable {
        // A forward pass is stuck (or CUDA failed): this one would only queue behind it.
        return Err(unusable(app));
    }
    if let Some(refused) = deadline.and_then(|d| d.refusal(arrived)) {
        return Err(refused);
    }
    // On the event loop (`runner/inline.rs`), unless that would keep other requests here
    // while a sibling idles (a request with a hand-off is a gRPC call: others share its
    // connection).
    let here = app.runner.inlines() && !app.shared.sibling_idle_beside_others(handoff.is_some());
    if let Some(run) = here
        .then(|| app.runner.try_inline(&input, &encoding))
        .flatten()
    {
        waited(app, trace, queue_from.elapsed(), arrived.elapsed());
        return finish(app, Some(run), deadline, arrived, trace).map(Pass::Ran);
    }
    let age_limit = vramfork::lanes::age_limit(app.max_queue_wait);
    let mut ticket = app
        .runner
        .submit(
            id,
            input,
            encoding,
            deadline.map(|d| d.at()),
            (lane, age_limit),
        )
        .await
        .map_err(ApiError::Run)?;
    let claim = ticket.claim();
    let mut watch = app.shared.subscribe();
    let queue_deadline = app.max_queue_wait.map(|m| queue_from + m);
    // Until a refusal finds it started (its withdrawal fails), each of these may still
    // refuse it; nothing tells this task when the pass starts (see `runner`).
    let mut queued = true;
    let has_handoff = handoff.is_some();
    let run = {
        let pass = ticket.result_within(app.request_timeout);
        tokio::pin!(pass);
        loop {
            tokio::select! {
                biased;
                run = &mut pass => break run,
                h = handed(&mut handoff), if queued && has_handoff => {
                    if claim.withdraw() {
                        return Ok(Pass::Withdrawn(h));
                    }
                    queued = false;
                }
                _ = watch.wait_for(|c| c.model_unusable), if queued => {
                    if claim.withdraw() {
                        return Err(unusable(app));
                    }
                    queued = false;
                }
                _ = sleep_until(deadline.map(|d| d.at())), if queued => {
                    if claim.withdraw() {
                        return Err(deadline.expect("a deadline to sleep until").expired(arrived));
                    }
                    queued = false;
                }
                _ = sleep_until(queue_deadline), if queued => {
                    if claim.withdraw() {
                        return Err(queue_wait_refusal(app, queue_from).unwrap_or(ApiError::QueueWait {
                            waited_ms: queue_from.elapsed().as_millis() as u64,
                            max_ms: app.max_queue_wait.unwrap_or_default().as_millis() as u64,
                        }));
                    }
                    queued = false;
                }
            }
        }
    };
    if let Some(at) = claim.started_at() {
        let began = at.saturating_duration_since(arrived);
        waited(app, trace, at.saturating_duration_since(queue_from), began);
    }
    finish(app, run, deadline, arrived, trace).map(Pass::Ran)
}

/// What the model thread's outcome means for the answer and the worker (`None`: its pass ran
/// past `--request-timeout`): retiring after an out-of-memory error or past
/// `--max-worker-gpu-mb`, stopping after a CUDA failure.
fn finish(
    app: &App,
    run: Option<Result<RunOutput, RunError>>,
    deadline: Option<Deadline>,
    arrived: Instant,
    trace: Option<&Trace>,
) -> Result<RunOutput, ApiError> {
    match run {
        None => {
            app.shared.model_stuck();
            Err(ApiError::Timeout(app.request_timeout.as_millis() as u64))
        }
        Some(Err(RunError::Expired)) => Err(deadline
            .map(|d| d.expired(arrived))
            .unwrap_or(ApiError::Run(RunError::Expired))),
        Some(Err(e)) => {
            match &e {
                RunError::OutOfMemory(_) => app.shared.retire(RetireReason::OutOfMemory),
                RunError::CudaFatal(_) => app.shared.cuda_fatal(),
                _ => {}
            }
            Err(ApiError::Run(e))
        }
        Some(Ok(out)) => {
            app.serving_peak.passed();
            if let Some(m) = &app.metrics {
                m.forward(out.forward);
            }
            if let Some(t) = trace {
                t.ran(out.forward, out.batch, out.inline, out.pass.as_ref());
            }
            retire_if_grown(app, out.gpu_reserved);
            Ok(out)
        }
    }
}

/// After a pass that answered: the worker retires (gracefully, no request fails) when its
/// GPU memory grew past `--max-worker-gpu-mb` or its own host memory past
/// `--max-worker-memory-mb`.
fn retire_if_grown(app: &App, gpu_reserved: Option<u64>) {
    if let (Some(limit), Some(reserved)) = (app.max_gpu_bytes, gpu_reserved) {
        // What nvidia-smi shows of it, context included.
        let context = app.gpu_context.load(std::sync::atomic::Ordering::Relaxed);
        if vramfork::protocol::gpu_used(reserved, context) > limit {
            app.shared.retire(RetireReason::GpuMemory);
        }
    }
    let retiring = || app.shared.get().stopping();
    if let Some(limit) = app.max_host_bytes.filter(|_| !retiring()) {
        if let Some(own) = app.own_memory.over(limit) {
            app.shared.retire_with(RetireReason::HostMemory, Some(own));
        }
    }
}

/// A request's pass started after it waited `wait` (the listen queue and the model's),
/// `began` after its arrival: into its access-log line, its spans and
/// `vramfork_queue_wait_seconds`.
fn waited(app: &App, trace: Option<&Trace>, wait: Duration, began: Duration) {
    if let Some(t) = trace {
        t.started(wait, began);
    }
    if let Some(m) = &app.metrics {
        m.waited(wait);
    }
}

/// Why a request cannot reach the model: it is stuck on another request, or CUDA failed and
/// the worker is going away.
fn unusable(app: &App) -> ApiError {
    if app.shared.get().fatal {
        ApiError::Unavailable
    } else {
        ApiError::ModelStuck
    }
}

/// Sleeps until `at` (forever when `None`).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
