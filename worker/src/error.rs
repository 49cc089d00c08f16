//! Every error the HTTP API answers, in one table: error → status code, and the JSON body
//! `{"error": "<message a user can act on>"}`.

use hyper::StatusCode;

use vramfork::auth::AuthFailure;

use crate::decode::BodyError;
use crate::runner::RunError;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// A request body the model cannot take, whichever protocol and decoder found it
    /// (`decode/`, `http/v2/request.rs`): not JSON, missing `inputs`, ragged, non-numeric,
    /// wrong shape or dtype, a bad `BYTES` element, binary data of the wrong size.
    #[error("{0}")]
    Body(BodyError),
    /// A bad query parameter or header, a body that could not be read.
    #[error("{0}")]
    BadRequest(String),
    #[error("no route for {0}; this server answers GET / (metadata), POST / (inference), GET /healthz and the v2 protocol under /v2")]
    NotFound(String),
    /// A v2 path naming a model or version this server does not have (the message says
    /// what it has).
    #[error("{0}")]
    NoSuchModel(String),
    #[error("method {method} is not allowed on {path}; allowed: {allow}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: &'static str,
    },
    #[error("request body larger than the limit of {limit} bytes (--max-body-mb)")]
    TooLarge { limit: u64 },
    /// A request carrying more documents than an input's `max_documents`, or more than its
    /// pre-processing may make (`documents/`): refused before anything is decoded. The body
    /// was read, so the connection stays open.
    #[error("{0}")]
    DocumentsTooLarge(String),
    #[error("the request body was not received within {0} s")]
    BodyTimeout(u64),
    #[error("{0}")]
    Run(RunError),
    /// Retiring or shutting down: another worker will answer a retry. The request never
    /// reached the model.
    #[error("this worker is shutting down; the request did not run, retry it")]
    Unavailable,
    /// The model is stuck on another request (past --request-timeout): this one waited for
    /// it and never ran.
    #[error("the request did not run: this worker's model is stuck on another request (--request-timeout) and the worker is being replaced; retry it")]
    ModelStuck,
    /// Waited longer than --max-queue-wait before a worker could take it.
    #[error("the server is overloaded: the request waited {waited_ms} ms for a worker, more than --max-queue-wait ({max_ms} ms), and did not run; retry later")]
    QueueWait { waited_ms: u64, max_ms: u64 },
    #[error("the request ran past the request timeout of {0} ms (--request-timeout); this worker is being replaced")]
    Timeout(u64),
    /// Pre-processing its documents ran past --request-timeout: stopped between documents,
    /// it never reached the model; the worker serves on.
    #[error("pre-processing the request's documents ran past the request timeout of {0} ms (--request-timeout) and was stopped; the request did not reach the model: send fewer or smaller documents")]
    PreprocessTimeout(u64),
    /// Token auth (`--api-key-file`) refused the request; answered before its body is read.
    #[error("{}", .0.message())]
    Unauthorized(AuthFailure),
    /// The client's own deadline (`X-Request-Timeout`, v2 `parameters.timeout`) passed
    /// before the request's pass could start: it never ran.
    #[error("the request did not run: its deadline ({given_in} {limit_ms} ms) passed after it had waited {waited_ms} ms for the model")]
    DeadlineExpired {
        waited_ms: u64,
        limit_ms: u64,
        given_in: &'static str,
    },
}

/// What a request whose client deadline passed before it ran gets (see README).
pub const DEADLINE_STATUS: StatusCode = StatusCode::SERVICE_UNAVAILABLE;

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> ApiError {
        match e {
            BodyError::TooLarge(m) => ApiError::DocumentsTooLarge(m),
            e => ApiError::Body(e),
        }
    }
}

