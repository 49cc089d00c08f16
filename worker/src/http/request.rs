//! What every HTTP handler reads of a request: its id, the endpoint it is counted under,
//! whether it asks for hwFetch; the one header of Triton's binary extension both directions
//! use; its body, within the limits ([`read_body`]); its priority lane from
//! `X-Request-Priority` ([`lane_of`]); and [`admit`] and [`model_request`], an HTTP model
//! request's way into the inference core (`infer/`). What gRPC reads the same way (arrival,
//! key) is `head.rs`.

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::CONTENT_LENGTH;
use hyper::{Method, Request};
use serde_json::Value;
use vramfork::hwline::wants_hw_fetch;
use vramfork::lanes::{self, Lane};

use crate::app::App;
use crate::error::ApiError;
use crate::head::{arrival, hw_line};
use crate::infer::{Admitted, Deadline, Done, IntoParsed, Meta};
use crate::metrics::Endpoint;
use crate::request_id::RequestId;
use crate::timeouts::BODY_READ;

/// Triton's binary tensor data extension: the length of the JSON header of a body that goes
/// on with raw tensor data.
pub const INFERENCE_HEADER: &str = "inference-header-content-length";

/// The `endpoint` label an answer is counted under.
pub fn endpoint_of(method: &Method, path: &str) -> Endpoint {
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
        ("/v1/embeddings", &Method::POST) => Endpoint::Embeddings,
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

/// `Some(line)` when the query asks for hwFetch.
pub fn hw_fetch(query: Option<&str>, app: &App) -> Result<Option<String>, ApiError> {
    if !wants_hw_fetch(query).map_err(|e| ApiError::BadRequest(e.to_string()))? {
        return Ok(None);
    }
    Ok(Some(hw_line(app)))
}

pub fn with_hw(mut body: Value, hw: Option<String>) -> Value {
    if let (Some(line), Value::Object(map)) = (hw, &mut body) {
        map.insert("hwFetch".into(), Value::String(line));
    }
    body
}

/// Reads the whole body into one buffer sized from `Content-Length` (no copy of the whole
/// at the end): refused at once when `Content-Length` is over the limit, and never more than
/// the limit while streaming; bounded in time by [`BODY_READ`].
pub async fn read_body(req: Request<Incoming>, limit: u64) -> Result<Vec<u8>, ApiError> {
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

/// What the core needs of an HTTP model request besides its body: what the service put in
/// its extensions as it came in ([`dispatch::handle`](super::dispatch::handle): its arrival,
/// endpoint, id and record), and the client's deadline from its head.
pub fn meta_of(req: &Request<Incoming>) -> Result<Meta, ApiError> {
    let mut meta = req
        .extensions()
        .get::<Meta>()
        .cloned()
        .unwrap_or_else(|| Meta {
            // Outside the service (never when served): counted under no endpoint, unrecorded.
            arrived: arrival(req),
            endpoint: Endpoint::Other,
            id: "".into(),
            trace: None,
            deadline: None,
        });
    meta.deadline = Deadline::from_header(req.headers(), meta.arrived)?;
    Ok(meta)
}

/// The lane `X-Request-Priority` asks for (`None`: no header): a value that names no lane is
/// a 400 naming the header.
pub fn lane_of(headers: &hyper::HeaderMap) -> Result<Option<Lane>, ApiError> {
    let Some(v) = headers.get(lanes::HEADER) else {
        return Ok(None);
    };
    let bad = || {
        ApiError::BadRequest(format!(
            "header {} must be high, normal or low, not {v:?}",
            lanes::HEADER
        ))
    };
    let v = v.to_str().map_err(|_| bad())?;
    Lane::of_header(v).map(Some).map_err(ApiError::BadRequest)
}

/// An HTTP model request admitted by the core (`infer::Admitted`), claimed towards
/// `--max-requests` (retiring the worker when it is the last), with its body read and
/// counted; or its refusal when it waited past its client's deadline or `--max-queue-wait`
/// (the body read first, so the refusal is not lost to a reset). Its passes wait in the lane
/// `X-Request-Priority` names, unless its body names another.
pub async fn admit(req: Request<Incoming>, app: &App) -> Result<(Admitted<'_>, Vec<u8>), ApiError> {
    let meta = meta_of(&req)?;
    let lane = lane_of(req.headers())?;
    let mut admitted = match Admitted::admit(app, meta) {
        Ok(a) => a,
        Err(r) => return Err(refuse(req, app, &r.meta, r.error).await),
    };
    admitted.prioritize(lane);
    admitted.claim();
    let body = read_body(req, app.max_body_bytes).await?;
    admitted.received(body.len());
    Ok((admitted, body))
}

/// `refused`, once the (small, usually) body is read and counted: a refusal sent before the
/// body is read can be lost to a reset.
pub async fn refuse<E>(req: Request<Incoming>, app: &App, meta: &Meta, refused: E) -> E {
    if let Ok(body) = read_body(req, app.max_body_bytes).await {
        meta.received(app, body.len());
    }
    refused
}

/// A model request, whatever its HTTP protocol (`POST /`, v2 infer): admitted ([`admit`]),
/// parsed by `parse` (on a blocking thread when large) into the model's input, the outputs'
/// encoding and whatever the caller needs to answer, and run.
pub async fn model_request<P: IntoParsed>(
    req: Request<Incoming>,
    app: &App,
    parse: impl FnOnce(Vec<u8>) -> Result<P, ApiError> + Send + 'static,
) -> Result<Done<P::Extra>, ApiError> {
    let (mut admitted, body) = admit(req, app).await?;
    admitted.run(body, parse).await
}
