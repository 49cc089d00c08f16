//! The worker's shared state: request and connection counters, whether (and why) it is
//! retiring, and the exit status it will end with. Kept in a `watch` channel so the accept
//! loop, the connections and the drain can wait for the condition they need.
//!
//! Only work counts as busy: a request whose body has arrived (being parsed, waiting for
//! the model, running, being answered). Connections that are still sending a request head
//! or body, or idle between requests, cost the worker a socket and nothing else.
//!
//! The worker also shows on the idle board ([`vramfork::board`]) whether it is **free**:
//! accepting, with nothing in hand — no request worked on and no connection taken in the
//! last [`FRESH_FOR`] still waiting for its first answer ([`Counters::in_hand`]). Siblings
//! with something in hand leave new connections to a free worker (`server.rs`).

use std::sync::atomic::AtomicU32;

use tokio::sync::watch;
use vramfork::board::{Board, Seat};
use vramfork::protocol::{worker_exit, ControlMsg, RetireReason};

use crate::control::Control;

mod board;
mod closing;
mod counters;
mod queue;

pub use counters::{Counters, FRESH_FOR};
use queue::SIBLING_FREE_FOR;

pub struct Shared {
    tx: watch::Sender<Counters>,
    /// Whether the worker is stopping, on its own channel: every connection waits for this,
    /// and must not be woken by every change of the counters.
    stop_tx: watch::Sender<bool>,
    pub control: Control,
    pub max_requests: u64,
    /// Requests worked on at once below which the worker accepts (see
    /// [`Counters::can_accept`]).
    pub concurrency: u32,
    /// The shared listening socket while this worker accepts on it (for
    /// [`Shared::others_waiting`]); `None` once it stopped accepting and closed its copy.
    listen_fd: std::sync::Mutex<Option<std::os::fd::RawFd>>,
    /// Since when this worker has seen connections waiting in the listen queue.
    queue_since: std::sync::Mutex<Option<std::time::Instant>>,
    /// The idle board and this worker's seat on it, when it has one.
    board: Option<(Board, u32)>,
    /// What this worker last showed on the board (written only when it changes).
    shown: AtomicU32,
    /// How long a sibling must have shown free to take a kept-alive client from this
    /// worker when it is full: [`SIBLING_FREE_FOR`] (a field so that tests can lengthen it
    /// rather than race the clock).
    free_spell: std::time::Duration,
}

impl Shared {
    pub fn new(control: Control, max_requests: u64, concurrency: u32) -> Shared {
        Shared {
            tx: watch::Sender::new(Counters::default()),
            stop_tx: watch::Sender::new(false),
            control,
            max_requests,
            concurrency: concurrency.max(1),
            listen_fd: std::sync::Mutex::new(None),
            queue_since: std::sync::Mutex::new(None),
            board: None,
            shown: AtomicU32::new(Seat::Busy as u32),
            free_spell: SIBLING_FREE_FOR,
        }
    }

    pub fn update<R>(&self, f: impl FnOnce(&mut Counters) -> R) -> R {
        let mut out = None;
        let mut stopping = false;
        let (max, concurrency) = (self.max_requests, self.concurrency);
        self.tx.send_if_modified(|c| {
            let before = c.watched(max, concurrency);
            out = Some(f(c));
            stopping = c.stopping();
            // Under the counters' lock, so that two updates cannot show in the wrong order.
            self.show(if c.free(max, concurrency) {
                Seat::Free
            } else {
                Seat::Busy
            });
            // Every update changes the counters; only one that changes what a receiver
            // waits on wakes the receivers (several updates per request otherwise woke the
            // accept loop, and every request waiting for the model, each time).
            c.watched(max, concurrency) != before
        });
        self.stop_tx
            .send_if_modified(|s| std::mem::replace(s, stopping) != stopping);
        out.expect("send_modify runs the closure")
    }

    /// A receiver that changes only when the worker starts stopping.
    pub fn subscribe_stop(&self) -> watch::Receiver<bool> {
        self.stop_tx.subscribe()
    }

