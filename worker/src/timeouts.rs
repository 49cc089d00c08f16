//! The worker's HTTP deadlines, in one place, so that a slow or stalled client cannot hold
//! a worker hostage.

use std::time::Duration;

/// A client must send a request's complete headers within this (hyper's header timeout,
/// and the limit for a new connection that has sent nothing yet).
pub const HEADER_READ: Duration = Duration::from_secs(10);
/// A request body must arrive completely within this.
pub const BODY_READ: Duration = Duration::from_secs(30);
/// An idle keep-alive connection is closed after this.
pub const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(60);
/// A new connection holds back the accept loop (see `server.rs`) for at most this long
/// before its first request: long enough for a client's request to follow its connect,
/// short enough that silent connections cannot stall a worker.
pub const FRESH_GRACE: Duration = Duration::from_millis(100);
