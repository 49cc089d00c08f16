//! The HTTP API (SPEC section 8): `GET /` metadata, `POST /` inference, `GET /healthz`, with
//! hwFetch, body limits and the request timeout. Every answer is JSON and carries
//! `X-Worker-Pid`; errors come from the table in `error.rs`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;
use vramfork::hwline::wants_hw_fetch;
use vramfork::metadata::AppMetadata;
use vramfork::protocol::RetireReason;

use crate::error::ApiError;
use crate::hw::Hw;
use crate::input::{parse_request, Inputs};
use crate::metrics::{Endpoint, Recorder};
use crate::request_id::{self, RequestId};
use crate::runner::{Encoding, RunError, RunOutput, Runner};
use crate::state::Shared;
use crate::timeouts::BODY_READ;

pub type Body = Full<Bytes>;

/// Triton's binary tensor data extension: the length of the JSON header of a body that goes
/// on with raw tensor data.
pub const INFERENCE_HEADER: &str = "inference-header-content-length";

/// When a request arrived (a request extension set by the connection): for a connection's
/// first request, when it entered the listen queue; else its first byte.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub Instant);

/// Everything a request needs, shared by all connections.
pub struct App {
    pub shared: Arc<Shared>,
    pub runner: Runner,
    pub metadata: AppMetadata,
    pub hw: Hw,
    pub max_body_bytes: u64,
    pub request_timeout: Duration,
    /// Refuse (503) a request that waited longer than this before the model took it.
    pub max_queue_wait: Option<Duration>,
    /// Retire after a request that leaves the allocator above this many bytes.
    pub max_gpu_bytes: Option<u64>,
    /// What `/metrics` counts, when it is on.
    pub metrics: Option<Recorder>,
    /// The plan's footprint figures, when it was made from a measurement (`GET /`).
    pub footprint: Option<vramfork::protocol::FootprintFigures>,
    /// The body sizes seen, to hand memory back after an unusually large one.
    pub body_sizes: crate::heap::BodySizes,
    pid: HeaderValue,
}

impl App {
    pub fn new(
        shared: Arc<Shared>,
        runner: Runner,
        metadata: AppMetadata,
        hw: Hw,
        cfg: &vramfork::protocol::WorkerConfig,
    ) -> App {
        App {
            shared,
            runner,
            metadata,
            hw,
            max_body_bytes: cfg.max_body_bytes,
            request_timeout: Duration::from_millis(cfg.request_timeout_ms),
            max_queue_wait: (cfg.max_queue_wait_ms > 0)
                .then(|| Duration::from_millis(cfg.max_queue_wait_ms)),
            max_gpu_bytes: cfg.max_worker_gpu_mb.map(|mb| mb.saturating_mul(1 << 20)),
            metrics: cfg.metrics.is_some().then(Recorder::default),
            footprint: cfg.footprint,
            body_sizes: crate::heap::BodySizes::default(),
            pid: HeaderValue::from(std::process::id()),
        }
    }
}

impl App {
    /// Counts a model request's body bytes for `/metrics`.
    fn count_bytes_in(&self, endpoint: Endpoint, n: usize) {
        if let Some(m) = &self.metrics {
            m.bytes_in(endpoint, n);
        }
    }
}

/// An answer plus whether the connection must close after it.
pub struct Answer {
    pub status: StatusCode,
    /// JSON text (for a v2 answer with binary outputs: the JSON header, then the data).
    pub body: Vec<u8>,
    pub close: bool,
    pub allow: Option<&'static str>,
    pub retry_after: Option<u32>,
    /// `Inference-Header-Content-Length`: the length of the JSON header of a v2 answer
    /// whose body goes on with binary data.
    pub header_len: Option<usize>,
}

impl Answer {
    pub fn ok(body: Value) -> Answer {
        Answer::with(StatusCode::OK, json_bytes(&body))
    }

    /// A health check's answer from a worker that retires (or stops): 503, try another
    /// worker at once, and this connection closes.
    pub fn retiring(body: Value) -> Answer {
        let mut a = Answer::with(StatusCode::SERVICE_UNAVAILABLE, json_bytes(&body));
        a.close = true;
        a.retry_after = Some(0);
        a
    }

