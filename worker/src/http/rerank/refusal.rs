//! A refusal of the rerank, score and classify doors, answered in the shape of the API the
//! client speaks: OpenAI's `{"error": {message, type, param, code}}` for vLLM's `/score` and
//! everything under `/v1/` (as vLLM answers its Jina and Cohere v1 paths), Cohere's
//! `{"message"}` for `/v2/rerank`, text-embeddings-inference's `{"error", "error_type"}` for
//! `/rerank` and `/predict`. A server error (deadline, overload, the model's failure) keeps
//! its status, `Retry-After` and connection close in every shape.

use hyper::StatusCode;
use serde_json::json;

use crate::error::ApiError;
use crate::http::answer::{json_bytes, Answer};

/// The API whose shape an answer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Cohere,
    Tei,
}

#[derive(Debug)]
pub struct Refusal {
    status: StatusCode,
    message: String,
    /// The request's field at fault, when one is.
    param: Option<&'static str>,
    code: &'static str,
    api: Option<Box<ApiError>>,
}

impl Refusal {
    /// A 400 naming the request's field at fault.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param),
            code: "invalid_request",
            api: None,
        }
    }

    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
            param: None,
            code,
            api: None,
        }
    }

    /// OpenAI's error class for a status.
    fn openai_type(&self) -> &'static str {
        crate::http::answer::openai_error_type(self.status)
    }

    /// TEI's error class for a status.
    fn tei_type(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 404 | 405 | 413 | 422 => "Validation",
            429 | 503 => "Overloaded",
            _ => "Backend",
        }
    }

    pub fn answer(self, shape: Shape) -> Answer {
        let body = match shape {
            Shape::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.code,
            }}),
            Shape::Cohere => json!({"message": self.message}),
            Shape::Tei => json!({"error": self.message, "error_type": self.tei_type()}),
        };
        let mut a = match self.api {
            Some(api) => Answer::from(*api),
            None => Answer::with(self.status, Vec::new()),
        };
        a.body = json_bytes(&body);
        a
    }
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Refusal {
        Refusal {
            status: e.status(),
            message: e.to_string(),
            param: None,
            code: e.kind(),
            api: Some(Box::new(e)),
        }
    }
}
