//! What the worker counts (requests, connections, whether it is stopping) and the
//! predicates the accept loop, the drain and the idle board read from them.

use vramfork::protocol::RetireReason;

/// Connections a worker keeps waiting for a request head at once; past this it stops
/// accepting until some send theirs or hit the header deadline.
pub const MAX_AWAITING: u32 = 1024;

/// How long a newly accepted connection counts as work in hand until its first request is
/// answered: long enough for a client's request to follow its connect (head and body may
/// come in separate packets), short enough that a silent client soon stops counting.
pub const FRESH_FOR: std::time::Duration = std::time::Duration::from_millis(250);

#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Model requests (POST /) taken so far.
    pub served: u64,
    /// Requests being handled now (any route), bodies still arriving included.
    pub in_flight: u32,
    /// Requests that have all their input and are being worked on (parsed, queued for or in
    /// the model, answered): what keeps the worker from taking new connections.
    pub working: u32,
    /// Connections from siblings that hand requests to this worker (`siblings/`): not
    /// clients' (not in `open`), but drained like them.
    pub links: u32,
    /// Connections waiting for a request head (new ones, and kept-alive ones whose next
    /// request has begun to arrive).
    pub awaiting: u32,
    /// Open connections.
    pub open: u32,
    /// Connections accepted less than [`FRESH_FOR`] ago whose first request is not answered
    /// yet (nor the connection closed): a request is most likely on its way.
    pub fresh: u32,
    /// Set once the worker stops accepting.
    pub retiring: Option<RetireReason>,
    /// The model can no longer be used (stuck forward pass, CUDA error): refuse new work.
    pub model_unusable: bool,
    /// Status to exit with once drained.
    pub exit_code: i32,
    /// Stopping for a reason that is not a retirement (a fatal CUDA error).
    pub fatal: bool,
}

impl Counters {
    pub fn stopping(&self) -> bool {
        self.retiring.is_some() || self.fatal
    }

    /// Whether the accept loop may take a new connection: fewer than `concurrency` requests
    /// are being worked on (1 without batching, so an idle sibling is not passed over;
    /// `max_batch_size` with it, so concurrent requests can meet in one batch), fewer than
    /// [`MAX_AWAITING`] connections wait for their request head, and no more connections
    /// than requests left before `max_requests`.
    pub fn can_accept(&self, max_requests: u64, concurrency: u32) -> bool {
        if self.stopping() || self.working >= concurrency || self.awaiting >= MAX_AWAITING {
            return false;
        }
        max_requests == 0 || u64::from(self.open) < max_requests.saturating_sub(self.served)
    }

    /// Whether this worker has something in hand: a request worked on, or a connection
    /// just taken whose request is on its way.
    pub fn in_hand(&self) -> bool {
        self.working > 0 || self.fresh > 0
    }

    /// Whether this worker is free: it would accept, and has nothing in hand (what it shows
    /// on the idle board).
    pub fn free(&self, max_requests: u64, concurrency: u32) -> bool {
        !self.in_hand() && self.can_accept(max_requests, concurrency)
    }

    pub fn drained(&self) -> bool {
        self.open == 0 && self.in_flight == 0 && self.links == 0
    }

    /// What the receivers of [`Shared::subscribe`] wait on (the accept loop: stopping, can
    /// accept, something in hand; the drain: drained; a queued request: the model usable):
    /// a change of anything else is not worth waking them for.
    pub(super) fn watched(&self, max_requests: u64, concurrency: u32) -> [bool; 5] {
        [
            self.stopping(),
            self.can_accept(max_requests, concurrency),
            self.in_hand(),
            self.model_unusable,
            self.drained(),
        ]
    }
}
