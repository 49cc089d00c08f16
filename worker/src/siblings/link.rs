//! The links between siblings: each worker listens on a Unix socket of its own in the
//! abstract namespace, named after the idle board and its seat (`vramfork-<board>-<seat>`:
//! no file to clean up, gone with the process), and serves what siblings hand it there over
//! HTTP/2 without TLS, one long-lived connection per sibling. Only processes of the same
//! user may connect (`SO_PEERCRED`): a link is served without the TLS client-certificate
//! check of the serving port (token auth, when on, is checked again). A retiring worker
//! closes its links as its client connections (GOAWAY: what a sibling has sent is
//! answered, nothing new is taken) and counts them until they are gone
//! ([`crate::state::Counters::links`]).

use std::convert::Infallible;
use std::future::Future;
use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::header::{HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

use super::Handing;
use crate::state::Shared;

/// HTTP/2 flow-control windows of links and of the serving port's HTTP/2 connections: a
/// request or answer of up to this many bytes goes without waiting for a window update.
pub const STREAM_WINDOW: u32 = 4 << 20;
pub const CONNECTION_WINDOW: u32 = 16 << 20;

/// Headers a request handed on does not carry over as they came: set anew, or meaningless
/// on another connection.
const NOT_CARRIED: [&str; 6] = [
    "grpc-timeout",
    "x-request-id",
    "content-length",
    "host",
    "connection",
    "keep-alive",
];

/// The abstract socket name of the worker on `seat` of the board `board`.
pub fn name(board: u64, seat: u32) -> String {
    format!("vramfork-{board:x}-{seat}")
}

/// Binds this worker's socket.
pub fn bind(name: &str) -> std::io::Result<tokio::net::UnixListener> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let l = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(l)
}

/// Serves the links siblings open to this worker until it stops: each connection, when its
/// peer runs as this user, is served by `handle` over HTTP/2 and closed (GOAWAY) once the
/// worker stops.
pub async fn serve<F, Fut, B>(listener: tokio::net::UnixListener, shared: Arc<Shared>, handle: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut stop = shared.subscribe_stop();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("accepting a sibling's link failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match stream.peer_cred() {
            Ok(c) if c.uid() == me => {}
            other => {
                tracing::warn!("refused a link from another user ({other:?})");
                continue;
            }
        }
        shared.update(|c| c.links += 1);
        tokio::spawn(serve_one(stream, shared.clone(), handle.clone()));
    }
}

async fn serve_one<F, Fut, B>(stream: UnixStream, shared: Arc<Shared>, handle: F)
where
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let counted = shared.clone();
    let svc = service_fn(move |req| {
        // In flight until answered, as a client's request: the worker drains it.
        let guard = InFlight::enter(counted.clone());
        let answer = handle(req);
        async move {
            let r = answer.await;
            drop(guard);
            r
        }
    });
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let mut stop = shared.subscribe_stop();
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("a sibling's link ended: {e}");
                }
                break;
            }
            _ = stop.wait_for(|s| *s), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
    shared.update(|c| c.links -= 1);
}

/// Counts a handed-in request in flight (`Counters::in_flight`) while it lives.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: Arc<Shared>) -> InFlight {
        shared.update(|c| c.in_flight += 1);
        InFlight(shared)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.update(|c| c.in_flight -= 1);
    }
}

/// A new link to the worker on `seat` (`None`: it does not listen, or is gone).
pub async fn connect(board: u64, seat: u32) -> Option<SendRequest<Full<Bytes>>> {
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(name(board, seat).as_bytes()).ok()?;
    // A Unix socket's connect completes at once while its listener's queue has room (a
    // sibling's queue holds at most one link per sibling).
    let std = match std::os::unix::net::UnixStream::connect_addr(&addr) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("no link to seat {seat}: {e}");
            return None;
        }
    };
    std.set_nonblocking(true).ok()?;
    let stream = UnixStream::from_std(std).ok()?;
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| tracing::debug!("link to seat {seat}: {e}"))
        .ok()?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("link to seat {seat} ended: {e}");
        }
    });
    Some(send)
}

/// The request a sibling gets: the client's headers (less [`NOT_CARRIED`]), the id, this
/// worker's `traceparent`, what is left of the deadline, the message as it came.
pub fn request(h: &Handing<'_>) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
    let mut req = Request::post(format!("http://vramfork-sibling{}", h.path))
        .body(Full::new(h.framed.clone()))?;
    let headers = req.headers_mut();
    for (k, v) in h.headers {
        if !NOT_CARRIED.contains(&k.as_str()) {
            headers.append(k.clone(), v.clone());
        }
    }
    headers.insert(
        crate::observe::trace_context::HEADER.clone(),
        h.traceparent.clone(),
    );
    if let Ok(id) = HeaderValue::from_str(h.id) {
        headers.insert(HeaderName::from_static("x-request-id"), id);
    }
    if let Some(at) = h.deadline {
        let left = at.saturating_duration_since(Instant::now());
        headers.insert(HeaderName::from_static("grpc-timeout"), timeout_value(left));
    }
    Ok(req)
}

/// `d` as a `grpc-timeout` value (what a request handed to a sibling has left).
pub fn timeout_value(d: Duration) -> HeaderValue {
    let us = d.as_micros().max(1);
    let v = if us < 100_000_000 {
        format!("{us}u")
    } else {
        format!("{}m", (us / 1000).min(99_999_999))
    };
    HeaderValue::from_str(&v).expect("digits and a unit are a valid header value")
}

/// Whether a failed hand-off never reached the sibling's handler: the link was closed
/// before it went out, or the sibling refused the stream (it is closing its links).
pub fn never_sent(e: &hyper::Error) -> bool {
    if e.is_canceled() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        source = s.source();
    }
    false
}
