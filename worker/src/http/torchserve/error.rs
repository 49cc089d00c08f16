//! Errors in TorchServe's shape, `{"code": N, "type": "...", "message": "..."}`, for every
//! answer on its paths: the door's own refusals (an unknown model or version) and every
//! error the rest of the server gives, each with the status, `Retry-After` and connection
//! close the server's own table gives it. `type` is TorchServe's exception name for the
//! status.

use hyper::StatusCode;
use serde_json::json;

use crate::error::ApiError;
use crate::http::answer::{json_bytes, Answer};

/// An error answered in TorchServe's shape.
#[derive(Debug)]
pub struct TsError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    /// The server's own error it was, whose answer's headers it keeps.
    api: Option<Box<ApiError>>,
}

impl TsError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> TsError {
        TsError {
            status,
            kind,
            message: message.into(),
            api: None,
        }
    }

    /// The message, followed by what does the same here.
    pub fn hint(mut self, instead: &str) -> TsError {
        self.message = format!("{}: {instead}", self.message);
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"code": self.status.as_u16(), "type": self.kind, "message": self.message})
    }

    /// The answer: the body in TorchServe's shape; for a server error, its own answer's
    /// headers and connection close.
    pub fn answer(self) -> Answer {
        let body = json_bytes(&self.body());
        match self.api {
            Some(api) => {
                let mut a = Answer::from(*api);
                a.body = body;
                a
            }
            None => Answer::with(self.status, body),
        }
    }
}

/// TorchServe's exception name for a status.
fn exception(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 415 => "BadRequestException",
        401 | 403 => "InvalidKeyException",
        404 => "ModelNotFoundException",
        405 => "MethodNotAllowedException",
        408 | 504 => "RequestTimeoutException",
        413 => "RequestEntityTooLargeException",
        503 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

impl From<ApiError> for TsError {
    fn from(e: ApiError) -> TsError {
        let status = e.status();
        TsError {
            status,
            kind: exception(status),
            message: e.to_string(),
            api: Some(Box::new(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_keep_their_status_and_headers_in_torchserves_shape() {
        let a = TsError::from(ApiError::QueueWait {
            waited_ms: 12,
            max_ms: 10,
        })
        .answer();
        assert_eq!(
            (a.status.as_u16(), a.retry_after, a.close),
            (503, Some(1), true)
        );
        let body: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(body["code"], 503);
        assert_eq!(body["type"], "ServiceUnavailableException");
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("--max-queue-wait"));
    }
}
