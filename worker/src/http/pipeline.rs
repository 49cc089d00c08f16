//! The one inference pipeline both protocols share: refused at once when it waited past
//! `--max-queue-wait`; counted towards `--max-requests` (retiring the worker when it is the
//! last); its body read within the limits; parsed (off the event loop when large); run on the
//! model thread, bounded by the queue wait and `--request-timeout`; the retire policy after
//! the pass (out of memory, CUDA failure, `--max-worker-gpu-mb`, `--max-worker-memory-mb`). A
//! request that never reached the model is refused with 503 and `Retry-After`, never 504.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::Request;
use vramfork::protocol::RetireReason;

pub use super::deadline::{Deadline, MAX_TIMEOUT_S};
use super::request::{arrival, endpoint_of, read_body, request_id_of};
use crate::access_log::Trace;
use crate::app::App;
use crate::args::{Arg, Inputs};
use crate::documents::DocError;
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::runner::{Encoding, RunError, RunOutput};
use crate::state::Shared;

/// A model request, whatever its protocol (`POST /`, v2 infer): refused at once when it
/// waited past `--max-queue-wait`; counted towards `--max-requests` (retiring the worker
/// when it is the last); its body read and counted as work; parsed by `parse` (on a
/// blocking thread when large) into the model's input, the outputs' encoding and whatever
/// the caller needs to answer; run. Returns the outputs, that extra, and whether this was
/// the worker's last request.
pub async fn model_request<T: Send + 'static>(
    req: Request<Incoming>,
    app: &App,
    parse: impl FnOnce(Vec<u8>) -> Result<Parsed<T>, ApiError> + Send + 'static,
) -> Result<(RunOutput, T, bool), ApiError> {
    let meta = Meta {
        arrived: arrival(&req),
        endpoint: endpoint_of(req.method(), req.uri().path()),
        id: request_id_of(&req).into(),
        trace: req.extensions().get::<Arc<Trace>>().cloned(),
        deadline: Deadline::from_header(req.headers(), arrival(&req))?,
    };
    let refused = meta.refusal(app);
    // From here the worker has the request: reading its body and parsing it are not waiting
    // for a worker, and do not count against --max-queue-wait (a slow upload to an idle
    // worker is not an overload).
    let taken_at = Instant::now();
    if let Some(refused) = refused {
        // Read the (small, usually) body so the refusal is not lost to a reset.
        if let Ok(body) = read_body(req, app.max_body_bytes).await {
            meta.count_body(app, body.len());
        }
        return Err(refused);
    }
    let last = claim(app);
    let body = read_body(req, app.max_body_bytes).await?;
    meta.count_body(app, body.len());
    let size = body.len();
    match work(
        meta,
        body,
        size,
        taken_at,
        last,
        app,
        parse,
        None::<Handoff<'_, ()>>,
    )
    .await?
    {
        Ran::Done(out, extra, last) => Ok((out, extra, last)),
        Ran::HandedOff(()) => unreachable!("a request without a hand-off is never handed off"),
    }
}

/// What the pipeline needs of a model request besides its body, whatever its protocol.
#[derive(Clone)]
pub struct Meta {
    /// When it arrived: for a connection's first request, when it entered the listen queue.
    pub arrived: Instant,
    pub endpoint: Endpoint,
    pub id: Arc<str>,
    /// The access log's record of it, when the log is on.
    pub trace: Option<Arc<Trace>>,
    /// The client's deadline given with its head (`X-Request-Timeout`, `grpc-timeout`).
    pub deadline: Option<Deadline>,
}

impl Meta {
    /// The refusal of a request that has waited past its client's deadline or
    /// `--max-queue-wait` (the client's first: when both have passed, it is what the
    /// client asked).
    pub fn refusal(&self, app: &App) -> Option<ApiError> {
        self.deadline
            .as_ref()
            .and_then(|d| d.refusal(self.arrived))
            .or_else(|| queue_wait_refusal(app, self.arrived))
    }

    /// Counts its body's bytes (`/metrics`, the access log).
    pub fn count_body(&self, app: &App, n: usize) {
        app.count_bytes_in(self.endpoint, n);
        if let Some(t) = &self.trace {
            t.bytes_in(n);
        }
    }
}

/// Takes one model request towards `--max-requests`; when it is the last, retires now, not
/// after the answer: the master starts the replacement while this request runs, and a
/// client that gives up mid-request cannot leave the worker counted out but never retired.
/// Returns whether it was the last.
pub fn claim(app: &App) -> bool {
    let last = app.shared.claim_model_request();
    if last {
        app.shared.retire(RetireReason::MaxRequests);
    }
    last
}