    pub fn with(status: StatusCode, body: Vec<u8>) -> Answer {
        Answer {
            status,
            body,
            close: false,
            allow: None,
            retry_after: None,
            header_len: None,
        }
    }
}

impl From<ApiError> for Answer {
    fn from(e: ApiError) -> Answer {
        Answer {
            status: e.status(),
            body: json_bytes(&e.body()),
            close: e.closes_connection(),
            allow: match &e {
                ApiError::MethodNotAllowed { allow, .. } => Some(allow),
                _ => None,
            },
            retry_after: e.retry_after(),
            header_len: None,
        }
    }
}

/// The hyper service: never fails, every outcome is an HTTP answer.
pub async fn handle(
    mut req: Request<Incoming>,
    app: Arc<App>,
) -> Result<Response<Body>, Infallible> {
    let endpoint = endpoint_of(req.method(), req.uri().path());
    let arrived = arrival(&req);
    let id = RequestId::of(req.headers());
    req.extensions_mut().insert(id.clone());
    let answer = route(req, &app).await.unwrap_or_else(Answer::from);
    if let Some(m) = &app.metrics {
        m.answered(
            endpoint,
            answer.status.as_u16(),
            answer.body.len(),
            arrived.elapsed(),
        );
    }
    let mut resp = Response::new(Full::new(Bytes::from(answer.body)));
    *resp.status_mut() = answer.status;
    let h = resp.headers_mut();
    match answer.header_len {
        None => h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json")),
        Some(n) => {
            h.insert(INFERENCE_HEADER, HeaderValue::from(n));
            h.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )
        }
    };
    h.insert("x-worker-pid", app.pid.clone());
    h.insert(request_id::HEADER.clone(), id.0);
    if let Some(allow) = answer.allow {
        h.insert(ALLOW, HeaderValue::from_static(allow));
    }
    if let Some(s) = answer.retry_after {
        h.insert(RETRY_AFTER, HeaderValue::from(s));
    }
    if answer.close || app.shared.must_close() {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(resp)
}

/// The `endpoint` label an answer is counted under.
fn endpoint_of(method: &Method, path: &str) -> Endpoint {
    if path == "/v2" || path.starts_with("/v2/") {
        return if method == Method::POST && path.ends_with("/infer") {
            Endpoint::V2Infer
        } else {
            Endpoint::V2
        };
    }
    match (path, method) {
        ("/", &Method::POST) => Endpoint::Infer,
        ("/", &Method::GET) => Endpoint::Metadata,
        ("/healthz", &Method::GET) => Endpoint::Health,
        _ => Endpoint::Other,
    }
}

/// The request's id ([`handle`] puts it in the extensions); empty outside `handle`.
pub fn request_id_of(req: &Request<Incoming>) -> String {
    req.extensions()
        .get::<RequestId>()
        .map(|i| i.as_str().to_string())
        .unwrap_or_default()
}

/// When the request arrived (set by the connection), else now.
pub fn arrival(req: &Request<Incoming>) -> Instant {
    req.extensions()
        .get::<Arrived>()
        .map_or_else(Instant::now, |a| a.0)
}

async fn route(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (path.as_str(), &method) {
        ("/", &Method::GET) => {
            let hw = hw_fetch(req.uri().query(), app)?;
            let mut doc = app.metadata.raw.clone();
            if let Some(f) = &app.footprint {
                // The measured footprint beside the declared one (`--profile-memory`).
                doc.insert(
                    "gpu_footprint_mb".into(),
                    serde_json::json!({
                        "declared": f.declared_mb,
                        "measured": f.measured_mb,
                        "planned": f.planned_mb,
                    }),
                );
            }
            Ok(Answer::ok(with_hw(Value::Object(doc), hw)))
        }
        ("/", &Method::POST) => infer(req, app).await,
        ("/healthz", &Method::GET) => Ok(health(app)),
        (p, _) if p == "/v2" || p.starts_with("/v2/") => crate::v2::route(req, app).await,
        ("/", _) => Err(not_allowed(&method, &path, "GET, POST")),
        ("/healthz", _) => Err(not_allowed(&method, &path, "GET")),
        _ => Err(ApiError::NotFound(format!("{method} {path}"))),
    }
}

