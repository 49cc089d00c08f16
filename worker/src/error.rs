//! Every error the HTTP API answers, in one table: error → status code, and the JSON body
//! `{"error": "<message a user can act on>"}`.

use hyper::StatusCode;

use crate::runner::RunError;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, missing/non-array `inputs`, ragged, non-numeric, wrong shape or dtype,
    /// a bad query parameter.
    #[error("{0}")]
    BadRequest(String),
    #[error("no route for {0}; this server answers GET / (metadata), POST / (inference) and GET /healthz")]
    NotFound(String),
    #[error("method {method} is not allowed on {path}; allowed: {allow}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: &'static str,
    },
    #[error("request body larger than the limit of {limit} bytes (--max-body-mb)")]
    TooLarge { limit: u64 },
    #[error("the request body was not received within {0} s")]
    BodyTimeout(u64),
    #[error("{0}")]
    Run(RunError),
    /// Retiring or shutting down: another worker will answer a retry.
    #[error("this worker is shutting down; retry the request")]
    Unavailable,
    #[error("the request ran past the request timeout of {0} ms (--request-timeout); this worker is being replaced")]
    Timeout(u64),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Run(RunError::OutOfMemory(_)) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::Run(RunError::Gone) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Run(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
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
                | ApiError::Timeout(_)
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
            (ApiError::NotFound("/x".into()), 404),
            (
                ApiError::MethodNotAllowed {
                    method: "PUT".into(),
                    path: "/".into(),
                    allow: "GET, POST",
                },
                405,
            ),
            (ApiError::TooLarge { limit: 10 }, 413),
            (ApiError::BodyTimeout(30), 408),
            (ApiError::Run(RunError::Model("boom".into())), 500),
            (ApiError::Run(RunError::Unsupported("x".into())), 500),
            (ApiError::Run(RunError::CudaFatal("x".into())), 500),
            (ApiError::Run(RunError::OutOfMemory("x".into())), 507),
            (ApiError::Unavailable, 503),
            (ApiError::Timeout(5), 504),
        ];
        for (e, code) in cases {
            assert_eq!(e.status().as_u16(), code, "{e:?}");
            assert_eq!(e.body()["error"], e.to_string());
        }
        let oom = ApiError::Run(RunError::OutOfMemory("Tried to allocate".into()));
        assert!(oom.to_string().contains("CUDA out of memory"));
    }
}
