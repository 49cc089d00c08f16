//! Per-worker and per-slot state. A slot is a numbered place for one serving worker
//! (`vf-worker-<slot>`); the worker in it goes Booting → Ready → Retiring → exited, and a
//! slot whose worker keeps failing backs off before the next try. Why the master killed a
//! worker ([`KillReason`]) or asked it to go ([`RetireAsk`]) is defined here, beside the
//! state it ends; `events.rs` says which event carries each.

use std::time::{Duration, Instant};

/// Why the master kills a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Still booting after `--boot-timeout`.
    BootTimeout,
    /// Ready, but no heartbeat for `--timeout`.
    Heartbeat,
    /// Retiring for longer than `--graceful-timeout` (plus the kill grace of `decide`).
    GracefulTimeout,
    /// The master is stopping and the worker outlived the stop's deadline.
    StopTimeout,
    /// Still booting with a configuration a newer reload superseded (it never served).
    Superseded,
}

impl KillReason {
    /// The `why` of the `worker_killed` event.
    pub fn code(self) -> &'static str {
        match self {
            KillReason::BootTimeout => "boot_timeout",
            KillReason::Heartbeat => "heartbeat",
            KillReason::GracefulTimeout => "graceful_timeout",
            KillReason::StopTimeout => "stop_timeout",
            KillReason::Superseded => "superseded",
        }
    }
}

impl std::fmt::Display for KillReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KillReason::BootTimeout => "did not load its model within --boot-timeout",
            KillReason::Heartbeat => "sent no heartbeat within --timeout",
            KillReason::GracefulTimeout => "did not finish retiring within --graceful-timeout",
            KillReason::StopTimeout => "did not stop in time",
            KillReason::Superseded => "it was booting a configuration a newer reload superseded",
        })
    }
}

/// Why the master asks a worker to go: to retire gracefully (TERM: it stops accepting and
/// finishes its requests) or, for a quick stop, to exit at once (QUIT). A worker that
/// retires by itself (its request limit, …) says why in its own message
/// ([`RetireReason`], the `worker_retiring` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetireAsk {
    /// Its slot is at or beyond the target (TTOU, `--adapt-workers`).
    FewerWorkers,
    /// TERM: the master stops gracefully.
    Stopping,
    /// INT or QUIT: the master stops now (the worker gets QUIT).
    QuickStop,
    /// Reload: a worker with the new configuration is ready in its slot.
    ReloadReplaced,
    /// Reload: its GPU has no room for the replacement beside it (stop-then-start).
    ReloadNoRoom,
    /// Under MPS, another worker on its GPU ended with a fatal CUDA error, which MPS
    /// delivers to every client there; the MPS server takes no new client on that GPU
    /// until all of them have exited.
    MpsFault,
}

impl RetireAsk {
    /// The `why` of the `worker_retire_asked` event.
    pub fn code(self) -> &'static str {
        match self {
            RetireAsk::FewerWorkers => "fewer_workers",
            RetireAsk::Stopping => "stopping",
            RetireAsk::QuickStop => "quick_stop",
            RetireAsk::ReloadReplaced => "reload_replaced",
            RetireAsk::ReloadNoRoom => "reload_no_room",
            RetireAsk::MpsFault => "mps_fault",
        }
    }
}

impl std::fmt::Display for RetireAsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RetireAsk::FewerWorkers => "fewer workers",
            RetireAsk::Stopping => "stopping",
            RetireAsk::QuickStop => "stopping now",
            RetireAsk::ReloadReplaced => "reload: replaced by a worker with the new configuration",
            RetireAsk::ReloadNoRoom => "reload: no GPU room beside it, stop-then-start",
            RetireAsk::MpsFault => {
                "MPS: a worker on its GPU ended with a fatal CUDA error, which every client there gets"
            }
        })
    }
}

use crate::protocol::RetireReason;

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Started, loading its model.
    Booting,
    /// Accepting and serving.
    Ready,
    /// Stopped accepting; finishing in-flight requests, then exits.
    Retiring,
}