    pub fn get(&self) -> Counters {
        self.tx.borrow().clone()
    }

    /// A receiver woken when what [`Counters::watched`] lists changes (its predicates must
    /// depend on nothing else); [`Shared::get`] always reads the latest counters.
    pub fn subscribe(&self) -> watch::Receiver<Counters> {
        self.tx.subscribe()
    }

    /// Takes one model request; says whether it is the one that reaches `max_requests`.
    pub fn claim_model_request(&self) -> bool {
        let max = self.max_requests;
        self.update(|c| {
            c.served += 1;
            max > 0 && c.served == max
        })
    }

    /// Gives back a model request taken with [`Shared::claim_model_request`] that was not
    /// its worker's last and that a sibling took over before it ran (`grpc/`): the sibling
    /// counts it.
    pub fn unclaim_model_request(&self) {
        self.update(|c| c.served = c.served.saturating_sub(1));
    }

    /// Stops accepting and tells the master why (first reason wins).
    pub fn retire(&self, reason: RetireReason) {
        self.retire_with(reason, None);
    }

    /// [`Shared::retire`], with the own host memory that decided it (`host_memory`).
    pub fn retire_with(&self, reason: RetireReason, own_memory: Option<u64>) {
        let first = self.update(|c| {
            if c.stopping() {
                return None;
            }
            c.retiring = Some(reason);
            Some((c.served, c.in_flight))
        });
        if let Some((served, in_flight)) = first {
            tracing::info!(?reason, served, in_flight, "retiring");
            self.control.send(&ControlMsg::Retiring {
                reason,
                served,
                in_flight,
                own_memory,
            });
        }
    }

    /// A forward pass is stuck: retire, and refuse the requests that would queue behind it.
    pub fn model_stuck(&self) {
        self.update(|c| c.model_unusable = true);
        self.retire(RetireReason::RequestTimeout);
    }

