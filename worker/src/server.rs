//! The accept loop and the connections.
//!
//! A new connection is accepted only while no request is being worked on here (with
//! batching: fewer than `max_batch_size`; see [`Counters::can_accept`]), so that an idle
//! sibling sharing the listening socket takes it instead; connections still sending their request, or idle between requests, do not count.
//! And while this worker has something in hand (a request, or a connection just taken whose
//! request is on its way), it leaves a waiting connection to a sibling that the idle board
//! (`vramfork::board`) shows free or taking, for at most [`DEFER_AT_MOST`].
//! After each accept the loop lets the new connection read what it has before deciding on
//! the next one. When connections have waited in the listen queue for a while
//! (`state::QUEUED_FOR`), answers carry `Connection: close` (`Shared::must_close`), so that a
//! keep-alive client goes to the back of the queue rather than holding a worker while others
//! wait.
//!
//! Deadlines per connection (`timeouts.rs`): a request head must arrive within
//! [`HEADER_READ`] of its first byte (a new connection's within [`HEADER_READ`] of its
//! accept), or the connection is dropped; an idle kept-alive connection is closed after
//! [`KEEP_ALIVE_IDLE`]. While the worker retires, an idle connection is closed once it has
//! been idle for [`RETIRE_IDLE_GRACE`]; one whose next request is under way is answered
//! (with `Connection: close`) first, so no request in transit is cut off.
//!
//! [`Counters::can_accept`]: crate::state::Counters::can_accept

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::app::App;
use crate::http::dispatch;
use crate::http::request::Arrived;
use crate::state::FRESH_FOR;
use crate::timeouts::{HEADER_READ, KEEP_ALIVE_IDLE, RETIRE_IDLE_GRACE};

/// How often a connection with a request in flight re-checks its deadlines.
const BUSY_RECHECK: Duration = Duration::from_secs(1);

/// How often a worker that leaves a waiting connection to a free sibling looks again.
const DEFER_RECHECK: Duration = Duration::from_millis(1);
/// How long at most a worker leaves waiting connections to a sibling that shows free but
/// does not take them (a sibling starved of CPU, or stopped): then it takes them itself.
const DEFER_AT_MOST: Duration = Duration::from_millis(250);