/// What the supervisor knows of one live worker process.
#[derive(Debug, Clone)]
pub struct WorkerState {
    pub pid: u32,
    pub slot: u32,
    pub generation: u64,
    /// The configuration generation it was started with (bumped by each reload).
    pub cfg_gen: u64,
    pub phase: Phase,
    pub started: Instant,
    pub phase_since: Instant,
    pub last_heartbeat: Instant,
    pub served: u64,
    /// Requests in flight, as its last heartbeat (or retiring message) said.
    pub in_flight: u32,
    /// Requests it has taken that wait for the model, as its last heartbeat said.
    pub queued: u32,
    /// `queued` by priority lane, highest first (`crate::lanes::LANES`).
    pub queued_lanes: [u32; 3],
    /// NVML index of its GPU, if it has one.
    pub gpu: Option<u32>,
    pub retire_reason: Option<RetireReason>,
    /// When the master sent it TERM (or QUIT), if it did.
    pub asked_to_stop: Option<Instant>,
    /// Why the master killed it, if it did.
    pub killed: Option<KillReason>,
    /// Its CUDA caching allocator's peak and current reserved bytes, from its last
    /// heartbeat (CUDA workers).
    pub allocator: Option<(u64, u64)>,
    /// Its GPU footprint as its last heartbeat computed it (bytes), when it could.
    pub footprint: Option<u64>,
    /// Its own host memory (`crate::own_memory`) as it last reported it (ready, heartbeat,
    /// retiring), bytes.
    pub own_memory: Option<u64>,
    /// The kernel's OOM killer took it (`master::oom`).
    pub oom_killed: bool,
}

impl WorkerState {
    pub fn new(
        pid: u32,
        slot: u32,
        generation: u64,
        cfg_gen: u64,
        gpu: Option<u32>,
        now: Instant,
    ) -> Self {
        WorkerState {
            pid,
            slot,
            generation,
            cfg_gen,
            phase: Phase::Booting,
            started: now,
            phase_since: now,
            last_heartbeat: now,
            served: 0,
            in_flight: 0,
            queued: 0,
            queued_lanes: [0; 3],
            gpu,
            retire_reason: None,
            asked_to_stop: None,
            killed: None,
            allocator: None,
            footprint: None,
            own_memory: None,
            oom_killed: false,
        }
    }

    /// Occupies its slot: not retiring, not asked to stop, not killed.
    pub fn occupies_slot(&self) -> bool {
        self.phase != Phase::Retiring && self.asked_to_stop.is_none() && self.killed.is_none()
    }

    pub fn set_phase(&mut self, phase: Phase, now: Instant) {
        if self.phase != phase {
            self.phase = phase;
            self.phase_since = now;
        }
    }
}

/// One numbered place for a worker.
#[derive(Debug, Clone)]
pub struct Slot {
    pub id: u32,
    /// NVML index of the GPU its workers go to.
    pub gpu: Option<u32>,
    /// Beyond what the plan fitted on the GPUs (an override): waits until a GPU has the
    /// memory for it, then gets that GPU.
    pub unplaced: bool,
    pub next_generation: u64,
    /// Consecutive workers of this slot that died before they were ready.
    pub failures: u32,
    pub backoff_until: Option<Instant>,
}

/// First retry delay after a failed boot; doubled per consecutive failure.
pub const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// The longest wait between two tries.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);

impl Slot {
    pub fn new(id: u32, gpu: Option<u32>) -> Slot {
        Slot {
            id,
            gpu,
            unplaced: false,
            next_generation: 0,
            failures: 0,
            backoff_until: None,
        }
    }

    /// Records a worker that died before it was ready; returns the delay before the next.
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.failures += 1;
        let delay = BACKOFF_BASE
            .saturating_mul(1 << (self.failures - 1).min(16))
            .min(BACKOFF_CAP);
        self.backoff_until = Some(now + delay);
        delay
    }

    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.backoff_until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let now = Instant::now();
        let mut s = Slot::new(0, None);
        let delays: Vec<_> = (0..12).map(|_| s.failed(now)).collect();
        assert_eq!(delays[0], Duration::from_millis(100));
        assert_eq!(delays[1], Duration::from_millis(200));
        assert_eq!(delays[4], Duration::from_millis(1600));
        assert_eq!(*delays.last().unwrap(), BACKOFF_CAP);
        s.succeeded();
        assert_eq!(s.failed(now), Duration::from_millis(100));
    }
}