/// How a model request ended when it did not fail.
pub enum Ran<T, H> {
    /// The outputs, the parser's extra, and whether it was the worker's last request.
    Done(RunOutput, T, bool),
    /// Withdrawn before its pass started, for what its hand-off resolved with (a sibling
    /// that showed free).
    HandedOff(H),
}

/// A request whose body (of `size` bytes) has arrived (`taken_at`: when this worker took it,
/// `last`: what [`claim`] said): counted as work while it lives, parsed, pre-processed and
/// run. While it waits for the model, `handoff` (when given, and it is not the worker's last
/// request) resolving withdraws it, if it has not started, and it ends [`Ran::HandedOff`],
/// no longer counted towards `--max-requests`.
#[allow(clippy::too_many_arguments)]
pub async fn work<T: Send + 'static, B: Send + 'static, H>(
    meta: Meta,
    body: B,
    size: usize,
    taken_at: Instant,
    last: bool,
    app: &App,
    parse: impl FnOnce(B) -> Result<Parsed<T>, ApiError> + Send + 'static,
    handoff: Option<Handoff<'_, H>>,
) -> Result<Ran<T, H>, ApiError> {
    let Meta {
        arrived,
        id,
        trace,
        deadline: header_deadline,
        ..
    } = meta;
    // From here on the request is work: this worker takes no new connection until it is
    // answered (a body still arriving did not count).
    let _work = Working::enter(&app.shared);
    // Declared before what the body becomes, so dropped after it, however the request ends.
    let _trim = TrimAfter { app, size };
    let parse = move || parse(body);
    let parsed = if size <= PARSE_INLINE_MAX {
        parse()
    } else {
        tokio::task::spawn_blocking(parse)
            .await
            .map_err(|e| ApiError::BadRequest(format!("could not parse the request body: {e}")))?
    }?;
    // The earlier of the header's deadline and the body's.
    let body_deadline = parsed
        .timeout
        .map(|t| Deadline::after(arrived, t, "parameters.timeout"));
    let deadline = match (header_deadline, body_deadline) {
        (Some(a), Some(b)) => Some(if b.at() < a.at() { b } else { a }),
        (a, b) => a.or(b),
    };
    let mut parsed = parsed;
    let (inputs, preprocess) = preprocess(app, parsed.inputs, deadline.as_ref(), arrived).await?;
    parsed.inputs = inputs;
    let job = Job {
        id,
        input: parsed.inputs,
        encoding: parsed.encoding,
        arrived,
        queue_from: arrived + taken_at.elapsed(),
        deadline,
    };
    let handoff = handoff.filter(|_| !last);
    match run(app, job, trace.as_deref(), handoff).await? {
        Pass::Ran(mut out) => {
            out.preprocess = preprocess;
            Ok(Ran::Done(out, parsed.extra, last))
        }
        Pass::Withdrawn(h) => {
            app.shared.unclaim_model_request();
            Ok(Ran::HandedOff(h))
        }
    }
}

/// What resolves when a request waiting for the model should go elsewhere (with where).
pub type Handoff<'a, H> = std::pin::Pin<Box<dyn std::future::Future<Output = H> + Send + 'a>>;

