//! What every front door (HTTP's and gRPC's) reads of a request's head the same way: when
//! it arrived, the key it gives, how to ask its connection to close, and the hwFetch line an
//! answer carries when asked.

use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::Request;
use vramfork::auth::ApiKeys;

use crate::app::App;
use crate::error::ApiError;

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

/// The hwFetch line (`parameters.hwFetch`, `?hwFetch`): the hardware's state now, or why it
/// is unavailable.
pub fn hw_line(app: &App) -> String {
    app.hw.line().unwrap_or_else(|e| {
        tracing::warn!("hwFetch: {e}");
        format!("unavailable: {e}")
    })
}