pub fn json_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec())
}

pub fn not_allowed(method: &Method, path: &str, allow: &'static str) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: path.to_string(),
        allow,
    }
}

fn health(app: &App) -> Answer {
    if app.shared.get().stopping() {
        Answer::retiring(serde_json::json!({"status": "retiring"}))
    } else {
        Answer::ok(serde_json::json!({"status": "ok"}))
    }
}

/// `Some(line)` when the query asks for hwFetch.
pub fn hw_fetch(query: Option<&str>, app: &App) -> Result<Option<String>, ApiError> {
    if !wants_hw_fetch(query).map_err(|e| ApiError::BadRequest(e.to_string()))? {
        return Ok(None);
    }
    Ok(Some(app.hw.line().unwrap_or_else(|e| {
        tracing::warn!("hwFetch: {e}");
        format!("unavailable: {e}")
    })))
}

fn with_hw(mut body: Value, hw: Option<String>) -> Value {
    if let (Some(line), Value::Object(map)) = (hw, &mut body) {
        map.insert("hwFetch".into(), Value::String(line));
    }
    body
}

async fn infer(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let hw_wanted =
        wants_hw_fetch(req.uri().query()).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let specs = app.metadata.inputs.clone();
    let (out, (), last) = model_request(req, app, move |body| {
        parse_request(&body, specs.as_deref())
            .map(|input| (input, Encoding::Json, ()))
            .map_err(|e| ApiError::BadRequest(e.to_string()))
    })
    .await?;
    let outputs = out.outputs;
    // {"outputs": <written by the runner>[, "hwFetch": "<line>"]}
    let mut body = Vec::with_capacity(outputs.len() + 64);
    body.extend_from_slice(b"{\"outputs\":");
    body.extend_from_slice(&outputs);
    drop(outputs);
    if hw_wanted {
        if let Some(line) = hw_fetch(Some("hwFetch"), app)? {
            body.extend_from_slice(b",\"hwFetch\":");
            body.extend_from_slice(&json_bytes(&Value::String(line)));
        }
    }
    body.push(b'}');
    let mut answer = Answer::with(StatusCode::OK, body);
    answer.close = last;
    Ok(answer)
}

