//! A client's deadline (`X-Request-Timeout`, v2 `parameters.timeout`, gRPC's
//! `grpc-timeout`): when it passes, and the refusal of a request it passed before its pass
//! started.

use std::time::{Duration, Instant};

use crate::error::ApiError;

/// The header a client gives its deadline in, in seconds from the request's arrival.
pub const TIMEOUT_HEADER: &str = "x-request-timeout";

/// A client's deadline: past it the request is not run.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    limit: Duration,
    /// Where the client gave it (`X-Request-Timeout`, `parameters.timeout`).
    source: &'static str,
}

impl Deadline {
    /// `limit` from `arrived`, as the client gave it in `source` (a header's name).
    pub fn after(arrived: Instant, limit: Duration, source: &'static str) -> Deadline {
        Deadline {
            at: arrived + limit,
            limit,
            source,
        }
    }

    /// When it passes.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// `X-Request-Timeout: S` (seconds, > 0); a bad value is a 400.
    pub fn from_header(
        h: &hyper::HeaderMap,
        arrived: Instant,
    ) -> Result<Option<Deadline>, ApiError> {
        let Some(v) = h.get(TIMEOUT_HEADER) else {
            return Ok(None);
        };
        let secs = v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= MAX_TIMEOUT_S)
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "X-Request-Timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S} (e.g. 2.5), not {v:?}"
                ))
            })?;
        let limit = Duration::from_secs_f64(secs);
        Ok(Some(Deadline {
            at: arrived + limit,
            limit,
            source: "X-Request-Timeout",
        }))
    }

    /// The refusal when it has passed.
    pub fn refusal(&self, arrived: Instant) -> Option<ApiError> {
        (Instant::now() >= self.at).then(|| self.expired(arrived))
    }

    pub fn expired(&self, arrived: Instant) -> ApiError {
        ApiError::DeadlineExpired {
            waited_ms: arrived.elapsed().as_millis() as u64,
            limit_ms: self.limit.as_millis() as u64,
            given_in: self.source,
        }
    }
}

/// The longest timeout a client may give (a day): anything longer is a mistake.
pub const MAX_TIMEOUT_S: f64 = 86_400.0;
