//! What a connection is doing ([`ConnState`]): its deadlines (`timeouts.rs`) and its share
//! of the worker's counters (open, awaiting a head, fresh, requests in flight), for an
//! HTTP/1.1 connection (one request at a time) or an HTTP/2 one (many at once, as gRPC's:
//! only its first request's head is waited for; then it is idle or busy). [`Watched`]
//! notices the bytes that begin a request head and the writes that wait on the client;
//! [`RequestGuard`] counts a request in flight for as long as it lives; answers that wait
//! on the client (`outgoing.rs`) are noted here too, so that a client that reads nothing is
//! dropped ([`Expiry::Unread`]). The connections themselves are served by `server.rs`.

use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::app::App;
use crate::metrics::Closed;
use crate::timeouts::{HEADER_READ, KEEP_ALIVE_IDLE, RETIRE_IDLE_GRACE, UNREAD};

/// Bytes a client whose writes wait must take for the wait to end (see
/// [`ConnState::wrote`]).
const WAITING_PROGRESS: u64 = 64 << 10;

/// How often a connection with a request in flight re-checks its deadlines.
const BUSY_RECHECK: Duration = Duration::from_secs(1);

/// What a connection is doing, for its deadlines and the worker's counters.
pub struct ConnState {
    pub accepted: Instant,
    /// When its first request arrived, if it was already waiting in the listen queue (over
    /// TLS: when the ClientHello did, moved on by the handshake's time).
    queued_since: Mutex<Option<Instant>>,
    /// Counted in `Counters::awaiting`.
    awaiting: AtomicBool,
    /// When bytes of a request head that is not a request yet began to arrive.
    head_since: Mutex<Option<Instant>>,
    /// Requests in flight on it (HTTP/1.1: 0 or 1).
    in_request: AtomicU32,
    /// Counted in `Counters::fresh`: accepted less than `FRESH_FOR` ago, first request not
    /// answered yet.
    pub fresh: AtomicBool,
    requests: AtomicU64,
    /// When the last request was answered (or the connection accepted).
    idle_since: Mutex<Instant>,
    /// It speaks HTTP/2 (seen at its first request): requests come as streams, many at
    /// once, and bytes between them (window updates, pings) begin no request head.
    h2: AtomicBool,
    /// Since when a write to the socket has waited for the client to read (µs after
    /// `accepted`, plus one; 0: none waits).
    write_waits: AtomicU64,
    /// Bytes written since the writes began to wait.
    written_while_waiting: AtomicU64,
    /// Answers whose next frame waits on the client (HTTP/2 flow control: its window), by
    /// answer, since when (`outgoing.rs`).
    answers_waiting: Mutex<Vec<(u64, Instant)>>,
    next_answer: AtomicU64,
    /// Dropped because its client read nothing ([`ConnState::unread`]).
    unread: AtomicBool,
}

impl ConnState {
    pub fn new(queued: Option<Duration>) -> Arc<ConnState> {
        let now = Instant::now();
        Arc::new(ConnState {
            accepted: now,
            queued_since: Mutex::new(queued.map(|q| now - q)),
            awaiting: AtomicBool::new(true),
            head_since: Mutex::new(None),
            in_request: AtomicU32::new(0),
            fresh: AtomicBool::new(true),
            requests: AtomicU64::new(0),
            idle_since: Mutex::new(now),
            h2: AtomicBool::new(false),
            write_waits: AtomicU64::new(0),
            written_while_waiting: AtomicU64::new(0),
            answers_waiting: Mutex::new(Vec::new()),
            next_answer: AtomicU64::new(0),
            unread: AtomicBool::new(false),
        })
    }

    /// Bytes arrived: outside a request, they begin the next request's head.
    fn bytes_arrived(&self, app: &App) {
        if self.in_request.load(Ordering::SeqCst) > 0 || self.h2.load(Ordering::SeqCst) {
            return;
        }
        let mut h = self.head_since.lock().unwrap_or_else(|p| p.into_inner());
        if h.is_none() {
            *h = Some(Instant::now());
            if !self.awaiting.swap(true, Ordering::SeqCst) {
                app.shared.update(|c| c.awaiting += 1);
            }
        }
    }

    /// When the request that hyper just parsed arrived: for a connection's first request,
    /// when it entered the listen queue; else its first byte.
    fn request_started(&self, app: &App, h2: bool) -> Instant {
        let now = Instant::now();
        if h2 {
            self.h2.store(true, Ordering::SeqCst);
        }
        self.in_request.fetch_add(1, Ordering::SeqCst);
        let first = self.requests.fetch_add(1, Ordering::SeqCst) == 0;
        let head = self
            .head_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let awaiting = self.awaiting.swap(false, Ordering::SeqCst);
        app.shared.update(|c| {
            c.in_flight += 1;
            if awaiting {
                c.awaiting -= 1;
            }
        });
        let queued = if first {
            *self.queued_since.lock().unwrap_or_else(|p| p.into_inner())
        } else {
            None
        };
        queued.or(head).unwrap_or(now)
    }

