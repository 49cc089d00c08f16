//! The one entry a door takes into the core: [`Admitted::admit`] refuses a request that
//! waited too long or admits it; the admitted request is claimed towards `--max-requests`,
//! its body counted ([`Admitted::received`]), and run ([`Admitted::run`], or
//! [`Admitted::run_or_hand`] where a sibling may take it instead): counted as work while it
//! lives, parsed (on a blocking thread when large), pre-processed, run. A door with several
//! passes for one request (`/v1/embeddings`) runs each through the same admitted request.
//! Each pass waits for the model in the request's lane ([`Admitted::prioritize`]: the
//! header's, then its body's; a parser gives its body's with [`Ranked`]).

use std::time::Instant;

use vramfork::lanes::Lane;
use vramfork::protocol::RetireReason;

use super::pass::{run, Pass};
use super::preprocess::preprocess;
use super::{Deadline, Job, Meta, Parsed, RunOutput};
use crate::app::App;
use crate::error::ApiError;
use crate::state::Shared;

/// A model request the core took: not refused for its wait, counted towards
/// `--max-requests` once claimed (at the latest when it runs). When it ends, a request with
/// an unusually large body gives the heap back (`heap::trim`): answered, or refused once
/// read (a body that is not a valid request, more documents than an input takes). Only the
/// answered ones did before: a refused 48 MB body of 10 million one-letter documents left
/// 275 MB resident in the worker.
pub struct Admitted<'a> {
    app: &'a App,
    meta: Meta,
    /// When this worker took it: reading and parsing its body are not waiting for a worker,
    /// and do not count against `--max-queue-wait` (a slow upload to an idle worker is not
    /// an overload).
    taken_at: Instant,
    /// What [`claim`] said, once claimed: whether it is the worker's last request.
    last: Option<bool>,
    /// Its body's size, once received.
    size: usize,
    /// The lane its passes wait in.
    lane: Lane,
}

/// What a door's parser makes of a body: a [`Parsed`] request, with the lane its body asks
/// for where the protocol has a field for it ([`Ranked`]).
pub trait IntoParsed: Send + 'static {
    type Extra;
    fn into_parsed(self) -> (Parsed<Self::Extra>, Option<Lane>);
}

impl<T: Send + 'static> IntoParsed for Parsed<T> {
    type Extra = T;
    fn into_parsed(self) -> (Parsed<T>, Option<Lane>) {
        (self, None)
    }
}

/// A parsed request with the lane its body asks for (`None`: it asks none).
pub struct Ranked<T> {
    pub parsed: Parsed<T>,
    pub lane: Option<Lane>,
}

impl<T: Send + 'static> IntoParsed for Ranked<T> {
    type Extra = T;
    fn into_parsed(self) -> (Parsed<T>, Option<Lane>) {
        (self.parsed, self.lane)
    }
}

/// A model request refused before the core took it, with its `meta` to count a body read
/// after the refusal ([`Meta::received`]).
pub struct Refused {
    pub error: ApiError,
    pub meta: Meta,
}

/// How a model request ended when it ran.
pub struct Done<T> {
    pub out: RunOutput,
    /// What the door's parser kept for the answer.
    pub extra: T,
    /// Whether it was the worker's last request (the answer closes its connection).
    pub last: bool,
}

/// How a model request that could be handed off ended when it did not fail.
pub enum Ran<T, H> {
    Done(Done<T>),
    /// Withdrawn before its pass started, for what its hand-off resolved with (a sibling
    /// that showed free); no longer counted towards `--max-requests`.
    HandedOff(H),
}

/// What resolves when a request waiting for the model should go elsewhere (with where).
pub type Handoff<'a, H> = std::pin::Pin<Box<dyn std::future::Future<Output = H> + Send + 'a>>;

