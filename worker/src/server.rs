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
//! (`QUEUED_FOR`, `state/queue.rs`), answers carry `Connection: close` (`Shared::must_close`), so that a
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

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Either;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::app::App;
use crate::conn::{ConnState, Expiry, RequestGuard, Watched};
use crate::grpc;
use crate::head::{Arrived, Closer};
use crate::http::dispatch;
use crate::outgoing::Outgoing;
use crate::siblings::link::{CONNECTION_WINDOW, STREAM_WINDOW};
use crate::state::FRESH_FOR;
use crate::timeouts::HEADER_READ;

/// HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS` on the serving port: requests one client
/// connection may have in flight at once. A cap does not spread a client over workers
/// (grpcio queues calls past it rather than open another connection); what it bounds is
/// the bodies one connection holds at once (each at most `--max-body-mb`). 100 is what RFC
/// 9113 recommends as the least, and what grpcio and Go servers take in stride.
pub const MAX_CONCURRENT_STREAMS: u32 = 100;

/// How often a connection that has asked to close (GOAWAY, or `Connection: close` on an
/// idle HTTP/1.1 one) looks again whether its client has stopped reading, and one whose
/// deadline passed with bytes not read yet looks again at it.
const CLOSING_RECHECK: Duration = Duration::from_secs(1);

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

/// Serves a connection (plain, or TLS after the handshake) until it ends: HTTP/1.1, or
/// HTTP/2 when it opens with HTTP/2's preface (prior knowledge, as gRPC clients without TLS
/// send it; under TLS after ALPN `h2`). gRPC calls go to `grpc/`, everything else to the
/// REST dispatch.
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
    let closer = Closer(Arc::new(tokio::sync::Notify::new()));
    let svc = {
        let (state, closer) = (state.clone(), closer.clone());
        service_fn(move |mut req: Request<Incoming>| {
            let h2 = req.version() == Version::HTTP_2;
            let guard = RequestGuard::enter(app.clone(), state.clone(), h2);
            req.extensions_mut().insert(Arrived(guard.arrived));
            req.extensions_mut().insert(closer.clone());
            let conn = state.clone();
            async move {
                let resp = if grpc::is_grpc(&req) {
                    grpc::handle(req, guard.app.clone())
                        .await
                        .map(|r| r.map(Either::Right))
                } else {
                    dispatch::handle(req, guard.app.clone())
                        .await
                        .map(|r| r.map(Either::Left))
                };
                drop(guard);
                resp.map(|r| r.map(|b| Outgoing::new(b, conn)))
            }
        })
    };
    let builder = protocols();
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut stop_rx = shared.subscribe_stop();
    let mut retiring = false;
    let mut closing = false;
    let mut held: Option<Instant> = None;
    loop {
        // Once closing, only a deadline that drops the connection still matters.
        let (due, expiry) = match state.deadline(retiring) {
            (_, Expiry::Close) if closing => (Instant::now() + CLOSING_RECHECK, Expiry::Recheck),
            d => d,
        };
        // A deadline held back by bytes not read yet is looked at again a little later.
        let at = held.map_or(due, |h| due.max(h));
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    if let Some(why) = crate::closes::of_error(&*e) {
                        crate::closes::closed(&app_for_state, why);
                    }
                    tracing::debug!("connection ended: {e}");
                }
                break;
            }
            _ = tokio::time::sleep_until(at.into()) => {
                match at_deadline(&state, &app_for_state, fd, retiring, (due, expiry), &mut held) {
                    AtDeadline::Nothing => {}
                    AtDeadline::Close => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    AtDeadline::Drop => break,
                }
            }
            // Retiring shortens the idle deadline: look again. An HTTP/2 connection says
            // GOAWAY at once (its requests in flight are answered): a client that keeps
            // requests in flight would never leave it idle.
            _ = stop_rx.wait_for(|stopping| *stopping), if !retiring => {
                retiring = true;
                if state.is_h2() && !closing {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            // An answer asked for GOAWAY (HTTP/2's `Connection: close`).
            _ = closer.0.notified(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tokio::time::sleep_until((state.accepted + FRESH_FOR).into()),
                if state.fresh.load(Ordering::SeqCst) => state.stale(&app_for_state),
        }
    }
    state.closed(&app_for_state);
}

/// What a connection does when its deadline comes.
enum AtDeadline {
    Nothing,
    /// Close gracefully (GOAWAY, or `Connection: close`).
    Close,
    Drop,
}

/// The connection's deadline `due` came: act on it if it still stands (deadlines only move
/// later with activity). A client that read nothing of what waits for it is dropped
/// whatever it sends; otherwise nothing closes under a request whose bytes have arrived but
/// are not read yet: that deadline is `held` back and looked at again a little later.
fn at_deadline(
    state: &ConnState,
    app: &App,
    fd: std::os::fd::RawFd,
    retiring: bool,
    due: (Instant, Expiry),
    held: &mut Option<Instant>,
) -> AtDeadline {
    if state.deadline(retiring) != due {
        return AtDeadline::Nothing;
    }
    if due.1 == Expiry::Unread {
        // Writes that waited but whose bytes have all gone since: look again.
        if state.writes_drained(fd) {
            return AtDeadline::Nothing;
        }
        state.unread(app);
        return AtDeadline::Drop;
    }
    if crate::listen_queue::readable(fd) {
        *held = Some(Instant::now() + CLOSING_RECHECK);
        return AtDeadline::Nothing;
    }
    *held = None;
    match due.1 {
        Expiry::Recheck => AtDeadline::Nothing,
        Expiry::Close => AtDeadline::Close,
        Expiry::Drop | Expiry::Unread => AtDeadline::Drop,
    }
}

/// HTTP/1.1 and HTTP/2 as the serving port speaks them. Our own deadlines (`conn.rs`)
/// replace hyper's header timer, which would also close an idle kept-alive connection
/// after the header deadline. A client may shut its sending side once its request is out
/// (half-close) and still wait for the answer: without `half_close` hyper drops such a
/// request unanswered.
fn protocols() -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().keep_alive(true).half_close(true);
    builder
        .http2()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    builder
}