    fn request_done(&self, app: &App) {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.in_request.fetch_sub(1, Ordering::SeqCst);
        let fresh = self.fresh.swap(false, Ordering::SeqCst);
        app.shared.update(|c| {
            c.in_flight -= 1;
            if fresh {
                c.fresh -= 1;
            }
        });
    }

    /// The TLS handshake took `d`: like a request's upload, it is not time spent waiting for
    /// a worker (`--max-queue-wait`), so the first request's arrival moves on by it.
    pub fn handshake_took(&self, d: Duration) {
        if let Some(q) = self
            .queued_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            *q += d;
        }
    }

    /// The connection is gone: it no longer counts as open, nor as awaiting a request.
    pub fn closed(&self, app: &App) {
        let awaiting = self.awaiting.swap(false, Ordering::SeqCst);
        let fresh = self.fresh.swap(false, Ordering::SeqCst);
        app.shared.update(|c| {
            c.open -= 1;
            if awaiting {
                c.awaiting -= 1;
            }
            if fresh {
                c.fresh -= 1;
            }
        });
    }

    /// Dropped because its client read nothing for [`UNREAD`]: counted, and once the
    /// answers parked for it are freed (the last of them holds this), the heap is handed
    /// back: they were on the heap, which otherwise keeps freed memory.
    pub fn unread(&self, app: &App) {
        self.unread.store(true, Ordering::SeqCst);
        crate::closes::closed(app, Closed::Unread);
    }

    /// No longer counts as a connection whose first request is on its way.
    pub fn stale(&self, app: &App) {
        if self.fresh.swap(false, Ordering::SeqCst) {
            app.shared.update(|c| c.fresh -= 1);
        }
    }

    /// The connection's next deadline and what happens then, given whether the worker is
    /// retiring: the first of its activity's ([`ConnState::activity_deadline`]) and, while
    /// the client leaves an answer unread, [`UNREAD`] after it last took some.
    pub fn deadline(&self, retiring: bool) -> (Instant, Expiry) {
        let d = self.activity_deadline(retiring);
        match self.stalled_since().map(|s| s + UNREAD) {
            Some(u) if u <= d.0 || u <= Instant::now() => (u, Expiry::Unread),
            _ => d,
        }
    }

    /// Since when the client has taken nothing of what waits for it: a write to its
    /// socket, or an answer's next frame (its HTTP/2 window is shut); `None` while nothing
    /// waits on it.
    pub fn stalled_since(&self) -> Option<Instant> {
        let w = match self.write_waits.load(Ordering::SeqCst) {
            0 => None,
            us => Some(self.accepted + Duration::from_micros(us - 1)),
        };
        let a = self.waiting().iter().map(|(_, t)| *t).min();
        w.into_iter().chain(a).min()
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Instant)>> {
        self.answers_waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A write to the socket waits for the client to read.
    fn write_waits(&self) {
        if self.write_waits.load(Ordering::Relaxed) == 0 {
            let us = self.accepted.elapsed().as_micros() as u64 + 1;
            if self
                .write_waits
                .compare_exchange(0, us, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                self.written_while_waiting.store(0, Ordering::SeqCst);
            }
        }
    }

    /// `n` bytes went out: [`WAITING_PROGRESS`] since the writes began to wait ends the
    /// wait. A few bytes now and then (the kernel makes room in the full receive buffer of a
    /// client that reads nothing) do not; nor does a short write that fits them (see
    /// [`ConnState::writes_drained`] for a wait that ended with everything sent).
    fn wrote(&self, n: usize) {
        if self.write_waits.load(Ordering::Relaxed) == 0 {
            return;
        }
        let so_far = self
            .written_while_waiting
            .fetch_add(n as u64, Ordering::SeqCst)
            + n as u64;
        if so_far >= WAITING_PROGRESS {
            self.write_waits.store(0, Ordering::SeqCst);
        }
    }

    /// Ends a wait on writes once the socket `fd` has nothing left to send (the client took
    /// it all); whether it ended one.
    pub fn writes_drained(&self, fd: RawFd) -> bool {
        if self.write_waits.load(Ordering::SeqCst) == 0 || unsent_bytes(fd) > 0 {
            return false;
        }
        self.write_waits.store(0, Ordering::SeqCst);
        true
    }

    /// A new answer's id (for [`ConnState::answer_waits`] and [`ConnState::answer_moves`]).
    pub fn new_answer(&self) -> u64 {
        self.next_answer.fetch_add(1, Ordering::Relaxed)
    }

    /// Answer `id` waits for the client to take its next frame.
    pub fn answer_waits(&self, id: u64) {
        let mut w = self.waiting();
        if !w.iter().any(|(i, _)| *i == id) {
            w.push((id, Instant::now()));
        }
    }

    /// Answer `id` is taken on (or gone): it waits on the client no more.
    pub fn answer_moves(&self, id: u64) {
        let mut w = self.waiting();
        if let Some(i) = w.iter().position(|(i, _)| *i == id) {
            w.swap_remove(i);
        }
    }

    /// The deadline of the connection's requests and idleness.
    fn activity_deadline(&self, retiring: bool) -> (Instant, Expiry) {
        let now = Instant::now();
        if self.in_request.load(Ordering::SeqCst) > 0 {
            return (now + BUSY_RECHECK, Expiry::Recheck);
        }
        if let Some(t) = *self.head_since.lock().unwrap_or_else(|p| p.into_inner()) {
            return (t + HEADER_READ, Expiry::Drop);
        }
        let idle = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        if retiring {
            return (idle + RETIRE_IDLE_GRACE, Expiry::Close);
        }
        if self.requests.load(Ordering::SeqCst) == 0 {
            (self.accepted + HEADER_READ, Expiry::Drop)
        } else {
            (idle + KEEP_ALIVE_IDLE, Expiry::Close)
        }
    }

    /// Whether it speaks HTTP/2.
    pub fn is_h2(&self) -> bool {
        self.h2.load(Ordering::SeqCst)
    }
}

