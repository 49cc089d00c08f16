//! Handing gRPC requests to idle siblings: per-request balancing for clients that multiplex.
//!
//! gRPC runs over HTTP/2, where a client opens one connection and sends all its requests on
//! it as streams; pre-forked workers that share one listening socket balance by connection,
//! so all of one client's requests would land on the worker that accepted its connection
//! while its siblings idle. Closing the connection does not help (a client moves only the
//! requests it has not sent, and reconnecting per call costs more than a forward), nor does
//! `SETTINGS_MAX_CONCURRENT_STREAMS` (grpcio queues calls rather than open a second
//! connection). So a worker that would queue a unary request (`ModelInfer`) while the idle
//! board shows a sibling free **hands it to that sibling**: the request's message, headers
//! (its `traceparent` this worker's: the sibling's spans are children of this worker's),
//! id and what is left of its deadline go over a connection between the two (HTTP/2
//! without TLS on a Unix socket of the sibling's, [`link`]), and the sibling's answer —
//! headers, message, status — is relayed to the client as it arrives. The sibling serves
//! it as its own (counts it towards `--max-requests`, logs and counts it, its pid in
//! `x-worker-pid`) and never hands it on again. A client cancelling its call resets the
//! relayed stream, which withdraws the request at the sibling if it has not started.
//!
//! When: at once, when the request arrives at a worker already working on as many requests
//! as it takes ([`crate::state::Shared::would_queue`]); and later, while it waits for the
//! model unstarted behind others, as soon as a sibling shows free ([`Siblings::turn`]: one
//! watcher task looks at the board every [`POLL`] while requests wait, and wakes one of
//! them per free sibling). A worker hands each sibling one request at a time: a sibling it
//! has handed a request to and that has not answered yet is not picked again, even while
//! the board still shows it free. `ModelStreamInfer` streams stay on their worker (their
//! answers must keep the requests' order).

pub mod link;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::Response;
use tokio::sync::Notify;
use vramfork::board::SEATS;

use crate::state::Shared;

/// How often the board is looked at while requests wait unstarted for the model here.
pub const POLL: Duration = Duration::from_millis(1);

/// This worker's side of the hand-off: the links it opened to siblings, the requests it
/// has handed to each, and the requests waiting for a sibling.
pub struct Siblings {
    shared: Arc<Shared>,
    seat: u32,
    board_id: u64,
    /// Requests handed to each seat and not answered yet.
    handed: Vec<AtomicU32>,
    /// Open links to siblings, by seat.
    links: Mutex<Vec<(u32, SendRequest<Full<Bytes>>)>>,
    /// Requests waiting unstarted behind others here, in [`Siblings::turn`].
    waiting: AtomicUsize,
    /// Wakes the watcher when a request begins to wait.
    wake_watcher: Notify,
    /// Wakes one waiting request per sibling seen free.
    free_seen: Notify,
}

/// A sibling picked for one request: counted as handed one until this is dropped (its
/// answer's head arrived, or the hand-off was given up).
pub struct Reserved {
    siblings: Arc<Siblings>,
    pub seat: u32,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.siblings.handed[self.seat as usize].fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a request handed to a sibling carries besides its message.
pub struct Handing<'a> {
    /// The gRPC method's path (`/inference.GRPCInferenceService/ModelInfer`).
    pub path: &'a str,
    /// The client's headers (metadata: `authorization`, custom ones).
    pub headers: &'a HeaderMap,
    /// The request's id, as this worker took or made it.
    pub id: &'a str,
    /// The client's deadline, if it gave one: what is left of it goes as `grpc-timeout`.
    pub deadline: Option<Instant>,
    /// The request's message, framed as it arrived.
    pub framed: Bytes,
    /// `traceparent` for the sibling: this worker's span of the call (it replaces the
    /// client's), so that the sibling's spans are its children in the caller's trace.
    pub traceparent: HeaderValue,
}

/// How a hand-off ended.
pub enum Handed {
    /// The sibling's answer (its head; the body follows).
    Answered(Response<Incoming>),
    /// The sibling never took the request (no link, or it refused the stream): serve it
    /// here.
    NotTaken,
    /// The link broke after the request went out: the sibling may have run it.
    Lost(u32),
}

