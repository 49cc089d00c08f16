//! The KServe v2 gRPC service (`inference.GRPCInferenceService`, as NVIDIA's
//! `tritonclient.grpc` and KServe's clients call it) on the serving port, beside HTTP/1.1:
//! a connection that opens with HTTP/2's preface (or negotiates `h2` under TLS) is served
//! by the same hyper service, and a request with `content-type: application/grpc` comes
//! here (`server.rs`).
//!
//! Served: `ServerLive`, `ServerReady`, `ModelReady`, `ServerMetadata`, `ModelMetadata`,
//! `ModelInfer` (raw or typed contents: `infer.rs`) and `ModelStreamInfer` (answered in
//! order on the worker the stream came to: `stream.rs`); Triton's other methods answer
//! `UNIMPLEMENTED`. What REST has, gRPC has the same way: token auth (the `authorization`
//! metadata, `Bearer <key>`; `ServerLive` and `ServerReady` open as the REST health checks),
//! the client's deadline (`grpc-timeout`, and `parameters.timeout`), request ids
//! (`x-request-id` metadata both ways, the answer's `id` when the request gives none),
//! `x-worker-pid` in the initial metadata, the access log, `/metrics` (endpoints
//! `grpc-infer` and `grpc`), and every error from the one table (`error.rs`): its gRPC code
//! ([`ApiError::grpc_code`]), its message in `grpc-message`, its type in `x-error-type` (and
//! `retry-after` where REST sends `Retry-After`). Inference runs through the core every
//! door stands on (`infer/`). A unary `ModelInfer` that would wait here while a
//! sibling is free is handed to it (`siblings/`).

pub mod infer;
pub mod pb;
pub mod stream;
pub mod wire;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode, Version};
use prost::Message;
use tokio::sync::mpsc;

use crate::app::App;
use crate::decode::BodyError;
use crate::error::{ApiError, GrpcCode};
use crate::head::{arrival, hw_line, key_given, Closer};
use crate::infer::v2::{is_ready, EXTENSIONS};
use crate::infer::{Admitted, Done, Handoff, Meta, Ran};
use crate::metrics::Endpoint;
use crate::observe::access_log::{Record, Trace};
use crate::observe::trace_context::{self, TraceContext};
use crate::request_id::{self, RequestId};
use crate::siblings::{Handed, Handing, Reserved, Siblings};
use crate::timeouts::BODY_READ;
use wire::{GrpcBody, Reader};

/// The service's path prefix.
pub const SERVICE: &str = "/inference.GRPCInferenceService/";

/// The methods served.
const SERVED: [&str; 7] = [
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "ModelStreamInfer",
];

/// Open without a key, as REST's health checks.
const OPEN: [&str; 2] = ["ServerLive", "ServerReady"];

/// Marks a request a sibling handed to this worker (set by the link's service): served
/// here, never handed on.
#[derive(Debug, Clone, Copy)]
pub struct HandedIn;

/// Whether a request is a gRPC call: HTTP/2, and `application/grpc…` or the service's path
/// (whatever its content type: one that is not gRPC's is answered as gRPC asks,
/// [`wire::check_request`]).
pub fn is_grpc<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_2
        && (req.uri().path().starts_with(SERVICE)
            || req
                .headers()
                .get(CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(wire::CONTENT_TYPE.as_bytes())))
}

/// One call, as its answer needs it.
#[derive(Clone)]
pub struct Call {
    pub app: Arc<App>,
    pub id: RequestId,
    /// Its W3C trace (`traceparent` metadata, else a new one).
    pub trace_ctx: TraceContext,
    pub arrived: Instant,
    /// The method's path, and its name (empty when not the service's).
    pub path: String,
    pub method: String,
    pub trace: Option<Arc<Trace>>,
    pub handed_in: bool,
}

/// What a method's handler ends with.
pub enum Outcome {
    /// One message (framed), then status OK.
    Message(Bytes),
    /// A stream's answers, as they come (each recorded by the stream).
    Stream(mpsc::Receiver<Frame<Bytes>>),
    Failed(ApiError),
    /// A sibling's answer to the call handed to it (which the sibling recorded).
    Relayed(Response<Incoming>),
}

