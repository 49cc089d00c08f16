//! The worker's HTTP deadlines, in one place, so that a slow or stalled client cannot hold
//! a worker hostage.

use std::time::Duration;

/// A client must send a request's complete head within this of its first byte (a new
/// connection: of its accept), or the connection is dropped.
pub const HEADER_READ: Duration = Duration::from_secs(10);
/// A request body must arrive completely within this.
pub const BODY_READ: Duration = Duration::from_secs(30);
/// An idle keep-alive connection is closed after this.
pub const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(60);
/// While a worker retires, a connection idle this long is closed (one whose next request
/// is under way is answered first, with `Connection: close`).
pub const RETIRE_IDLE_GRACE: Duration = Duration::from_secs(1);
/// A connection whose client has taken nothing of what waits for it (an answer whose
/// HTTP/2 window it keeps shut, a write its socket does not take) for this long is dropped,
/// and what was parked for it freed: the keep-alive idle limit, counted from its last
/// progress.
pub const UNREAD: Duration = KEEP_ALIVE_IDLE;
