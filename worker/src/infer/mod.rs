//! The inference core every front door stands on (`POST /` and v2 REST in `http/`, OpenAI's
//! embeddings in `http/openai/`, gRPC in `grpc/`), protocol-free: a door parses its wire
//! format into the model's input ([`Parsed`]) and writes its answer from the outputs; what
//! happens between is here. A model request is refused at once when it waited past
//! `--max-queue-wait` or its client's deadline ([`Meta::refusal`], `deadline.rs`); counted
//! towards `--max-requests`, retiring the worker when it is the last ([`claim`]); counted as
//! work while it lives; parsed (off the event loop when large); its documents pre-processed;
//! run ([`work`], `pass.rs`): inline on the event loop or handed to the model thread (batched
//! there), bounded by the queue wait, the client's deadline and `--request-timeout`, withdrawn
//! for a sibling when one shows free; then the retire policy after the pass (out of memory,
//! CUDA failure, `--max-worker-gpu-mb`, `--max-worker-memory-mb`). A request that never
//! reached the model is refused with 503 and `Retry-After`, never 504. What the Open Inference
//! Protocol's two doors share of a request and of the model's description is `v2.rs`.

pub mod deadline;
mod pass;
pub mod v2;

use std::sync::Arc;
use std::time::{Duration, Instant};

use vramfork::protocol::RetireReason;

use crate::app::App;
use crate::args::{Arg, Inputs};
use crate::documents::DocError;
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::observe::access_log::{Preprocess, Trace};
use crate::runner::{Encoding, RunOutput};
use crate::state::Shared;
pub use deadline::{Deadline, MAX_TIMEOUT_S};
use pass::{run, Pass};

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
    let (inputs, preprocess) = preprocess(
        app,
        parsed.inputs,
        deadline.as_ref(),
        arrived,
        trace.as_deref(),
    )
    .await?;
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

/// Documents pre-processed (tokenized, decoded) on the pool, off the event loop, under the
/// request's deadlines: `--request-timeout` from the start of the work, and the client's
/// (`deadline`). Past either it stops between documents and the request is answered now.
/// The inputs as the model takes them, and how long that took (`None`: no document input).
/// Inputs holding no documents (no `Strings` or `Blobs` argument) pass as they are: their
/// handler tokenized them itself (`/v1/embeddings`, which counts tokens and takes ids).
/// The work's start, length and document counts go in the request's `trace` (its
/// `preprocess` span).
async fn preprocess(
    app: &App,
    inputs: Inputs,
    deadline: Option<&Deadline>,
    arrived: Instant,
    trace: Option<&Trace>,
) -> Result<(Inputs, Option<Duration>), ApiError> {
    let documents = |a: &Arg| matches!(a, Arg::Strings(_) | Arg::Blobs(_));
    let Some(docs) = app
        .documents
        .as_ref()
        .filter(|_| inputs.args.iter().any(documents))
    else {
        return Ok((inputs, None));
    };
    let (texts, images) = docs.counts(&inputs);
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
    if let Some(t) = trace {
        t.preprocessed(Preprocess {
            after: crate::observe::access_log::work_began_after(arrived, took),
            took,
            texts,
            images,
        });
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
pub(crate) fn queue_wait_refusal(app: &App, arrived: Instant) -> Option<ApiError> {
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
/// c = 4 against 4,943–5,232 inline (2 workers, builds alternating).
const PARSE_INLINE_MAX: usize = 256 << 10;

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
