//! The accept loop and the connections. A new connection is accepted only while this worker
//! could start on it at once (no request in flight, no connection accepted in the last
//! [`FRESH_GRACE`] still silent, and within what is left of `max_requests`), so that an idle
//! sibling sharing the listening socket takes it instead. A connection that stays silent
//! longer (a browser's speculative connection, a health checker's idle one) stops holding
//! the accept loop back. Retiring stops accepting (the listener is dropped), closes idle
//! connections, lets busy ones finish, and returns once none is left or the graceful
//! deadline passes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::routes::{self, App};
use crate::timeouts::{FRESH_GRACE, HEADER_READ, KEEP_ALIVE_IDLE};

/// Runs until the worker is retired and drained (or the deadline passes).
pub async fn serve(listener: TcpListener, app: Arc<App>, graceful: Duration) {
    let shared = app.shared.clone();
    let mut rx = shared.subscribe();
    let max = shared.max_requests;
    loop {
        let stop = match rx.wait_for(|c| c.stopping() || c.can_accept(max)).await {
            Ok(c) => c.stopping(),
            Err(_) => true,
        };
        if stop {
            break;
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    shared.update(|c| { c.open += 1; c.fresh += 1; });
                    tokio::spawn(connection(stream, app.clone()));
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = rx.wait_for(|c| c.stopping() || !c.can_accept(max)) => {}
        }
    }
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

/// Per-connection activity, for the idle deadlines.
struct ConnState {
    /// Counted in `Counters::fresh` (accepted, silent, younger than FRESH_GRACE).
    fresh: AtomicBool,
    started: AtomicBool,
    busy: AtomicBool,
    last: Mutex<Instant>,
}

async fn connection(stream: TcpStream, app: Arc<App>) {
    let _ = stream.set_nodelay(true);
    let shared = app.shared.clone();
    let conn_state = Arc::new(ConnState {
        fresh: AtomicBool::new(true),
        started: AtomicBool::new(false),
        busy: AtomicBool::new(false),
        last: Mutex::new(Instant::now()),
    });
    let svc = {
        let conn_state = conn_state.clone();
        service_fn(move |req| {
            let guard = RequestGuard::enter(app.clone(), conn_state.clone());
            async move {
                let resp = routes::handle(req, guard.app.clone()).await;
                drop(guard);
                resp
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let mut stop_rx = shared.subscribe();
    let mut closing = false;
    let accepted = tokio::time::Instant::now();
    let mut stop_at: Option<tokio::time::Instant> = None;
    let grace = tokio::time::sleep(FRESH_GRACE);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            _ = &mut grace, if conn_state.fresh.load(Ordering::SeqCst) => {
                if conn_state.fresh.swap(false, Ordering::SeqCst) {
                    shared.update(|c| c.fresh -= 1);
                }
            }
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!("connection ended: {e}");
                }
                break;
            }
            _ = stop_rx.wait_for(|c| c.stopping()), if !closing && stop_at.is_none() => {
                // A connection accepted moments ago has a request on its way: let it
                // arrive (and be answered) rather than reset it.
                if conn_state.fresh.load(Ordering::SeqCst) {
                    stop_at = Some(accepted + FRESH_GRACE);
                } else {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            _ = sleep_until(stop_at), if !closing && stop_at.is_some() => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = idle_expired(&conn_state), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
    let fresh = conn_state.fresh.swap(false, Ordering::SeqCst);
    shared.update(|c| {
        c.open -= 1;
        if fresh {
            c.fresh -= 1;
        }
    });
}

/// Sleeps until `at` (forever when `None`; the select branch is disabled then anyway).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Resolves when the connection has been idle past its deadline: [`HEADER_READ`] before
/// its first request, [`KEEP_ALIVE_IDLE`] between requests.
async fn idle_expired(s: &ConnState) {
    loop {
        let limit = if s.started.load(Ordering::SeqCst) {
            KEEP_ALIVE_IDLE
        } else {
            HEADER_READ
        };
        let deadline = *s.last.lock().unwrap_or_else(|p| p.into_inner()) + limit;
        if !s.busy.load(Ordering::SeqCst) && Instant::now() >= deadline {
            return;
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        tokio::time::sleep(wait).await;
    }
}

/// Counts a request in flight (and its connection as no longer fresh) for as long as it
/// lives, even when hyper drops the request's future early.
struct RequestGuard {
    app: Arc<App>,
    conn: Arc<ConnState>,
}

impl RequestGuard {
    fn enter(app: Arc<App>, conn: Arc<ConnState>) -> RequestGuard {
        conn.started.store(true, Ordering::SeqCst);
        let first = conn.fresh.swap(false, Ordering::SeqCst);
        conn.busy.store(true, Ordering::SeqCst);
        app.shared.update(|c| {
            c.in_flight += 1;
            if first {
                c.fresh -= 1;
            }
        });
        RequestGuard { app, conn }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        *self.conn.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.conn.busy.store(false, Ordering::SeqCst);
        self.app.shared.update(|c| c.in_flight -= 1);
    }
}
