//! The `503` a server released for being idle answers itself when the GPUs have no room to
//! start a worker again (`idle.rs`). The master's loop does no client I/O it could be held
//! by: each connection waiting is taken, answered at once with a write that does not wait
//! (a fresh socket's send buffer holds the short answer whole), and its writing side shut;
//! reading what the client sent — so that closing sends no reset over the answer — is a
//! thread's, for at most [`DRAIN_FOR`] in all, however the client sends it. A turn takes at
//! most [`PER_TURN`] connections, and at most [`DRAINING_AT_MOST`] are drained at once (past
//! that, a connection is closed as soon as it is answered). So a client that sends its
//! request a byte at a time holds no one: neither another client's answer nor a signal.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long, in all, what a refused client sends is read before its connection is closed.
pub(super) const DRAIN_FOR: Duration = Duration::from_millis(200);
/// Connections one loop turn answers at most (the rest wait for the next turn).
pub(super) const PER_TURN: usize = 64;
/// Connections drained at once at most.
const DRAINING_AT_MOST: usize = 64;

/// Connections being drained now.
static DRAINING: AtomicUsize = AtomicUsize::new(0);

/// Answers up to [`PER_TURN`] connections waiting on `listener` with `answer` (with `tls`,
/// closes them unanswered: the master speaks no TLS); returns how many it took.
pub(super) fn refuse_waiting(listener: &TcpListener, tls: bool, answer: &[u8]) -> usize {
    // The workers' accept loops set the shared socket non-blocking already; a connection
    // taken meanwhile by nobody else is still there, but never wait.
    let _ = listener.set_nonblocking(true);
    let mut taken = 0;
    while taken < PER_TURN {
        let Ok((conn, _)) = listener.accept() else {
            break;
        };
        taken += 1;
        if !tls {
            refuse(conn, answer);
        }
    }
    taken
}

/// Writes `answer` without waiting, shuts the writing side, and leaves the reading to a
/// draining thread (or closes at once when too many are draining).
fn refuse(mut conn: TcpStream, answer: &[u8]) {
    if conn.set_nonblocking(true).is_err() || conn.write(answer).is_err() {
        return;
    }
    let _ = conn.shutdown(Shutdown::Write);
    if DRAINING.fetch_add(1, Ordering::SeqCst) >= DRAINING_AT_MOST {
        DRAINING.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("vf-refused".into())
        .stack_size(64 << 10)
        .spawn(move || {
            drain(conn, Instant::now() + DRAIN_FOR);
            DRAINING.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        DRAINING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads and drops what the client sends until it closes, or `until`.
fn drain(mut conn: TcpStream, until: Instant) {
    if conn.set_nonblocking(false).is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that sends a byte at a time gets its answer at once, and the drain ends
    /// within its bound while the client still sends.
    #[test]
    fn a_dripping_client_is_answered_at_once_and_drained_for_a_bounded_time() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        client.write_all(b"P").unwrap();
        let t0 = Instant::now();
        let taken = loop {
            match refuse_waiting(&l, false, b"HTTP/1.1 503 x\r\n\r\n") {
                0 => std::thread::yield_now(),
                n => break n,
            }
        };
        assert_eq!(taken, 1);
        assert!(
            t0.elapsed() < Duration::from_millis(50),
            "{:?}",
            t0.elapsed()
        );
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        assert!(got.starts_with(b"HTTP/1.1 503"), "{got:?}");
        // Its writing side shut, the server still reads, for a bounded time: then a byte
        // sent meets a closed socket.
        let closed = loop {
            if client.write_all(b"O").is_err() {
                break t0.elapsed();
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "never closed");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(closed < DRAIN_FOR + Duration::from_secs(1), "{closed:?}");
    }
}