/// The gRPC service: never fails, every outcome is a gRPC answer.
pub async fn handle(
    req: Request<Incoming>,
    app: Arc<App>,
) -> Result<Response<GrpcBody>, Infallible> {
    let path = req.uri().path().to_string();
    let call = Call {
        id: RequestId::of(req.headers()),
        trace_ctx: app.trace_context(req.headers(), req.uri().path()),
        arrived: arrival(&req),
        method: path.strip_prefix(SERVICE).unwrap_or_default().to_string(),
        path,
        trace: app.records().then(|| Arc::new(Trace::default())),
        handed_in: req.extensions().get::<HandedIn>().is_some(),
        app,
    };
    let closer = req.extensions().get::<Closer>().cloned();
    let checked = wire::check_request(req.headers()).and_then(|()| authorized(&req, &call));
    let outcome = match checked {
        Ok(()) => route(req, &call).await.unwrap_or_else(Outcome::Failed),
        Err(e) => Outcome::Failed(e),
    };
    let resp = call.answer(outcome);
    // Where HTTP/1.1 would answer `Connection: close`: GOAWAY, after what is in flight.
    if let Some(c) = closer.filter(|_| call.app.shared.must_close_multiplexed()) {
        c.ask();
    }
    Ok(resp)
}

/// Token auth on the call's metadata, as REST's on its head.
fn authorized(req: &Request<Incoming>, call: &Call) -> Result<(), ApiError> {
    let app = &call.app;
    let Some(keys) = &app.api_keys else {
        return Ok(());
    };
    if OPEN.contains(&call.method.as_str()) {
        return Ok(());
    }
    key_given(keys, req, app)
}

async fn route(req: Request<Incoming>, call: &Call) -> Result<Outcome, ApiError> {
    let app = &call.app;
    match call.method.as_str() {
        "ServerLive" => {
            unary::<pb::ServerLiveRequest>(req, app, "ServerLiveRequest").await?;
            Ok(reply(&pb::ServerLiveResponse { live: true }))
        }
        "ServerReady" => {
            unary::<pb::ServerReadyRequest>(req, app, "ServerReadyRequest").await?;
            Ok(reply(&pb::ServerReadyResponse {
                ready: is_ready(app),
            }))
        }
        "ModelReady" => {
            let r: pb::ModelReadyRequest = unary(req, app, "ModelReadyRequest").await?;
            infer::check_model(app, &r.name, &r.version)?;
            Ok(reply(&pb::ModelReadyResponse {
                ready: is_ready(app),
            }))
        }
        "ServerMetadata" => {
            unary::<pb::ServerMetadataRequest>(req, app, "ServerMetadataRequest").await?;
            Ok(reply(&pb::ServerMetadataResponse {
                name: "vramfork".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
            }))
        }
        "ModelMetadata" => {
            let r: pb::ModelMetadataRequest = unary(req, app, "ModelMetadataRequest").await?;
            infer::check_model(app, &r.name, &r.version)?;
            Ok(reply(&infer::model_metadata(app)))
        }
        "ModelInfer" => model_infer(req, call).await,
        "ModelStreamInfer" => Ok(stream::start(req, call)?),
        _ if call.path.starts_with(SERVICE) => Err(ApiError::NotImplemented(format!(
            "{} is not served: this server serves {} of inference.GRPCInferenceService (one model, no repository, statistics or shared memory)",
            call.path,
            SERVED.join(", ")
        ))),
        _ => Err(ApiError::NotImplemented(format!(
            "{} is not a method of this server: it serves inference.GRPCInferenceService (KServe v2)",
            call.path
        ))),
    }
}

fn reply(m: &impl Message) -> Outcome {
    Outcome::Message(wire::frame(m))
}

