//! What a handler answers ([`Answer`]): status, JSON body (or a v2 JSON header followed by
//! binary data) and the headers that go with it; an [`ApiError`] becomes one through
//! `error.rs`'s table.

use bytes::Bytes;
use http_body_util::Full;
use hyper::StatusCode;
use serde_json::Value;

use crate::error::ApiError;

pub type Body = Full<Bytes>;

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
    /// `WWW-Authenticate` (a 401 of token auth).
    pub challenge: Option<&'static str>,
    /// `Server-Timing` of a model request whose documents were pre-processed: the
    /// pre-processing and the forward pass (W3C Server Timing, milliseconds).
    pub timing: Option<(std::time::Duration, std::time::Duration)>,
    /// Headers of one endpoint's own (`X-Truncated-Inputs` of `/v1/embeddings`).
    pub headers: Vec<(&'static str, hyper::header::HeaderValue)>,
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
            challenge: None,
            timing: None,
            headers: Vec::new(),
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
            challenge: match &e {
                ApiError::Unauthorized(f) => Some(f.challenge()),
                _ => None,
            },
            timing: None,
            headers: Vec::new(),
        }
    }
}

/// `Server-Timing: preprocess;dur=…, forward;dur=…` (milliseconds).
pub fn server_timing((pre, fwd): (std::time::Duration, std::time::Duration)) -> String {
    format!(
        "preprocess;dur={:.3}, forward;dur={:.3}",
        pre.as_secs_f64() * 1e3,
        fwd.as_secs_f64() * 1e3
    )
}

pub fn json_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec())
}

/// OpenAI's error class for a status (`error.type`): the `/v1/` doors and the rerank doors
/// that answer in OpenAI's shape.
pub fn openai_error_type(status: hyper::StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    }
}