/// A model request, whatever its protocol (`POST /`, v2 infer): refused at once when it
/// waited past `--max-queue-wait`; counted towards `--max-requests` (retiring the worker
/// when it is the last); its body read and counted as work; parsed by `parse` (on a
/// blocking thread when large) into the model's input, the outputs' encoding and whatever
/// the caller needs to answer; run. Returns the outputs, that extra, and whether this was
/// the worker's last request.
pub async fn model_request<T: Send + 'static>(
    req: Request<Incoming>,
    app: &App,
    parse: impl FnOnce(Vec<u8>) -> Result<(Inputs, Encoding, T), ApiError> + Send + 'static,
) -> Result<(RunOutput, T, bool), ApiError> {
    let arrived = arrival(&req);
    let endpoint = endpoint_of(req.method(), req.uri().path());
    let id: Arc<str> = request_id_of(&req).into();
    if let Some(refused) = queue_wait_refusal(app, arrived) {
        // Read the (small, usually) body so the refusal is not lost to a reset.
        if let Ok(body) = read_body(req, app.max_body_bytes).await {
            app.count_bytes_in(endpoint, body.len());
        }
        return Err(refused);
    }
    let last = app.shared.claim_model_request();
    if last {
        // Retire now, not after the answer: the master starts the replacement while this
        // request runs, and a client that gives up mid-request cannot leave the worker
        // counted out but never retired.
        app.shared.retire(RetireReason::MaxRequests);
    }
    let body = read_body(req, app.max_body_bytes).await?;
    app.count_bytes_in(endpoint, body.len());
    // From here on the request is work: this worker takes no new connection until it is
    // answered (a body still arriving did not count).
    let _work = Working::enter(&app.shared);
    let size = body.len();
    let parse = move || parse(body);
    let (input, encoding, extra) = if size <= PARSE_INLINE_MAX {
        parse()
    } else {
        tokio::task::spawn_blocking(parse)
            .await
            .map_err(|e| ApiError::BadRequest(format!("could not parse the request body: {e}")))?
    }?;
    let out = run(app, id, input, encoding, arrived).await;
    if app.body_sizes.unusual(size) {
        crate::heap::trim();
    }
    Ok((out?, extra, last))
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
/// (heartbeats, other connections) never waits for a parse.
const PARSE_INLINE_MAX: usize = 64 << 10;

/// Runs one input on the model: waits for the model thread, bounded by `--max-queue-wait`
/// (counted from the request's arrival) and by the model becoming unusable; then for the
/// pass, bounded by `--request-timeout`. A request that never reached the model is refused
/// with 503 and `Retry-After`, never 504.
async fn run(
    app: &App,
    id: Arc<str>,
    input: Inputs,
    encoding: Encoding,
    arrived: Instant,
) -> Result<RunOutput, ApiError> {
    if app.shared.get().model_unusable {
        // A forward pass is stuck (or CUDA failed): this one would only queue behind it.
        return Err(unusable(app));
    }
    let mut ticket = app
        .runner
        .submit(id, input, encoding)
        .await
        .map_err(ApiError::Run)?;
    let mut watch = app.shared.subscribe();
    let queue_deadline = app.max_queue_wait.map(|m| arrived + m);
    tokio::select! {
        _ = ticket.started() => {}
        _ = watch.wait_for(|c| c.model_unusable) => {
            if ticket.withdraw() {
                return Err(unusable(app));
            }
        }
        _ = sleep_until(queue_deadline) => {
            if ticket.withdraw() {
                return Err(queue_wait_refusal(app, arrived).unwrap_or(ApiError::QueueWait {
                    waited_ms: arrived.elapsed().as_millis() as u64,
                    max_ms: app.max_queue_wait.unwrap_or_default().as_millis() as u64,
                }));
            }
        }
    }
    // Started (the withdrawals above failed only because it had): the pass is timed.
    let run = ticket.result_within(app.request_timeout).await;
    match run {
        None => {
            app.shared.model_stuck();
            Err(ApiError::Timeout(app.request_timeout.as_millis() as u64))
        }
        Some(Err(e)) => {
            match &e {
                RunError::OutOfMemory(_) => app.shared.retire(RetireReason::OutOfMemory),
                RunError::CudaFatal(_) => app.shared.cuda_fatal(),
                _ => {}
            }
            Err(ApiError::Run(e))
        }
        Some(Ok(out)) => {
            if let Some(m) = &app.metrics {
                m.forward(out.forward);
            }
            if let (Some(limit), Some(used)) = (app.max_gpu_bytes, out.gpu_reserved) {
                if used > limit {
                    app.shared.retire(RetireReason::GpuMemory);
                }
            }
            Ok(out)
        }
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

/// Counts a request as work (`Counters::working`) while it lives.
struct Working<'a>(&'a Shared);

impl<'a> Working<'a> {
    fn enter(shared: &'a Shared) -> Working<'a> {
        shared.update(|c| c.working += 1);
        Working(shared)
    }
}

impl Drop for Working<'_> {
    fn drop(&mut self) {
        self.0.update(|c| c.working -= 1);
    }
}

/// Reads the whole body into one buffer sized from `Content-Length` (no copy of the whole
/// at the end): refused at once when `Content-Length` is over the limit, and never more than
/// the limit while streaming; bounded in time by [`BODY_READ`].
async fn read_body(req: Request<Incoming>, limit: u64) -> Result<Vec<u8>, ApiError> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::TooLarge { limit });
    }
    let mut body = req.into_body();
    let mut buf = Vec::with_capacity(declared.unwrap_or(0) as usize);
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::BadRequest(format!("could not read the request body: {e}"))
            })?;
            if let Ok(data) = frame.into_data() {
                if (buf.len() + data.len()) as u64 > limit {
                    return Err(ApiError::TooLarge { limit });
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(BODY_READ, read).await {
        Err(_) => Err(ApiError::BodyTimeout(BODY_READ.as_secs())),
        Ok(Err(e)) => Err(e),
        Ok(Ok(())) => Ok(buf),
    }
}
