//! Whether requests wait: for the model in this worker, or in the shared listen queue for
//! any worker to take them.

use super::Shared;

/// How long connections must have been seen waiting in the listen queue before answers
/// close their keep-alive connections (see [`Shared::must_close`]).
pub const QUEUED_FOR: std::time::Duration = std::time::Duration::from_millis(20);

/// How long a sibling must have shown free before a full worker sends a kept-alive client
/// there (see [`Shared::full_while_a_sibling_is_free`]): as long as connections must wait
/// in the listen queue before the fairness rule closes theirs.
pub const SIBLING_FREE_FOR: std::time::Duration = QUEUED_FOR;

impl Shared {
    /// Whether a request taken now would wait for the model: this worker already works on
    /// as many as it takes at once.
    pub fn would_queue(&self) -> bool {
        self.tx.borrow().working >= self.concurrency
    }

    /// Whether a request being worked on here waits behind others: more are being worked
    /// on than the worker takes at once.
    pub fn queue_behind(&self) -> bool {
        self.tx.borrow().working > self.concurrency
    }

    /// The listening socket this worker accepts on (set by the accept loop, cleared before
    /// it closes the socket).
    pub fn set_listener(&self, fd: Option<std::os::fd::RawFd>) {
        *self.listen_fd.lock().unwrap_or_else(|p| p.into_inner()) = fd;
    }

    /// The listening socket's accept queue, as the kernel counts it (`None` once this worker
    /// stopped accepting): read under the lock the accept loop takes to clear the socket
    /// before closing it, so never on a closed or reused descriptor.
    pub fn listen_backlog(&self) -> Option<vramfork::metrics::listen_queue::Backlog> {
        let fd = self.listen_fd.lock().unwrap_or_else(|p| p.into_inner());
        fd.and_then(vramfork::metrics::listen_queue::read)
    }

    /// Whether connections wait in the listen queue that no worker has taken yet.
    pub fn others_waiting(&self) -> bool {
        let fd = *self.listen_fd.lock().unwrap_or_else(|p| p.into_inner());
        fd.is_some_and(crate::listen_queue::readable)
    }

    /// Whether connections have waited in the listen queue for at least [`QUEUED_FOR`], as
    /// far as this worker has seen at its answers (the queue seen empty starts it afresh). A
    /// connection that just arrived (a client reconnecting after a `Connection: close`) is
    /// normally taken by an idle moment of some worker within that time; closing for it
    /// would make the next client reconnect and keep the queue from ever emptying.
    pub(super) fn others_kept_waiting(&self, now: std::time::Instant) -> bool {
        let mut since = self.queue_since.lock().unwrap_or_else(|p| p.into_inner());
        if !self.others_waiting() {
            *since = None;
            return false;
        }
        now.saturating_duration_since(*since.get_or_insert(now)) >= QUEUED_FOR
    }
}
