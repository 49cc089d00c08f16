//! The worker's seat on the idle board ([`vramfork::board`]): what it shows (free, busy,
//! taking), and what it reads there of its siblings (one free, for how long).

use std::sync::atomic::Ordering;

use vramfork::board::{Board, Seat};

use super::{Counters, Shared};

impl Shared {
    /// Takes part in the idle board on `seat`.
    pub fn with_board(mut self, board: Option<(Board, u32)>) -> Shared {
        self.board = board;
        self
    }

    /// Shows `state` on the board, if it differs from what was shown.
    pub(super) fn show(&self, state: Seat) {
        if let Some((board, seat)) = &self.board {
            if self.shown.swap(state as u32, Ordering::SeqCst) != state as u32 {
                board.show(*seat, state);
            }
        }
    }

    /// Shows on the board what the counters say now.
    pub fn show_state(&self) {
        self.update(|_| ());
    }

    /// Shows "taking" while this worker tries to take a connection ([`Seat::Taking`]);
    /// [`Shared::show_state`] after.
    pub fn show_taking(&self) {
        self.show(Seat::Taking);
    }

    /// Whether this worker should leave a waiting connection to a sibling: it has
    /// something in hand, and the board shows another worker free.
    pub fn defer_to_sibling(&self) -> bool {
        match &self.board {
            Some((board, seat)) => self.tx.borrow().in_hand() && board.other_free(*seat),
            None => false,
        }
    }

    /// The idle board and this worker's seat on it, when it has one.
    pub fn board(&self) -> Option<(&Board, u32)> {
        self.board.as_ref().map(|(b, s)| (b, *s))
    }

    /// Whether this worker holds other connections (or `multiplexed`: a connection that
    /// carries other requests, whose requests siblings can take one by one) while the idle
    /// board shows a sibling free for [`SIBLING_FREE_FOR`]: its passes then go through the
    /// model thread, not its event loop (`runner/inline.rs`). A pass on the event loop leaves
    /// the other requests unread, where nothing counts them, so neither
    /// [`Shared::must_close`] nor a gRPC hand-off would ever move one to the idle sibling:
    /// four kept-alive clients (or one gRPC channel's calls) that all landed on one worker
    /// would stay there, served one pass at a time on one core, while the other idled.
    pub fn sibling_idle_beside_others(&self, multiplexed: bool) -> bool {
        (multiplexed || self.tx.borrow().open > 1)
            && self
                .board
                .as_ref()
                .is_some_and(|(board, seat)| board.other_free_for(*seat, self.free_spell))
    }

    /// Whether this worker has as much work as it takes at once (other connections'
    /// requests, once this answer's is done) while the idle board shows a sibling that has
    /// been free for [`SIBLING_FREE_FOR`]: the client's next request would wait behind that
    /// work, so its connection closes and it reconnects to the idle sibling. Without this,
    /// kept-alive connections stay on the worker they first landed on: two clients that
    /// connected while one worker was busy (or alone) shared it for as long as their
    /// connections lived while another idled. The spell keeps a sibling that is only between
    /// two requests of its own clients (microseconds, under load) from counting: closing for
    /// it made small models' clients reconnect thousands of times a second.
    pub(super) fn full_while_a_sibling_is_free(&self, c: &Counters) -> bool {
        c.working >= self.concurrency
            && self
                .board
                .as_ref()
                .is_some_and(|(board, seat)| board.other_free_for(*seat, self.free_spell))
    }
}