impl ApiError {
    /// A method this path does not take.
    pub fn not_allowed(method: &hyper::Method, path: &str, allow: &'static str) -> ApiError {
        ApiError::MethodNotAllowed {
            method: method.to_string(),
            path: path.to_string(),
            allow,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Body(_) | ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) | ApiError::NoSuchModel(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge { .. } | ApiError::DocumentsTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Run(RunError::OutOfMemory(_)) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::Run(RunError::Gone) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Run(RunError::Request(_)) => StatusCode::BAD_REQUEST,
            ApiError::Run(RunError::Expired) => DEADLINE_STATUS,
            ApiError::Run(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable | ApiError::ModelStuck | ApiError::QueueWait { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Timeout(_) | ApiError::PreprocessTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::DeadlineExpired { .. } => DEADLINE_STATUS,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }

    /// `Retry-After` (seconds) for refusals of requests that never ran: 0 where another
    /// worker can take the retry at once, 1 when the server is overloaded.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            ApiError::Unavailable | ApiError::ModelStuck => Some(0),
            ApiError::QueueWait { .. } => Some(1),
            _ => None,
        }
    }

    /// The connection must close after this answer (its body may be unread, or the
    /// worker is going away).
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            ApiError::TooLarge { .. }
                | ApiError::BodyTimeout(_)
                | ApiError::Unavailable
                | ApiError::ModelStuck
                | ApiError::QueueWait { .. }
                | ApiError::Timeout(_)
                | ApiError::Unauthorized(_)
                | ApiError::Run(RunError::OutOfMemory(_) | RunError::CudaFatal(_) | RunError::Gone)
        )
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": self.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        let cases = [
            (ApiError::BadRequest("x".into()), 400),
            (ApiError::Body(BodyError::NotJson("x".into())), 400),
            (ApiError::Body(BodyError::Invalid("x".into())), 400),
            (ApiError::NotFound("/x".into()), 404),
            (ApiError::NoSuchModel("m".into()), 404),
            (
                ApiError::MethodNotAllowed {
                    method: "PUT".into(),
                    path: "/".into(),
                    allow: "GET, POST",
                },
                405,
            ),
            (ApiError::TooLarge { limit: 10 }, 413),
            (ApiError::DocumentsTooLarge("x".into()), 413),
            (ApiError::BodyTimeout(30), 408),
            (ApiError::Run(RunError::Model("boom".into())), 500),
            (ApiError::Run(RunError::Unsupported("x".into())), 500),
            (ApiError::Run(RunError::Request("x".into())), 400),
            (ApiError::Run(RunError::CudaFatal("x".into())), 500),
            (ApiError::Run(RunError::OutOfMemory("x".into())), 507),
            (ApiError::Unavailable, 503),
            (ApiError::ModelStuck, 503),
            (
                ApiError::QueueWait {
                    waited_ms: 12_000,
                    max_ms: 10_000,
                },
                503,
            ),
            (ApiError::Timeout(5), 504),
            (ApiError::PreprocessTimeout(5), 504),
            (
                ApiError::DeadlineExpired {
                    waited_ms: 600,
                    limit_ms: 500,
                    given_in: "X-Request-Timeout",
                },
                DEADLINE_STATUS.as_u16(),
            ),
            (ApiError::Run(RunError::Expired), DEADLINE_STATUS.as_u16()),
            (ApiError::Unauthorized(AuthFailure::Invalid), 401),
        ];
        for (e, code) in cases {
            assert_eq!(e.status().as_u16(), code, "{e:?}");
            assert_eq!(e.body()["error"], e.to_string());
        }
        // Refusals of requests that never ran say when to retry; nothing else does.
        assert_eq!(ApiError::ModelStuck.retry_after(), Some(0));
        assert_eq!(ApiError::Unavailable.retry_after(), Some(0));
        assert_eq!(ApiError::Timeout(5).retry_after(), None);
        let oom = ApiError::Run(RunError::OutOfMemory("Tried to allocate".into()));
        assert!(oom.to_string().contains("CUDA out of memory"));
    }
}
