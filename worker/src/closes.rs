//! Connections the worker closes on their client's account: HTTP/2 connections h2 ends with
//! GOAWAY for abuse (`ENHANCE_YOUR_CALM`: too many reset streams, the control-frame budget…)
//! or for another protocol error, and connections whose client read nothing of its answers
//! (`conn.rs`, [`Expiry::Unread`](crate::conn::Expiry::Unread)). Each is counted in
//! `/metrics` (`vramfork_connections_closed_total`), and the log says so at most once per
//! [`LOG_EVERY`] with the counts since the last line: a client that opens a connection per
//! abuse cannot write one log line each.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::app::App;
use crate::metrics::Closed;

/// At most one `connections_closed` log line per this.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

struct Pending {
    /// When the last line was written.
    last: Option<Instant>,
    /// Closes since, by [`Closed`].
    counts: [u64; Closed::ALL.len()],
    /// A line is planned for the end of the interval.
    planned: bool,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    last: None,
    counts: [0; Closed::ALL.len()],
    planned: false,
});

/// A connection closed on its client's account (from within the worker's runtime).
pub fn closed(app: &App, why: Closed) {
    if let Some(m) = &app.metrics {
        m.connection_closed(why);
    }
    let mut p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    p.counts[why as usize] += 1;
    let now = Instant::now();
    match p.last {
        Some(t) if now < t + LOG_EVERY => {
            if !p.planned {
                p.planned = true;
                tokio::spawn(async move {
                    tokio::time::sleep_until((t + LOG_EVERY).into()).await;
                    log(&mut PENDING.lock().unwrap_or_else(|p| p.into_inner()));
                });
            }
        }
        _ => log(&mut p),
    }
}

/// The closes since the last line, in one line (none: no line).
fn log(p: &mut Pending) {
    let c = std::mem::take(&mut p.counts);
    p.planned = false;
    let n: u64 = c.iter().sum();
    if n == 0 {
        return;
    }
    let since = p.last.map(|t| t.elapsed().as_secs()).unwrap_or(0);
    p.last = Some(Instant::now());
    let [abuse, protocol_error, unread] = c;
    tracing::warn!(
        event = "connections_closed",
        abuse,
        protocol_error,
        unread,
        "closed {n} connection(s) on their clients' account since the last such line ({since} s ago, or start): {abuse} for abuse (HTTP/2 GOAWAY ENHANCE_YOUR_CALM), {protocol_error} for other HTTP/2 protocol errors, {unread} whose client read nothing of its answers; counted in vramfork_connections_closed_total"
    );
}

/// Why h2 ended a connection, when it was for the client's frames: a GOAWAY h2 itself sent
/// (not one the client sent, nor an I/O error).
pub fn of_error(e: &(dyn std::error::Error + 'static)) -> Option<Closed> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            if !(h2.is_go_away() && h2.is_library()) {
                return None;
            }
            return match h2.reason()? {
                h2::Reason::NO_ERROR => None,
                h2::Reason::ENHANCE_YOUR_CALM => Some(Closed::Abuse),
                _ => Some(Closed::ProtocolError),
            };
        }
        cur = err.source();
    }
    None
}