/// Runs until the worker is retired and drained (or the deadline passes).
pub async fn serve(listener: AsyncFd<std::net::TcpListener>, app: Arc<App>, graceful: Duration) {
    let shared = app.shared.clone();
    let fd = listener.as_raw_fd();
    shared.set_listener(Some(fd));
    let mut rx = shared.subscribe();
    let (max, concurrency) = (shared.max_requests, shared.concurrency);
    // Since when this worker has been leaving waiting connections to a free sibling.
    let mut deferring: Option<Instant> = None;
    loop {
        let stop = match rx
            .wait_for(|c| c.stopping() || c.can_accept(max, concurrency))
            .await
        {
            Ok(c) => c.stopping(),
            Err(_) => true,
        };
        if stop {
            break;
        }
        let mut guard = tokio::select! {
            ready = listener.readable() => match ready {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!("waiting on the listening socket failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = rx.wait_for(|c| c.stopping() || !c.can_accept(max, concurrency)) => continue,
        };
        if shared.defer_to_sibling() {
            if !crate::listen_queue::readable(fd) {
                // Taken by someone else: wait for the next connection.
                guard.clear_ready();
                deferring = None;
                continue;
            }
            let since = *deferring.get_or_insert_with(Instant::now);
            if since.elapsed() < DEFER_AT_MOST {
                drop(guard);
                tokio::select! {
                    _ = tokio::time::sleep(DEFER_RECHECK) => {}
                    _ = rx.changed() => {}
                }
                continue;
            }
            tracing::info!(
                "a sibling shows free but has left a connection waiting for {DEFER_AT_MOST:?}; taking it"
            );
        }
        deferring = None;
        shared.show_taking();
        match guard.try_io(|l| crate::listen_queue::accept(l.get_ref())) {
            Ok(Ok(stream)) => {
                let waited = crate::listen_queue::waited(&stream);
                let stream = match TcpStream::from_std(stream) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("cannot register an accepted connection: {e}");
                        shared.show_state();
                        continue;
                    }
                };
                let conn = ConnState::new(waited);
                shared.update(|c| {
                    c.open += 1;
                    c.awaiting += 1;
                    c.fresh += 1;
                });
                tokio::spawn(connection(stream, app.clone(), conn));
                // Let the new connection read its request (and count as work) before
                // the next accept decision.
                tokio::task::yield_now().await;
            }
            Ok(Err(e)) => {
                // EMFILE and friends: back off briefly rather than spin.
                shared.show_state();
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Nothing waiting after all (a sibling took it).
            Err(_would_block) => shared.show_state(),
        }
    }
    shared.set_listener(None);
    drop(listener);
    tracing::info!("stopped accepting; draining");
    let drained = tokio::time::timeout(graceful, rx.wait_for(|c| c.drained())).await;
    if drained.is_err() {
        let c = shared.get();
        tracing::warn!(
            open = c.open,
            in_flight = c.in_flight,
            "graceful timeout passed; exiting anyway"
        );
    }
}

/// What a connection is doing, for its deadlines and the worker's counters.
struct ConnState {
    accepted: Instant,
    /// When its first request arrived, if it was already waiting in the listen queue (over
    /// TLS: when the ClientHello did, moved on by the handshake's time).
    queued_since: Mutex<Option<Instant>>,
    /// Counted in `Counters::awaiting`.
    awaiting: AtomicBool,
    /// When bytes of a request head that is not a request yet began to arrive.
    head_since: Mutex<Option<Instant>>,
    in_request: AtomicBool,
    /// Counted in `Counters::fresh`: accepted less than `FRESH_FOR` ago, first request not
    /// answered yet.
    fresh: AtomicBool,
    requests: AtomicU64,
    /// When the last request was answered (or the connection accepted).
    idle_since: Mutex<Instant>,
}

impl ConnState {
    fn new(queued: Option<Duration>) -> Arc<ConnState> {
        let now = Instant::now();
        Arc::new(ConnState {
            accepted: now,
            queued_since: Mutex::new(queued.map(|q| now - q)),
            awaiting: AtomicBool::new(true),
            head_since: Mutex::new(None),
            in_request: AtomicBool::new(false),
            fresh: AtomicBool::new(true),
            requests: AtomicU64::new(0),
            idle_since: Mutex::new(now),
        })
    }

    /// Bytes arrived: outside a request, they begin the next request's head.
    fn bytes_arrived(&self, app: &App) {
        if self.in_request.load(Ordering::SeqCst) {
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
    fn request_started(&self, app: &App) -> Instant {
        let now = Instant::now();
        self.in_request.store(true, Ordering::SeqCst);
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
        self.in_request.store(false, Ordering::SeqCst);
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
    fn handshake_took(&self, d: Duration) {
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
    fn closed(&self, app: &App) {
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

    /// No longer counts as a connection whose first request is on its way.
    fn stale(&self, app: &App) {
        if self.fresh.swap(false, Ordering::SeqCst) {
            app.shared.update(|c| c.fresh -= 1);
        }
    }

    /// The connection's next deadline and what happens then, given whether the worker is
    /// retiring.
    fn deadline(&self, retiring: bool) -> (Instant, Expiry) {
        let now = Instant::now();
        if self.in_request.load(Ordering::SeqCst) {
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
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expiry {
    /// Nothing is due: look again.
    Recheck,
    /// An idle connection: close it gracefully.
    Close,
    /// A request head that did not arrive in time: drop the connection.
    Drop,
}

async fn connection(stream: TcpStream, app: Arc<App>, state: Arc<ConnState>) {
    let _ = stream.set_nodelay(true);
    let fd = stream.as_raw_fd();
    let Some(tls) = app.tls.clone() else {
        return serve_http(stream, fd, app, state).await;
    };
    // The handshake runs under the deadline of a new connection's request head: a client
    // that stalls in it is dropped as one that stalls in its head is, and until its request
    // arrives it counts as a connection awaiting its head (`Counters::can_accept`), not as a
    // request worked on, so the worker goes on accepting others.
    // Like a silent plain connection, one stalled in its handshake stops counting as work in
    // hand after `FRESH_FOR` (the worker shows free again on the idle board).
    let started = Instant::now();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
    let handshake = tokio::time::timeout_at(
        (state.accepted + HEADER_READ).into(),
        acceptor.accept(stream),
    );
    tokio::pin!(handshake);
    let done = loop {
        tokio::select! {
            r = &mut handshake => break r,
            _ = tokio::time::sleep_until((state.accepted + FRESH_FOR).into()),
                if state.fresh.load(Ordering::SeqCst) => state.stale(&app),
        }
    };
    match done {
        Ok(Ok(stream)) => {
            state.handshake_took(started.elapsed());
            serve_http(stream, fd, app, state).await
        }
        Ok(Err(e)) => {
            let e = e.to_string();
            if vramfork::tls::is_certificate_refusal(&e) {
                tracing::info!(
                    "TLS handshake failed: {}",
                    vramfork::tls::handshake_failure(&e)
                );
            } else {
                tracing::debug!("TLS handshake failed: {e}");
            }
            state.closed(&app);
        }
        Err(_) => {
            tracing::debug!("TLS handshake not complete within {HEADER_READ:?}: dropped");
            state.closed(&app);
        }
    }
}

/// Serves HTTP/1.1 on a connection (plain, or TLS after the handshake) until it ends.
async fn serve_http<S>(stream: S, fd: std::os::fd::RawFd, app: Arc<App>, state: Arc<ConnState>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = app.shared.clone();
    let app_for_state = app.clone();
    let io = Watched {
        inner: stream,
        state: state.clone(),
        app: app.clone(),
    };
    let svc = {
        let state = state.clone();
        service_fn(move |mut req| {
            let guard = RequestGuard::enter(app.clone(), state.clone());
            req.extensions_mut().insert(Arrived(guard.arrived));
            async move {
                let resp = dispatch::handle(req, guard.app.clone()).await;
                drop(guard);
                resp
            }
        })
    };
    // Our own deadlines (above) replace hyper's header timer, which would also close an
    // idle kept-alive connection after the header deadline.
    // A client may shut its sending side once its request is out (half-close) and still
    // wait for the answer: without `half_close` hyper drops such a request unanswered.
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .half_close(true)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut stop_rx = shared.subscribe_stop();
    let mut retiring = false;
    let mut closing = false;
    loop {
        let (at, expiry) = state.deadline(retiring);
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!("connection ended: {e}");
                }
                break;
            }
            _ = tokio::time::sleep_until(at.into()), if !closing => {
                // Deadlines only move later with activity: act on this one if it still
                // stands, and never close under a request whose bytes have arrived but are
                // not read yet.
                if state.deadline(retiring) != (at, expiry) || crate::listen_queue::readable(fd) {
                    continue;
                }
                match expiry {
                    Expiry::Recheck => {}
                    Expiry::Close => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    Expiry::Drop => break,
                }
            }
            // Retiring shortens the idle deadline: look again.
            _ = stop_rx.wait_for(|stopping| *stopping), if !retiring => retiring = true,
            _ = tokio::time::sleep_until((state.accepted + FRESH_FOR).into()),
                if state.fresh.load(Ordering::SeqCst) => state.stale(&app_for_state),
        }
    }
    state.closed(&app_for_state);
}

/// The connection's socket, noticing when bytes arrive (the start of a request head).
struct Watched<S> {
    inner: S,
    state: Arc<ConnState>,
    app: Arc<App>,
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

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
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
struct RequestGuard {
    app: Arc<App>,
    conn: Arc<ConnState>,
    arrived: Instant,
}

impl RequestGuard {
    fn enter(app: Arc<App>, conn: Arc<ConnState>) -> RequestGuard {
        let arrived = conn.request_started(&app);
        RequestGuard { app, conn, arrived }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.conn.request_done(&self.app);
    }
}
