//! Every error the HTTP API answers, in one table ([`ApiError::row`]): error → status code
//! and machine-readable type, and the JSON body
//! `{"error": "<message a user can act on>", "type": "<type>"}` — the v2 protocol's
//! `{"error": …}` with one field more. Every other error a request can meet becomes an
//! [`ApiError`] here too: a body the decoders refuse ([`BodyError`]) and a document the
//! pre-processing refuses ([`DocError`]). The types are listed in docs/api.md (checked by
//! a test below).

use hyper::StatusCode;

use vramfork::auth::AuthFailure;

use crate::decode::BodyError;
use crate::documents::DocError;
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
    #[error("no route for {0}; this server answers GET / (metadata), POST / (inference), GET /healthz, the v2 protocol under /v2 and OpenAI's embeddings under /v1")]
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
    /// Pre-processing a request's documents failed (a panic on its thread); the worker
    /// serves on.
    #[error("{0}")]
    PreprocessFailed(String),
    /// Pre-processing its documents ran past --request-timeout: stopped between documents,
    /// it never reached the model; the worker serves on.
    #[error("pre-processing the request's documents ran past the request timeout of {0} ms (--request-timeout) and was stopped; the request did not reach the model: send fewer or smaller documents")]
    PreprocessTimeout(u64),
    /// Token auth (`--api-key-file`) refused the request; answered before its body is read.
    #[error("{}", .0.message())]
    Unauthorized(AuthFailure),
    /// A gRPC method this server does not serve (Triton's repository, statistics, shared
    /// memory… RPCs).
    #[error("{0}")]
    NotImplemented(String),
    /// A request on a gRPC path whose content type is not gRPC's (HTTP 415, as the gRPC
    /// HTTP/2 specification asks, so that a client that is not gRPC's sees no success).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A gRPC request handed to a sibling worker whose connection broke before it answered
    /// (the sibling died): it may have run.
    #[error("the worker this request was handed to (on seat {0}) went away before answering; the request may have run")]
    SiblingLost(u32),
    /// The client's own deadline (`X-Request-Timeout`, v2 `parameters.timeout`) passed
    /// before the request's pass could start: it never ran.
    #[error("the request did not run: its deadline ({given_in} {limit_ms} ms) passed after it had waited {waited_ms} ms for the model")]
    DeadlineExpired {
        waited_ms: u64,
        limit_ms: u64,
        given_in: &'static str,
    },
}

/// The gRPC status codes (`google.rpc.Code`) errors map to ([`ApiError::grpc_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcCode {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