/// A unary call's one message, decoded.
async fn unary<Q: Message + Default>(
    req: Request<Incoming>,
    app: &App,
    what: &str,
) -> Result<Q, ApiError> {
    let framed = Reader::new(req.into_body(), app.max_body_bytes)
        .only(BODY_READ)
        .await?;
    decode(&framed, what)
}

fn decode<Q: Message + Default>(framed: &Bytes, what: &str) -> Result<Q, ApiError> {
    Q::decode(wire::message(framed)).map_err(|e| {
        ApiError::Body(BodyError::Invalid(format!(
            "the request's message is not a valid {what}: {e}"
        )))
    })
}

/// `ModelInfer`: handed to a free sibling at once when it would wait here; else run here,
/// and handed to a sibling that shows free while it waits unstarted.
async fn model_infer(req: Request<Incoming>, call: &Call) -> Result<Outcome, ApiError> {
    let app = &call.app;
    let meta = Meta {
        arrived: call.arrived,
        endpoint: Endpoint::GrpcInfer,
        id: call.id.as_str().into(),
        trace: call.trace.clone(),
        deadline: wire::deadline(req.headers(), call.arrived)?,
    };
    let until = meta.deadline.map(|d| d.at());
    let mut admitted = Admitted::admit(app, meta).map_err(|r| r.error)?;
    let (parts, body) = req.into_parts();
    let framed = Reader::new(body, app.max_body_bytes)
        .only(BODY_READ)
        .await?;
    let request: pb::ModelInferRequest = decode(&framed, "ModelInferRequest")?;
    infer::check_model(app, &request.model_name, &request.model_version)?;
    let siblings = app.siblings.as_ref().filter(|_| !call.handed_in);
    let handing = || Handing {
        path: &call.path,
        headers: &parts.headers,
        id: call.id.as_str(),
        deadline: until,
        framed: framed.clone(),
        traceparent: call.trace_ctx.header(),
    };
    if let Some(s) = siblings.filter(|_| app.shared.would_queue()) {
        if let Some(to) = s.reserve() {
            if let Some(done) = call.handed(s.hand(&to, handing()).await, to.seat) {
                return done;
            }
        }
    }
    admitted.received(framed.len() - 5);
    let mut request = Some(request);
    let mut siblings = siblings;
    loop {
        let r = match request.take() {
            Some(r) => r,
            None => decode(&framed, "ModelInferRequest")?,
        };
        let handoff = siblings.map(|s| Box::pin(s.clone().turn()) as Handoff<'_, Reserved>);
        let (specs, declared) = (app.metadata.inputs.clone(), app.metadata.outputs.clone());
        let parse = move |r| infer::parse(r, specs.as_deref(), declared);
        match admitted.run_or_hand(r, parse, handoff).await? {
            Ran::Done(done) => return Ok(reply(&call.answered(done)?)),
            Ran::HandedOff(to) => {
                let s: &Arc<Siblings> = siblings.expect("a hand-off comes from the siblings");
                if let Some(done) = call.handed(s.hand(&to, handing()).await, to.seat) {
                    return done;
                }
                // Not taken after all: it runs here, without another hand-off.
                siblings = None;
            }
        }
    }
}

impl Call {
    /// A `ModelInfer` that ran, as its answer (with the hwFetch line when asked).
    pub fn answered(&self, done: Done<infer::Asked>) -> Result<pb::ModelInferResponse, ApiError> {
        let app = &self.app;
        let hw = done.extra.hw_fetch.then(|| hw_line(app));
        infer::response(app, done.out, done.extra, self.id.as_str(), hw)
    }
}

impl Call {
    /// A hand-off to `seat`'s end as the call's (`None`: not taken, serve it here); one the
    /// sibling took is this worker's span of the call (`vramfork.handoff.seat`), the parent
    /// of the sibling's, when its trace is sampled (the sibling records the call itself).
    fn handed(&self, h: Handed, seat: u32) -> Option<Result<Outcome, ApiError>> {
        let (status, done) = match h {
            Handed::Answered(resp) => (200, Ok(Outcome::Relayed(resp))),
            Handed::NotTaken => return None,
            Handed::Lost(seat) => {
                let e = ApiError::SiblingLost(seat);
                (e.status().as_u16(), Err(e))
            }
        };
        if let Some(spans) = &self.app.spans {
            spans.handed(
                Record {
                    time: SystemTime::now(),
                    request_id: self.id.as_str().to_string(),
                    context: self.trace_ctx.clone(),
                    method: "POST".into(),
                    target: self.path.clone(),
                    status,
                    bytes_out: 0,
                    total: self.arrived.elapsed(),
                    trace: None,
                },
                seat,
            );
        }
        Some(done)
    }

    fn endpoint(&self) -> Endpoint {
        match self.method.as_str() {
            "ModelInfer" | "ModelStreamInfer" => Endpoint::GrpcInfer,
            _ => Endpoint::Grpc,
        }
    }

    /// The answer to the call, recorded (unless relayed: the sibling recorded it; or a
    /// stream: each of its requests is).
    fn answer(&self, outcome: Outcome) -> Response<GrpcBody> {
        let (status, frames, bytes) = match outcome {
            Outcome::Relayed(r) => return r.map(GrpcBody::Relay),
            Outcome::Stream(rx) => return self.response(GrpcBody::Stream(rx), None),
            Outcome::Message(m) => {
                let n = m.len();
                let frames = VecDeque::from([Frame::data(m), Frame::trailers(ok_trailers())]);
                (200, frames, n)
            }
            Outcome::Failed(e) => {
                self.record(
                    e.status().as_u16(),
                    0,
                    self.arrived,
                    self.trace.clone(),
                    None,
                );
                return self.response(GrpcBody::Frames(VecDeque::new()), Some(&e));
            }
        };
        self.record(status, bytes, self.arrived, self.trace.clone(), None);
        self.response(GrpcBody::Frames(frames), None)
    }

    /// The answer's head: `failed`, a Trailers-Only answer (its status in the head).
    fn response(&self, body: GrpcBody, failed: Option<&ApiError>) -> Response<GrpcBody> {
        let mut resp = Response::new(body);
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(wire::CONTENT_TYPE));
        h.insert("x-worker-pid", self.app.pid.clone());
        h.insert(request_id::HEADER.clone(), self.id.0.clone());
        h.insert(trace_context::HEADER.clone(), self.trace_ctx.header());
        if let Some(state) = self.trace_ctx.state() {
            h.insert(trace_context::STATE.clone(), state.clone());
        }
        h.insert("grpc-accept-encoding", HeaderValue::from_static("identity"));
        if let Some(e) = failed {
            status_headers(h, e);
            if e.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
                *resp.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
            }
        }
        resp
    }

    /// One answer in the access log and `/metrics` (`id`: a stream's request's own).
    pub fn record(
        &self,
        status: u16,
        bytes_out: usize,
        arrived: Instant,
        trace: Option<Arc<Trace>>,
        id: Option<&str>,
    ) {
        if self.app.records() {
            self.app.record(Record {
                time: SystemTime::now(),
                request_id: id.unwrap_or(self.id.as_str()).to_string(),
                context: self.trace_ctx.clone(),
                method: "POST".into(),
                target: self.path.clone(),
                status,
                bytes_out,
                total: arrived.elapsed(),
                trace,
            });
        }
        if let Some(m) = &self.app.metrics {
            m.answered(self.endpoint(), status, bytes_out, arrived.elapsed());
        }
    }
}

/// `grpc-status: 0`.
pub fn ok_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t
}

/// An error's status: its gRPC code, message and type, and `retry-after` where REST sends
/// `Retry-After`.
pub fn status_headers(h: &mut HeaderMap, e: &ApiError) {
    let code: GrpcCode = e.grpc_code();
    h.insert("grpc-status", HeaderValue::from(code as u16));
    h.insert("grpc-message", wire::message_value(&e.to_string()));
    h.insert("x-error-type", HeaderValue::from_static(e.kind()));
    if let Some(s) = e.retry_after() {
        h.insert("retry-after", HeaderValue::from(s));
    }
}