impl Siblings {
    /// The hand-off for the worker on `seat` of the board with id `board_id`; its watcher is
    /// started by [`Siblings::start`].
    pub fn new(shared: Arc<Shared>, seat: u32, board_id: u64) -> Arc<Siblings> {
        Arc::new(Siblings {
            shared,
            seat,
            board_id,
            handed: (0..SEATS).map(|_| AtomicU32::new(0)).collect(),
            links: Mutex::new(Vec::new()),
            waiting: AtomicUsize::new(0),
            wake_watcher: Notify::new(),
            free_seen: Notify::new(),
        })
    }

    /// Starts the watcher (on the worker's runtime).
    pub fn start(self: &Arc<Self>) {
        tokio::spawn(watch(self.clone()));
    }

    /// The name of this worker's own socket, where siblings hand it requests.
    pub fn own_address(&self) -> String {
        link::name(self.board_id, self.seat)
    }

    /// The free siblings this worker has no request handed to, from the seat after its own.
    fn candidates(&self) -> impl Iterator<Item = u32> + '_ {
        self.shared
            .board()
            .into_iter()
            .flat_map(|(board, mine)| board.free_others(mine))
            .filter(|s| self.handed[*s as usize].load(Ordering::SeqCst) == 0)
    }

    /// A free sibling for one request, if the board shows one this worker has not handed a
    /// request to yet.
    pub fn reserve(self: &Arc<Self>) -> Option<Reserved> {
        let seat = self.candidates().next()?;
        self.handed[seat as usize].fetch_add(1, Ordering::SeqCst);
        Some(Reserved {
            siblings: self.clone(),
            seat,
        })
    }

    /// Resolves with a free sibling once one shows while this request waits behind others
    /// for the model here (the pipeline then withdraws it, if it has not started).
    pub async fn turn(self: Arc<Self>) -> Reserved {
        let _waiting = Waiting::enter(&self);
        loop {
            if self.shared.queue_behind() {
                if let Some(r) = self.reserve() {
                    return r;
                }
            }
            self.free_seen.notified().await;
        }
    }

    /// Hands a request to the sibling `to` reserved for it.
    pub async fn hand(&self, to: &Reserved, h: Handing<'_>) -> Handed {
        let link = match self.link(to.seat).await {
            Some(l) => l,
            None => return Handed::NotTaken,
        };
        let req = match link::request(&h) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("could not hand a request to seat {}: {e}", to.seat);
                return Handed::NotTaken;
            }
        };
        let mut link = link;
        match link.send_request(req).await {
            Ok(resp) => Handed::Answered(resp),
            Err(e) => {
                self.forget(to.seat);
                if link::never_sent(&e) {
                    tracing::debug!("seat {} did not take a request: {e}", to.seat);
                    Handed::NotTaken
                } else {
                    tracing::warn!("the link to seat {} broke under a request: {e}", to.seat);
                    Handed::Lost(to.seat)
                }
            }
        }
    }

    /// An open link to `seat`: the one kept, else a new one.
    async fn link(&self, seat: u32) -> Option<SendRequest<Full<Bytes>>> {
        let kept = {
            let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
            links
                .iter()
                .find(|(s, _)| *s == seat)
                .map(|(_, l)| l.clone())
        };
        if let Some(l) = kept.filter(|l| !l.is_closed()) {
            return Some(l);
        }
        self.forget(seat);
        let l = link::connect(self.board_id, seat).await?;
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((seat, l.clone()));
        Some(l)
    }

    fn forget(&self, seat: u32) {
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(s, _)| *s != seat);
    }
}

/// Counts a request in [`Siblings::turn`] while it waits there.
struct Waiting<'a>(&'a Siblings);

impl<'a> Waiting<'a> {
    fn enter(s: &'a Siblings) -> Waiting<'a> {
        if s.waiting.fetch_add(1, Ordering::SeqCst) == 0 {
            s.wake_watcher.notify_one();
        }
        Waiting(s)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// While requests wait, looks at the board every [`POLL`] and wakes one waiting request per
/// free sibling it has not handed one to; idle (no timer) while none waits.
async fn watch(s: Arc<Siblings>) {
    loop {
        if s.waiting.load(Ordering::SeqCst) == 0 {
            s.wake_watcher.notified().await;
            continue;
        }
        tokio::time::sleep(POLL).await;
        if s.shared.queue_behind() {
            for _ in s.candidates() {
                s.free_seen.notify_one();
            }
        }
    }
}