    /// A CUDA error other than OOM: answer what is in hand, then exit with CUDA_FATAL.
    pub fn cuda_fatal(&self) {
        self.update(|c| {
            c.model_unusable = true;
            c.fatal = true;
            c.exit_code = worker_exit::CUDA_FATAL;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::counters::MAX_AWAITING;
    use super::queue::QUEUED_FOR;
    use super::*;

    #[test]
    fn accepts_only_when_no_work_and_within_budget() {
        let mut c = Counters::default();
        assert!(c.can_accept(0, 1));
        // Connections still sending their request cost nothing…
        c.awaiting = 10;
        c.in_flight = 2;
        assert!(c.can_accept(0, 1));
        // …up to a limit.
        c.awaiting = MAX_AWAITING;
        assert!(!c.can_accept(0, 1));
        c.awaiting = 0;
        c.in_flight = 0;
        // Work does: one request without batching, max_batch_size with it.
        c.working = 1;
        assert!(!c.can_accept(0, 1));
        assert!(c.can_accept(0, 8));
        c.working = 8;
        assert!(!c.can_accept(0, 8));
        c.working = 0;
        c.open = 2;
        c.served = 1;
        assert!(c.can_accept(0, 1));
        assert!(c.can_accept(4, 1), "2 open, 3 requests left");
        assert!(!c.can_accept(3, 1), "2 open, 2 requests left");
        assert!(!c.can_accept(3, 8), "2 open, 2 requests left");
        c.retiring = Some(RetireReason::Asked);
        assert!(!c.can_accept(0, 1));
    }

    #[test]
    fn free_means_accepting_with_nothing_in_hand() {
        let mut c = Counters::default();
        assert!(c.free(0, 1));
        // A connection just taken (its request on its way) is in hand.
        c.fresh = 1;
        assert!(c.in_hand() && !c.free(0, 1));
        c.fresh = 0;
        // So is work, also where batching would still accept more.
        c.working = 1;
        assert!(c.in_hand() && !c.free(0, 8) && c.can_accept(0, 8));
        c.working = 0;
        // Slow bodies and silent connections are not in hand: the worker stays free.
        c.in_flight = 3;
        c.awaiting = 5;
        assert!(!c.in_hand() && c.free(0, 1));
        // A worker that would not accept is not free.
        c.retiring = Some(RetireReason::Asked);
        assert!(!c.free(0, 1));
    }

    #[test]
    fn the_board_shows_what_the_counters_say_and_defers_only_with_work_in_hand() {
        let master = Board::create().unwrap();
        // SAFETY: dup of the board's descriptor; attach takes it over.
        let fd = unsafe { libc::dup(master.fd().unwrap()) };
        let s =
            Shared::new(Control::none(), 0, 1).with_board(Some((Board::attach(fd).unwrap(), 2)));
        s.show_state();
        assert!(master.other_free(0), "an idle worker shows free");
        s.update(|c| c.fresh += 1);
        assert!(
            !master.other_free(0),
            "a worker with a fresh connection does not"
        );
        // A sibling (seat 5) shows free: with something in hand, this worker defers to it.
        master.show(5, Seat::Free);
        assert!(s.defer_to_sibling());
        s.update(|c| c.fresh -= 1);
        assert!(!s.defer_to_sibling(), "nothing in hand: take it");
        master.clear(5);
        s.show_taking();
        assert!(
            master.other_free(0),
            "taking a connection: siblings wait for it"
        );
        s.update(|c| c.fresh += 1);
        assert!(!master.other_free(0), "took it: busy");
        s.update(|c| c.fresh -= 1);
        s.retire(RetireReason::Asked);
        assert!(!master.other_free(0), "a retiring worker is not free");
    }

    /// Until the board shows a worker other than `mine` free for [`SIBLING_FREE_FOR`].
    fn wait_free_spell(board: &Board, mine: u32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !board.other_free_for(mine, SIBLING_FREE_FOR) {
            assert!(
                std::time::Instant::now() < deadline,
                "never free long enough"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_full_worker_sends_a_kept_alive_client_to_a_free_sibling() {
        let master = Board::create().unwrap();
        // SAFETY: dup of the board's descriptor; attach takes it over.
        let fd = unsafe { libc::dup(master.fd().unwrap()) };
        let mut s =
            Shared::new(Control::none(), 0, 1).with_board(Some((Board::attach(fd).unwrap(), 0)));
        // Answering with another connection's request worked on here.
        s.update(|c| {
            c.open = 2;
            c.working = 1;
        });
        assert!(!s.must_close(), "no sibling free: the client stays");
        master.show(1, Seat::Free);
        // An hour stands for the spell not yet passed, whatever the machine's pace.
        s.free_spell = std::time::Duration::from_secs(3600);
        assert!(
            !s.must_close(),
            "a sibling only just free (between two of its own requests): the client stays"
        );
        s.free_spell = SIBLING_FREE_FOR;
        wait_free_spell(&master, 0);
        assert!(s.must_close(), "a sibling idle: the client goes there");
        s.update(|c| c.working = 0);
        assert!(!s.must_close(), "nothing else here: the client stays");
        // With batching, only a full worker sends clients away.
        // SAFETY: as above.
        let fd = unsafe { libc::dup(master.fd().unwrap()) };
        let b =
            Shared::new(Control::none(), 0, 4).with_board(Some((Board::attach(fd).unwrap(), 2)));
        b.update(|c| c.working = 3);
        assert!(!b.must_close(), "room for a fourth row");
        b.update(|c| c.working = 4);
        wait_free_spell(&master, 2);
        assert!(b.must_close());
    }

    #[test]
    fn passes_leave_the_event_loop_only_for_a_sibling_idle_beside_other_connections() {
        let master = Board::create().unwrap();
        // SAFETY: dup of the board's descriptor; attach takes it over.
        let fd = unsafe { libc::dup(master.fd().unwrap()) };
        let s =
            Shared::new(Control::none(), 0, 1).with_board(Some((Board::attach(fd).unwrap(), 0)));
        s.update(|c| c.open = 2);
        assert!(!s.sibling_idle_beside_others(false), "no sibling free");
        master.show(1, Seat::Free);
        wait_free_spell(&master, 0);
        assert!(s.sibling_idle_beside_others(false));
        s.update(|c| c.open = 1);
        assert!(
            !s.sibling_idle_beside_others(false),
            "one connection: nothing to move to the sibling"
        );
        assert!(
            s.sibling_idle_beside_others(true),
            "one gRPC channel: its calls can go to the sibling"
        );
        let alone = Shared::new(Control::none(), 0, 1);
        alone.update(|c| c.open = 4);
        assert!(
            !alone.sibling_idle_beside_others(true),
            "no board: no sibling"
        );
    }

    #[test]
    fn receivers_wake_only_when_what_they_wait_on_changes() {
        let s = Shared::new(Control::none(), 0, 1);
        let mut rx = s.subscribe();
        // A connection: no longer drained.
        s.update(|c| c.open += 1);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        // A keep-alive request's bookkeeping that leaves every predicate as it was.
        s.update(|c| c.awaiting += 1);
        s.update(|c| {
            c.awaiting -= 1;
            c.in_flight += 1;
        });
        s.claim_model_request();
        assert!(!rx.has_changed().unwrap(), "nothing watched changed");
        assert_eq!(s.get().served, 1, "but the counters did");
        // Work in hand: the worker stops accepting, and the accept loop must hear of it.
        s.update(|c| c.working += 1);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        s.update(|c| c.working -= 1);
        assert!(rx.has_changed().unwrap(), "accepting again");
        rx.mark_unchanged();
        s.update(|c| {
            c.in_flight -= 1;
            c.open -= 1;
        });
        assert!(rx.has_changed().unwrap(), "drained");
        rx.mark_unchanged();
        s.update(|c| c.model_unusable = true);
        assert!(rx.has_changed().unwrap(), "the model became unusable");
    }

    #[test]
    fn connections_are_closed_when_the_budget_cannot_cover_them() {
        let s = Shared::new(Control::none(), 3, 1);
        s.update(|c| c.open = 2);
        assert!(!s.must_close(), "3 requests left for 2 connections");
        s.claim_model_request();
        assert!(!s.must_close(), "2 left for 2");
        s.claim_model_request();
        assert!(s.must_close(), "1 left for 2");
        let unlimited = Shared::new(Control::none(), 0, 1);
        unlimited.update(|c| c.open = 50);
        assert!(!unlimited.must_close());
        unlimited.retire(RetireReason::Asked);
        assert!(unlimited.must_close());
    }

    #[test]
    fn answers_close_only_once_connections_have_been_kept_waiting() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = Shared::new(Control::none(), 0, 1);
        s.set_listener(Some(l.as_raw_fd()));
        let t0 = std::time::Instant::now();
        assert!(!s.others_kept_waiting(t0), "nobody waits");
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(s.others_waiting());
        assert!(!s.others_kept_waiting(t0), "seen waiting just now");
        assert!(!s.others_kept_waiting(t0 + QUEUED_FOR / 2));
        assert!(s.others_kept_waiting(t0 + QUEUED_FOR), "kept waiting");
        // Taken: the next connection to wait starts the clock afresh.
        let (_a, _) = l.accept().unwrap();
        let t1 = t0 + QUEUED_FOR * 2;
        assert!(!s.others_kept_waiting(t1));
        let _d = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(!s.others_kept_waiting(t1 + QUEUED_FOR / 2));
        assert!(s.others_kept_waiting(t1 + QUEUED_FOR + QUEUED_FOR / 2));
    }

    #[test]
    fn the_request_that_reaches_the_limit_is_flagged_once() {
        let s = Shared::new(Control::none(), 2, 1);
        assert!(!s.claim_model_request());
        assert!(s.claim_model_request());
        assert!(!s.claim_model_request());
        s.retire(RetireReason::MaxRequests);
        s.retire(RetireReason::Asked);
        assert_eq!(s.get().retiring, Some(RetireReason::MaxRequests));
    }
}