/// Bytes the kernel holds in the socket's send queue, not yet taken by the client
/// (`SIOCOUTQ`); 0 when it cannot say.
fn unsent_bytes(fd: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(2) SIOCOUTQ on a socket descriptor writes one int, which lives on the stack.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    if r == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        if self.unread.load(Ordering::SeqCst) {
            crate::heap::trim();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expiry {
    /// Nothing is due: look again.
    Recheck,
    /// An idle connection: close it gracefully.
    Close,
    /// A request head that did not arrive in time: drop the connection.
    Drop,
    /// The client has taken nothing of an answer (nor of a write) for [`UNREAD`]: drop the
    /// connection, and what waits for it with it.
    Unread,
}

/// The connection's socket, noticing when bytes arrive (the start of a request head).
pub struct Watched<S> {
    pub inner: S,
    pub state: Arc<ConnState>,
    pub app: Arc<App>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.bytes_arrived(&self.app);
        }
        r
    }
}

impl<S> Watched<S> {
    fn wrote_or_waits(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending => self.state.write_waits(),
            Poll::Ready(Ok(n)) => self.state.wrote(*n),
            Poll::Ready(Err(_)) => {}
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote_or_waits(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote_or_waits(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Counts a request in flight for as long as it lives, even when hyper drops the request's
/// future early.
pub struct RequestGuard {
    pub app: Arc<App>,
    conn: Arc<ConnState>,
    pub arrived: Instant,
}

impl RequestGuard {
    /// A request (`h2`: on an HTTP/2 connection) starts.
    pub fn enter(app: Arc<App>, conn: Arc<ConnState>, h2: bool) -> RequestGuard {
        let arrived = conn.request_started(&app, h2);
        RequestGuard { app, conn, arrived }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.conn.request_done(&self.app);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_on_writes_ends_with_real_progress_not_with_a_trickle() {
        let c = ConnState::new(None);
        assert_eq!(c.stalled_since(), None);
        c.write_waits();
        let since = c.stalled_since().expect("a write waits");
        // The few bytes a full receive buffer lets through now and then do not end it.
        for _ in 0..10 {
            c.wrote(100);
            c.write_waits();
        }
        assert_eq!(c.stalled_since(), Some(since));
        c.wrote(WAITING_PROGRESS as usize);
        assert_eq!(c.stalled_since(), None, "64 KiB went: the client reads");
    }

    #[test]
    fn an_answer_waits_on_the_client_from_each_frame_it_gave_until_asked_for_the_next() {
        let c = ConnState::new(None);
        let (a, b) = (c.new_answer(), c.new_answer());
        c.answer_waits(a);
        let since = c.stalled_since().unwrap();
        c.answer_waits(b);
        c.answer_waits(a);
        assert_eq!(c.stalled_since(), Some(since), "the oldest wait counts");
        c.answer_moves(a);
        assert!(c.stalled_since().unwrap() >= since);
        c.answer_moves(b);
        assert_eq!(c.stalled_since(), None);
        // The earlier deadline wins: a new connection's head (10 s) before Unread (60 s).
        c.answer_waits(a);
        assert_eq!(c.deadline(false), (c.accepted + HEADER_READ, Expiry::Drop));
    }
}