impl<'a> Admitted<'a> {
    /// Admits a model request, or refuses it when it waited past its client's deadline or
    /// `--max-queue-wait` (the client's first: when both have passed, it is what the client
    /// asked).
    pub fn admit(app: &'a App, meta: Meta) -> Result<Admitted<'a>, Box<Refused>> {
        if let Some(error) = meta.refusal(app) {
            return Err(Box::new(Refused { error, meta }));
        }
        Ok(Admitted {
            app,
            meta,
            taken_at: Instant::now(),
            last: None,
            size: 0,
            lane: Lane::Normal,
        })
    }

    /// Its passes wait in `lane` (`None`: as they did). A door calls it with the header's
    /// lane, then with its body's, which wins.
    pub fn prioritize(&mut self, lane: Option<Lane>) {
        if let Some(lane) = lane {
            self.lane = lane;
        }
    }

    /// Takes it towards `--max-requests` now (before its body is read: the master starts a
    /// replacement for the worker's last request while it uploads); a no-op once claimed.
    /// Returns whether it is the worker's last.
    pub fn claim(&mut self) -> bool {
        *self.last.get_or_insert_with(|| claim(self.app))
    }

    /// Its body, of `n` bytes, has arrived: counted (`/metrics`, the access log).
    pub fn received(&mut self, n: usize) {
        self.meta.received(self.app, n);
        self.size = n;
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Parses `body` with `parse`, pre-processes its documents and runs it.
    pub async fn run<P: IntoParsed, B: Send + 'static>(
        &mut self,
        body: B,
        parse: impl FnOnce(B) -> Result<P, ApiError> + Send + 'static,
    ) -> Result<Done<P::Extra>, ApiError> {
        match self
            .run_or_hand(body, parse, None::<Handoff<'_, ()>>)
            .await?
        {
            Ran::Done(done) => Ok(done),
            Ran::HandedOff(()) => unreachable!("a request without a hand-off is never handed off"),
        }
    }

    /// Runs an input the door made itself (`/v1/embeddings`' passes of token rows).
    pub async fn run_made<T: Send + 'static>(
        &mut self,
        parsed: Parsed<T>,
    ) -> Result<Done<T>, ApiError> {
        let made = self.go(parsed, Ok, None::<Handoff<'_, ()>>, true);
        match made.await? {
            Ran::Done(done) => Ok(done),
            Ran::HandedOff(()) => unreachable!("a request without a hand-off is never handed off"),
        }
    }

    /// As [`run`](Self::run), and while it waits for the model, `handoff` (when given, and
    /// it is not the worker's last request) resolving withdraws it, if it has not started:
    /// it ends [`Ran::HandedOff`], unclaimed (a later run claims it again).
    pub async fn run_or_hand<P: IntoParsed, B: Send + 'static, H>(
        &mut self,
        body: B,
        parse: impl FnOnce(B) -> Result<P, ApiError> + Send + 'static,
        handoff: Option<Handoff<'_, H>>,
    ) -> Result<Ran<P::Extra, H>, ApiError> {
        let inline = self.size <= PARSE_INLINE_MAX;
        self.go(body, parse, handoff, inline).await
    }

    async fn go<P: IntoParsed, B: Send + 'static, H>(
        &mut self,
        body: B,
        parse: impl FnOnce(B) -> Result<P, ApiError> + Send + 'static,
        handoff: Option<Handoff<'_, H>>,
        parse_inline: bool,
    ) -> Result<Ran<P::Extra, H>, ApiError> {
        let last = self.claim();
        let app = self.app;
        // From here on the request is work: this worker takes no new connection until it is
        // answered (a body still arriving did not count).
        let _work = Working::enter(&app.shared);
        let parse = move || parse(body);
        let (mut parsed, lane) = if parse_inline {
            parse()
        } else {
            tokio::task::spawn_blocking(parse).await.map_err(|e| {
                ApiError::BadRequest(format!("could not parse the request body: {e}"))
            })?
        }?
        .into_parsed();
        self.prioritize(lane);
        let meta = &self.meta;
        // The earlier of the header's deadline and the body's.
        let body_deadline = parsed
            .timeout
            .map(|t| Deadline::after(meta.arrived, t, "parameters.timeout"));
        let deadline = match (meta.deadline, body_deadline) {
            (Some(a), Some(b)) => Some(if b.at() < a.at() { b } else { a }),
            (a, b) => a.or(b),
        };
        let trace = meta.trace.as_deref();
        let (inputs, preprocess) =
            preprocess(app, parsed.inputs, deadline.as_ref(), meta.arrived, trace).await?;
        parsed.inputs = inputs;
        let job = Job {
            id: meta.id.clone(),
            input: parsed.inputs,
            encoding: parsed.encoding,
            arrived: meta.arrived,
            queue_from: meta.arrived + self.taken_at.elapsed(),
            deadline,
            lane: self.lane,
        };
        let handoff = handoff.filter(|_| !last);
        match run(app, job, trace, handoff).await? {
            Pass::Ran(mut out) => {
                out.preprocess = preprocess;
                Ok(Ran::Done(Done {
                    out,
                    extra: parsed.extra,
                    last,
                }))
            }
            Pass::Withdrawn(h) => {
                app.shared.unclaim_model_request();
                self.last = None;
                Ok(Ran::HandedOff(h))
            }
        }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if self.app.body_sizes.unusual(self.size) {
            crate::heap::trim();
        }
    }
}

/// Takes one model request towards `--max-requests`; when it is the last, retires now, not
/// after the answer: the master starts the replacement while this request runs, and a
/// client that gives up mid-request cannot leave the worker counted out but never retired.
/// Returns whether it was the last.
fn claim(app: &App) -> bool {
    let last = app.shared.claim_model_request();
    if last {
        app.shared.retire(RetireReason::MaxRequests);
    }
    last
}

/// Bodies larger than this are parsed on a blocking thread, so that the worker's event loop
/// (heartbeats, other connections) never waits long for a parse. 256 KiB of JSON numbers
/// (about 12,000 of 20 characters) parse in about a quarter of a millisecond; below that the
/// hop to another thread and back costs more than it saves: with 64 KiB, a transformer block
/// or 1-D conv net's 85 kB body (4,096 numbers, pass ~0.13 ms) served 4,378–4,968 req/s at
/// c = 4 against 4,943–5,232 inline (2 workers, builds alternating).
const PARSE_INLINE_MAX: usize = 256 << 10;

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