/// A job's end on the model thread's side.
enum Pass<H> {
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

/// Documents pre-processed (tokenized, decoded) on the pool, off the event loop, under the
/// request's deadlines: `--request-timeout` from the start of the work, and the client's
/// (`deadline`). Past either it stops between documents and the request is answered now.
/// The inputs as the model takes them, and how long that took (`None`: no document input).
/// Inputs holding no documents (no `Strings` or `Blobs` argument) pass as they are: their
/// handler tokenized them itself (`/v1/embeddings`, which counts tokens and takes ids).
async fn preprocess(
    app: &App,
    inputs: Inputs,
    deadline: Option<&Deadline>,
    arrived: Instant,
) -> Result<(Inputs, Option<Duration>), ApiError> {
    let documents = |a: &Arg| matches!(a, Arg::Strings(_) | Arg::Blobs(_));
    let Some(docs) = app
        .documents
        .as_ref()
        .filter(|_| inputs.args.iter().any(documents))
    else {
        return Ok((inputs, None));
    };
    let work = docs.run(
        &app.input_specs,
        inputs,
        deadline.map(|d| d.at()),
        app.request_timeout,
    );
    let (inputs, took) = match work.await {
        Ok(done) => done,
        Err(DocError::Stopped { client: true }) => {
            return Err(deadline.expect("a client deadline").expired(arrived))
        }
        Err(DocError::Stopped { client: false }) => {
            return Err(ApiError::PreprocessTimeout(
                app.request_timeout.as_millis() as u64
            ))
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(m) = &app.metrics {
        m.preprocessed(took);
    }
    Ok((inputs, Some(took)))
}

/// What a protocol's parser makes of a body: the model's input, how to write its outputs,
/// the client's timeout when the body gives one (v2 `parameters.timeout`), and whatever the
/// handler needs to answer.
pub struct Parsed<T> {
    pub inputs: Inputs,
    pub encoding: Encoding,
    pub timeout: Option<Duration>,
    pub extra: T,
}

/// A parsed request on its way to the model.
struct Job {
    id: Arc<str>,
    input: Inputs,
    encoding: Encoding,
    arrived: Instant,
    /// What `--max-queue-wait` counts from: its arrival, moved on by the time this worker
    /// spent reading and parsing its body (so it counts the listen queue and the model
    /// queue only).
    queue_from: Instant,
    deadline: Option<Deadline>,
}

/// The refusal for a request that has waited past `--max-queue-wait`, if it has.
fn queue_wait_refusal(app: &App, arrived: Instant) -> Option<ApiError> {
    let max = app.max_queue_wait?;
    let waited = arrived.elapsed();
    (waited > max).then_some(ApiError::QueueWait {
        waited_ms: waited.as_millis() as u64,
        max_ms: max.as_millis() as u64,
    })
}

/// Bodies larger than this are parsed on a blocking thread, so that the worker's event loop
/// (heartbeats, other connections) never waits long for a parse. 256 KiB of JSON numbers
/// (about 12,000 of 20 characters) parse in about a quarter of a millisecond; below that the
/// hop to another thread and back costs more than it saves: with 64 KiB, a transformer block
/// or 1-D conv net's 85 kB body (4,096 numbers, pass ~0.13 ms) served 4,378–4,968 req/s at
/// c = 4 against 4,943–5,232 inline (2 workers, builds alternating, issue 40).
const PARSE_INLINE_MAX: usize = 256 << 10;

/// Runs one input on the model: waits for the model thread, bounded by `--max-queue-wait`
/// and the client's deadline (both counted from the request's arrival; a request past its
/// deadline never starts, and never joins a batch) and by the model becoming unusable; then
/// for the
/// pass, bounded by `--request-timeout`. A request that never reached the model is refused
/// with 503 and `Retry-After`, never 504.
/// Withdrawn for `handoff` before its pass started: [`Pass::Withdrawn`].
async fn run<H>(
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
    } = job;
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
        waited(app, trace, queue_from.elapsed());
        return finish(app, Some(run), deadline, arrived, trace).map(Pass::Ran);
    }
    let mut ticket = app
        .runner
        .submit(id, input, encoding, deadline.map(|d| d.at()))
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
        waited(app, trace, at.saturating_duration_since(queue_from));
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
                t.ran(out.forward, out.batch, out.inline);
            }
            app.retire_if_grown(out.gpu_reserved);
            Ok(out)
        }
    }
}

/// A request's pass started after it waited `wait` (the listen queue and the model's):
/// into its access-log line and `vramfork_queue_wait_seconds`.
fn waited(app: &App, trace: Option<&Trace>, wait: Duration) {
    if let Some(t) = trace {
        t.started(wait);
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

/// Gives the heap back (`heap::trim`) when a request with an unusually large body ends:
/// answered, or refused once read (a body that is not a valid request, more documents than
/// an input takes). Only the answered ones did before: a refused 48 MB body of 10 million
/// one-letter documents left 275 MB resident in the worker.
struct TrimAfter<'a> {
    app: &'a App,
    size: usize,
}

impl Drop for TrimAfter<'_> {
    fn drop(&mut self) {
        if self.app.body_sizes.unusual(self.size) {
            crate::heap::trim();
        }
    }
}

/// Counts a request as work (`Counters::working`) while it lives (`/v1/embeddings` holds one
/// while it parses and tokenizes, before its passes count their own).
pub struct Working<'a>(&'a Shared);

impl<'a> Working<'a> {
    pub fn enter(shared: &'a Shared) -> Working<'a> {
        shared.update(|c| c.working += 1);
        Working(shared)
    }
}

impl Drop for Working<'_> {
    fn drop(&mut self) {
        self.0.update(|c| c.working -= 1);
    }
}
