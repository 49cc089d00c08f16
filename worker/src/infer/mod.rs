//! The inference core every front door stands on (`POST /` and v2 REST in `http/`, OpenAI's
//! embeddings in `http/openai/`, gRPC in `grpc/`), protocol-free: a door parses its wire
//! format into the model's input ([`Parsed`]) and writes its answer from the outputs; what
//! happens between is one entry, [`Admitted`] (`admitted.rs`): a model request is admitted
//! or refused at once when it waited past `--max-queue-wait` or its client's deadline
//! (`deadline.rs`); counted towards `--max-requests`, retiring the worker when it is the
//! last; counted as work while it lives; parsed (off the event loop when large); its
//! documents pre-processed (`preprocess.rs`); run (`pass.rs`): inline on the event loop or
//! handed to the model thread (batched there, served there by priority lane), bounded by the
//! queue wait, the client's deadline and `--request-timeout`, withdrawn for a sibling when
//! one shows free; then the
//! retire policy after the pass (out of memory, CUDA failure, `--max-worker-gpu-mb`,
//! `--max-worker-memory-mb`), in `pass.rs` too. A request that never reached the model is
//! refused with 503 and `Retry-After`, never 504. What the Open Inference Protocol's two
//! doors share of a request and of the model's description is `v2.rs`. A door imports this
//! module, never the model thread's (`runner/`): what it needs of the outputs is re-exported
//! here.

mod admitted;
pub mod classification;
pub mod deadline;
mod pass;
mod preprocess;
mod text_passes;
pub mod v2;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::app::App;
use crate::args::Inputs;
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::observe::access_log::Trace;
pub use crate::runner::{Encoding, OutTensor, RunError, RunOutput, Wanted};
pub use admitted::{Admitted, Done, Handoff, IntoParsed, Ran, Ranked, Working};
pub use deadline::{Deadline, MAX_TIMEOUT_S};
pub use text_passes::text_passes;

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
    fn refusal(&self, app: &App) -> Option<ApiError> {
        self.deadline
            .as_ref()
            .and_then(|d| d.refusal(self.arrived))
            .or_else(|| queue_wait_refusal(app, self.arrived))
    }

    /// Counts its body's bytes (`/metrics`, the access log): a door calls it for the body
    /// of a request refused before [`Admitted`] took it; an admitted one counts its own
    /// ([`Admitted::received`]).
    pub fn received(&self, app: &App, n: usize) {
        app.count_bytes_in(self.endpoint, n);
        if let Some(t) = &self.trace {
            t.bytes_in(n);
        }
    }
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
    /// The lane it waits for the model in.
    lane: vramfork::lanes::Lane,
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
