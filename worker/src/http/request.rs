//! What every handler reads of a request: when it arrived, its id, the
//! endpoint it is counted under, whether it asks for hwFetch; and the one header of Triton's
//! binary extension both directions use; and its body, within the limits ([`read_body`]).

use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH};
use hyper::{Method, Request};
use serde_json::Value;
use vramfork::auth::ApiKeys;
use vramfork::hwline::wants_hw_fetch;

use crate::app::App;
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::request_id::RequestId;
use crate::timeouts::BODY_READ;

/// Triton's binary tensor data extension: the length of the JSON header of a body that goes
/// on with raw tensor data.
pub const INFERENCE_HEADER: &str = "inference-header-content-length";

/// When a request arrived (a request extension set by the connection): for a connection's
/// first request, when it entered the listen queue; else its first byte.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub Instant);

/// Asks the connection a request came on to close once the answers in flight are out: an
/// HTTP/2 connection's GOAWAY where an HTTP/1.1 answer says `Connection: close` (a request
/// extension set by the connection).
#[derive(Clone)]
pub struct Closer(pub std::sync::Arc<tokio::sync::Notify>);

impl Closer {
    pub fn ask(&self) {
        self.0.notify_one();
    }
}

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

/// When the request arrived (set by the connection), else now.
pub fn arrival(req: &Request<Incoming>) -> Instant {
    req.extensions()
        .get::<Arrived>()
        .map_or_else(Instant::now, |a| a.0)
}

/// The request's `Authorization` header (HTTP) or `authorization` metadata (gRPC) checked
/// against the keys; a refusal is counted in `/metrics` and answered 401 (gRPC
/// UNAUTHENTICATED).
pub fn key_given(keys: &ApiKeys, req: &Request<Incoming>, app: &App) -> Result<(), ApiError> {
    let given = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
    keys.check(given).map_err(|f| {
        if let Some(m) = &app.metrics {
            m.auth_failure(f);
        }
        ApiError::Unauthorized(f)
    })
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
