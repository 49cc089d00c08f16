//! When an answer closes its keep-alive connection (`Connection: close`, HTTP/2 GOAWAY): the
//! worker stopping or near its request budget, clients kept waiting in the listen queue, or
//! a sibling free while this worker is full.

use super::Shared;

impl Shared {
    /// Whether an answer should carry `Connection: close`: the worker is stopping; or it
    /// has fewer requests left before `max_requests` than open connections, so a client
    /// keeping this connection might find it closed under its next request; or other
    /// connections have waited in the listen queue for [`QUEUED_FOR`], so that this client
    /// goes to the back of it instead of holding the worker (fairness across connections);
    /// or this worker is full while a sibling is free ([`Shared::full_while_a_sibling_is_free`]).
    pub fn must_close(&self) -> bool {
        let c = self.get();
        let max = self.max_requests;
        c.stopping()
            || (max > 0 && max.saturating_sub(c.served) < u64::from(c.open))
            || self.others_kept_waiting(std::time::Instant::now())
            || self.full_while_a_sibling_is_free(&c)
    }

    /// [`Shared::must_close`] for a multiplexed (HTTP/2) connection: as HTTP/1.1's but for a
    /// sibling being free — a gRPC request that would queue is handed to it instead
    /// (`grpc/`), so the client need not reconnect to reach it.
    pub fn must_close_multiplexed(&self) -> bool {
        let c = self.get();
        let max = self.max_requests;
        c.stopping()
            || (max > 0 && max.saturating_sub(c.served) < u64::from(c.open))
            || self.others_kept_waiting(std::time::Instant::now())
    }
}