#[cfg(test)]
impl GrpcCode {
    /// Its name, as gRPC's documents spell it.
    pub fn name(self) -> &'static str {
        match self {
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }
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

/// A request's documents not pre-processed. (A deadline the pipeline knows more of is
/// answered there: the client's, or `--request-timeout`'s 504.)
impl From<DocError> for ApiError {
    fn from(e: DocError) -> ApiError {
        match e {
            DocError::Bad(e) => ApiError::BadRequest(e),
            DocError::TooLarge(e) => ApiError::DocumentsTooLarge(e),
            DocError::Failed(e) => ApiError::PreprocessFailed(e),
            DocError::Stopped { .. } => ApiError::Run(RunError::Expired),
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

    /// **The table**: each error's status code and its type (`"type"` in the body).
    fn row(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            ApiError::Body(_) => (S::BAD_REQUEST, "invalid_input"),
            ApiError::BadRequest(_) => (S::BAD_REQUEST, "bad_request"),
            ApiError::Run(RunError::Request(_)) => (S::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized(_) => (S::UNAUTHORIZED, "unauthorized"),
            ApiError::NotFound(_) => (S::NOT_FOUND, "not_found"),
            ApiError::NoSuchModel(_) => (S::NOT_FOUND, "model_not_found"),
            ApiError::MethodNotAllowed { .. } => (S::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::NotImplemented(_) => (S::NOT_IMPLEMENTED, "not_implemented"),
            ApiError::SiblingLost(_) => (S::BAD_GATEWAY, "sibling_lost"),
            ApiError::BodyTimeout(_) => (S::REQUEST_TIMEOUT, "body_timeout"),
            ApiError::UnsupportedMediaType(_) => {
                (S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::TooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "body_too_large"),
            ApiError::DocumentsTooLarge(_) => (S::PAYLOAD_TOO_LARGE, "documents_too_large"),
            ApiError::Run(RunError::CudaFatal(_)) => (S::INTERNAL_SERVER_ERROR, "cuda_error"),
            ApiError::Run(RunError::Cuda(_)) => (S::INTERNAL_SERVER_ERROR, "cuda_request_error"),
            ApiError::Run(RunError::Unsupported(_)) => (S::INTERNAL_SERVER_ERROR, "output_error"),
            ApiError::PreprocessFailed(_) => (S::INTERNAL_SERVER_ERROR, "preprocessing_failed"),
            ApiError::QueueWait { .. } => (S::SERVICE_UNAVAILABLE, "overloaded"),
            ApiError::Unavailable => (S::SERVICE_UNAVAILABLE, "shutting_down"),
            ApiError::ModelStuck => (S::SERVICE_UNAVAILABLE, "model_stuck"),
            ApiError::Run(RunError::Gone) => (S::SERVICE_UNAVAILABLE, "model_unavailable"),
            ApiError::DeadlineExpired { .. } => (DEADLINE_STATUS, "deadline_expired"),
            ApiError::Run(RunError::Expired) => (DEADLINE_STATUS, "deadline_expired"),
            ApiError::Timeout(_) => (S::GATEWAY_TIMEOUT, "request_timeout"),
            ApiError::PreprocessTimeout(_) => (S::GATEWAY_TIMEOUT, "preprocessing_timeout"),
            ApiError::Run(RunError::OutOfMemory(_)) => (S::INSUFFICIENT_STORAGE, "out_of_memory"),
            // The model's own error, and any the runner sorts no further.
            ApiError::Run(_) => (S::INTERNAL_SERVER_ERROR, "model_error"),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.row().0
    }

    /// The error's machine-readable type (`"type"` in the body), as docs/api.md lists them.
    pub fn kind(&self) -> &'static str {
        self.row().1
    }

    /// The gRPC status of the error (`grpc-status` of a gRPC call it ends), from its row:
    /// by its HTTP status, and where gRPC has a closer code, by its type (an unknown method
    /// is `UNIMPLEMENTED`, an unknown model `NOT_FOUND`, a deadline that passed before the
    /// call ran `DEADLINE_EXCEEDED`, which a client does not retry, where REST's 503 says
    /// it did not run). docs/grpc.md lists the mapping.
    pub fn grpc_code(&self) -> GrpcCode {
        use GrpcCode as G;
        let (status, kind) = self.row();
        match (status.as_u16(), kind) {
            (400, _) => G::InvalidArgument,
            (401, _) => G::Unauthenticated,
            (404, "model_not_found") => G::NotFound,
            (_, "deadline_expired") => G::DeadlineExceeded,
            (404 | 405 | 501, _) => G::Unimplemented,
            (502 | 503, _) => G::Unavailable,
            (408 | 504, _) => G::DeadlineExceeded,
            (413 | 507, _) => G::ResourceExhausted,
            _ => G::Internal,
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
        serde_json::json!({ "error": self.to_string(), "type": self.kind() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error type the table gives, in the order docs/api.md lists them.
    const TYPES: [&str; 25] = [
        "invalid_input",
        "bad_request",
        "unauthorized",
        "not_found",
        "model_not_found",
        "method_not_allowed",
        "not_implemented",
        "unsupported_media_type",
        "body_timeout",
        "body_too_large",
        "documents_too_large",
        "model_error",
        "cuda_error",
        "cuda_request_error",
        "output_error",
        "preprocessing_failed",
        "sibling_lost",
        "overloaded",
        "shutting_down",
        "model_stuck",
        "model_unavailable",
        "deadline_expired",
        "request_timeout",
        "preprocessing_timeout",
        "out_of_memory",
    ];

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
            (ApiError::Run(RunError::Cuda("x".into())), 500),
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
            assert_eq!(e.body()["type"], e.kind());
            assert!(TYPES.contains(&e.kind()), "{e:?}");
        }
        // Refusals of requests that never ran say when to retry; nothing else does.
        assert_eq!(ApiError::ModelStuck.retry_after(), Some(0));
        assert_eq!(ApiError::Unavailable.retry_after(), Some(0));
        assert_eq!(ApiError::Timeout(5).retry_after(), None);
        let oom = ApiError::Run(RunError::OutOfMemory("Tried to allocate".into()));
        assert!(oom.to_string().contains("CUDA out of memory"));
        // A CUDA error that leaves the context usable keeps the connection (the worker
        // serves on); a sticky one closes it (the worker is going away).
        assert!(!ApiError::Run(RunError::Cuda("x".into())).closes_connection());
        assert!(ApiError::Run(RunError::CudaFatal("x".into())).closes_connection());
    }

    #[test]
    fn every_variant_has_its_row_and_the_documents_mapping_keeps_statuses() {
        let rows = [
            (ApiError::Run(RunError::Gone), 503, "model_unavailable"),
            (
                ApiError::Run(RunError::Request("x".into())),
                400,
                "bad_request",
            ),
            (
                ApiError::PreprocessFailed("x".into()),
                500,
                "preprocessing_failed",
            ),
            (
                ApiError::from(DocError::Bad("x".into())),
                400,
                "bad_request",
            ),
            (
                ApiError::from(DocError::TooLarge("x".into())),
                413,
                "documents_too_large",
            ),
            (
                ApiError::from(DocError::Failed("x".into())),
                500,
                "preprocessing_failed",
            ),
            (
                ApiError::from(DocError::Stopped { client: true }),
                DEADLINE_STATUS.as_u16(),
                "deadline_expired",
            ),
            (
                ApiError::from(BodyError::TooLarge("x".into())),
                413,
                "documents_too_large",
            ),
        ];
        for (e, code, kind) in rows {
            assert_eq!((e.status().as_u16(), e.kind()), (code, kind), "{e:?}");
        }
    }

    /// docs/api.md's error table names every type, each in the row of its status, and no
    /// other.
    #[test]
    fn the_api_docs_list_every_type_with_its_status() {
        let doc = include_str!("../../docs/api.md");
        let mut listed: Vec<(u16, String)> = Vec::new();
        let table = doc
            .lines()
            .skip_while(|l| !l.starts_with("| status | type | when |"))
            .take_while(|l| l.starts_with('|'));
        for line in table {
            let cells: Vec<&str> = line.split(" | ").collect();
            let code: String = line.chars().skip(2).take(3).collect();
            let Ok(code) = code.parse::<u16>() else {
                continue;
            };
            let Some(types) = cells.get(1) else { continue };
            // A row the master answers (no worker runs then): its type is the master's own,
            // written where the master answers it.
            if cells
                .get(2)
                .is_some_and(|w| w.starts_with("answered by the master"))
            {
                for t in types.split('`').skip(1).step_by(2) {
                    let answer = format!("\\\"type\\\": \\\"{t}\\\"");
                    assert!(
                        include_str!("../../src/master/supervisor/idle.rs").contains(&answer),
                        "docs/api.md says the master answers {t}: src/master/supervisor/idle.rs does not"
                    );
                }
                continue;
            }
            for t in types.split('`').skip(1).step_by(2) {
                listed.push((code, t.to_string()));
            }
        }
        let mut want: Vec<(u16, String)> = Vec::new();
        let samples = [
            ApiError::Body(BodyError::Invalid("x".into())),
            ApiError::BadRequest("x".into()),
            ApiError::Unauthorized(AuthFailure::Invalid),
            ApiError::NotFound("x".into()),
            ApiError::NoSuchModel("x".into()),
            ApiError::not_allowed(&hyper::Method::PUT, "/", "GET"),
            ApiError::NotImplemented("x".into()),
            ApiError::UnsupportedMediaType("x".into()),
            ApiError::BodyTimeout(1),
            ApiError::TooLarge { limit: 1 },
            ApiError::DocumentsTooLarge("x".into()),
            ApiError::Run(RunError::Model("x".into())),
            ApiError::Run(RunError::CudaFatal("x".into())),
            ApiError::Run(RunError::Cuda("x".into())),
            ApiError::Run(RunError::Unsupported("x".into())),
            ApiError::PreprocessFailed("x".into()),
            ApiError::SiblingLost(1),
            ApiError::QueueWait {
                waited_ms: 2,
                max_ms: 1,
            },
            ApiError::Unavailable,
            ApiError::ModelStuck,
            ApiError::Run(RunError::Gone),
            ApiError::Run(RunError::Expired),
            ApiError::Timeout(1),
            ApiError::PreprocessTimeout(1),
            ApiError::Run(RunError::OutOfMemory("x".into())),
        ];
        let mut grpc_want: Vec<(String, String)> = Vec::new();
        for e in samples {
            let row = (e.status().as_u16(), e.kind().to_string());
            if !want.contains(&row) {
                want.push(row);
            }
            grpc_want.push((e.grpc_code().name().to_string(), e.kind().to_string()));
        }
        // docs/grpc.md's table: `| gRPC status | types |`, each type in the row of its code.
        let mut grpc_listed: Vec<(String, String)> = Vec::new();
        let table = include_str!("../../docs/grpc.md")
            .lines()
            .skip_while(|l| !l.starts_with("| gRPC status | types |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'));
        for line in table {
            let cells: Vec<&str> = line.split(" | ").collect();
            let code = cells[0]
                .trim_start_matches("| ")
                .trim_matches('`')
                .to_string();
            for t in cells[1].split('`').skip(1).step_by(2) {
                grpc_listed.push((code.clone(), t.to_string()));
            }
        }
        grpc_want.sort();
        grpc_want.dedup();
        grpc_listed.sort();
        assert_eq!(grpc_listed, grpc_want, "docs/grpc.md's gRPC status table");
        assert_eq!(
            want.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(),
            TYPES,
            "TYPES lists every type of the table, in its order"
        );
        want.sort();
        listed.sort();
        listed.dedup();
        assert_eq!(
            listed, want,
            "docs/api.md's error table (status | types | when)"
        );
    }
}
