//! Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for every
//! answer under `/v1/`: the refusals of the embeddings door itself (a bad `input`,
//! `dimensions`, `encoding_format`; a model that declares no embeddings) and every error the
//! rest of the server gives (token auth, deadlines, overload, the model's own failure), each
//! with the status, `Retry-After` and connection close the server's own table gives it.
//! `type` follows OpenAI's classes by status; `code` is the machine-readable cause (for the
//! server's errors, their `type` in docs/api.md's table).

use hyper::StatusCode;
use serde_json::json;

use crate::error::ApiError;
use crate::http::answer::{json_bytes, Answer};

/// An error answered in OpenAI's shape.
#[derive(Debug)]
pub struct OaiError {
    status: StatusCode,
    message: String,
    /// The request's field at fault, when one is.
    param: Option<&'static str>,
    code: String,
    /// The server's own error it was, whose answer's headers it keeps.
    api: Option<Box<ApiError>>,
}

impl OaiError {
    /// A 400 naming the request's field at fault.
    pub fn invalid(param: &'static str, code: &str, message: impl Into<String>) -> OaiError {
        OaiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param),
            code: code.into(),
            api: None,
        }
    }

    /// Any status, with no field at fault.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> OaiError {
        OaiError {
            status,
            message: message.into(),
            param: None,
            code: code.into(),
            api: None,
        }
    }

    /// OpenAI's error class for a status.
    fn kind(&self) -> &'static str {
        crate::http::answer::openai_error_type(self.status)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.code,
        }})
    }

    /// The answer: the body in OpenAI's shape; for a server error, its own answer's
    /// `Retry-After`, `Allow`, `WWW-Authenticate` and connection close.
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

impl From<ApiError> for OaiError {
    fn from(e: ApiError) -> OaiError {
        OaiError {
            status: e.status(),
            message: e.to_string(),
            param: None,
            code: e.kind().into(),
            api: Some(Box::new(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_keep_their_status_and_headers_in_openais_shape() {
        let e = OaiError::from(ApiError::QueueWait {
            waited_ms: 12,
            max_ms: 10,
        });
        assert_eq!(e.body()["error"]["type"], "server_error");
        assert_eq!(e.body()["error"]["code"], "overloaded");
        let a = e.answer();
        assert_eq!(
            (a.status.as_u16(), a.retry_after, a.close),
            (503, Some(1), true)
        );
        let body: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-queue-wait"));
        let bad = OaiError::invalid("dimensions", "invalid_dimensions", "no");
        assert_eq!(bad.body()["error"]["param"], "dimensions");
        assert_eq!(bad.body()["error"]["type"], "invalid_request_error");
        assert_eq!(bad.answer().status.as_u16(), 400);
    }
}
