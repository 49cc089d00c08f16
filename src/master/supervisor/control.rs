//! The workers' control channels ([`ControlMsg`]): ready, heartbeats, metrics and
//! retiring, applied to what the master knows of each worker; the template's readiness;
//! and the end of a reload once no worker of an older configuration is left.

use std::io::Read;
use std::time::Instant;

use super::reload::Outcome;
use super::{Live, Supervisor};
use crate::master::slot::{Phase, WorkerState};
use crate::protocol::{take_line, BootTimes, ControlMsg, PassesPeak};

impl Supervisor {
    pub(super) fn read_control(&mut self) {
        let now = Instant::now();
        if let Some((pid, took, boot, memory)) = self.templates.poll_ready() {
            let ms = took.as_secs_f64() * 1e3;
            let warmup_ms = boot.warmup_ms;
            tracing::info!(
                event = "template_ready",
                pid,
                ms,
                warmup_ms,
                "template process (pid {pid}) ready in {ms:.0} ms ({warmup_ms:.1} ms of it a warm-up pass): workers are forked from it"
            );
            self.template_measured(memory);
        }
        for i in 0..self.workers.len() {
            let msgs = read_lines(&mut self.workers[i]);
            let mut state = self.workers[i].state.clone();
            self.absorb(&mut state, msgs, now);
            self.workers[i].state = state;
        }
        if self.workers.iter().any(|w| w.state.phase == Phase::Ready) {
            self.boots.seen_ready(now);
        }
        let gen = self.reload.gen;
        let settled = !self
            .workers
            .iter()
            .any(|w| w.state.occupies_slot() && w.state.cfg_gen < gen);
        if let Some(done) = self.reload.settle(settled) {
            let metadata = self.cfg.app.metadata.path.display().to_string();
            let model = self.cfg.model_display();
            let (outcome, what) = match done {
                Outcome::RolledBack => (
                    "rolled_back",
                    "reload rolled back: every worker runs the last configuration that served",
                ),
                Outcome::Reloaded => (
                    "reloaded",
                    "reload complete: every worker runs the new configuration",
                ),
            };
            tracing::info!(
                event = "reload_complete",
                outcome,
                metadata,
                model,
                "{what} ({metadata}, model {model})"
            );
            self.notify.reload_done();
        }
    }

    /// Applies a worker's control messages to what the master knows of it.
    pub(super) fn absorb(&mut self, st: &mut WorkerState, msgs: Vec<ControlMsg>, now: Instant) {
        for msg in msgs {
            match msg {
                ControlMsg::Ready {
                    pid,
                    boot_ms,
                    device,
                    memory,
                } => {
                    self.host.own_memory(st, memory.map(|m| m.own));
                    let warmed = memory.and_then(|m| {
                        let rise = m.pass_peak?;
                        Some(PassesPeak {
                            own_at_ready: m.own,
                            rise,
                        })
                    });
                    self.serving_measured(st, warmed);
                    let simulated = self.cfg.gpu.simulated_gpus && device.contains("simulated");
                    let off_gpu = !device.starts_with("cuda") && !simulated;
                    if let Some(gpu) = st.gpu.filter(|_| off_gpu && self.stopping.is_none()) {
                        self.boots.no_cuda = Some(format!(
                            "worker {} (pid {pid}) was placed on {} but runs its model on '{device}': {}",
                            st.slot,
                            self.plan.gpu_label(gpu),
                            self.no_cuda_reason()
                        ));
                    }
                    self.worker_ready(st, pid, &device, &boot_ms, now);
                }
                ControlMsg::Metrics {
                    traffic,
                    allocator_peak,
                } => {
                    if let Some(m) = &self.metrics {
                        m.report(st.pid, traffic, allocator_peak);
                    }
                }
                // Only a profiling worker sends it, and those are the profiler's own.
                ControlMsg::Footprint { .. } => {}
                ControlMsg::Heartbeat {
                    served,
                    in_flight,
                    queued,
                    queued_lanes,
                    allocator_peak,
                    allocator_reserved,
                    footprint,
                    own_memory,
                    passes_peak,
                } => {
                    self.host.own_memory(st, own_memory);
                    if let (Some(m), Some(p)) = (&self.metrics, passes_peak) {
                        m.serving_pass_peak(p.rise);
                    }
                    self.serving_measured(st, passes_peak);
                    st.allocator = allocator_peak.zip(allocator_reserved);
                    st.footprint = footprint;
                    st.last_heartbeat = now;
                    st.served = served;
                    st.in_flight = in_flight;
                    st.queued = queued;
                    st.queued_lanes = queued_lanes;
                }
                ControlMsg::Retiring {
                    reason,
                    served,
                    in_flight,
                    own_memory,
                } => {
                    self.host.own_memory(st, own_memory);
                    st.set_phase(Phase::Retiring, now);
                    st.retire_reason = Some(reason);
                    st.served = served;
                    st.in_flight = in_flight;
                    self.host
                        .retiring(st, reason, self.cfg.host_memory.max_worker_memory_mb);
                    tracing::debug!(
                        event = "worker_retiring",
                        slot = st.slot,
                        pid = st.pid,
                        reason = reason.code(),
                        served,
                        in_flight,
                        "worker {} (pid {}) retiring after {served} requests ({in_flight} in flight): {reason:?}",
                        st.slot,
                        st.pid
                    );
                }
            }
        }
    }

    /// A worker said it is ready: its phase, the reload and boot records, its slot's
    /// back-off, the metrics, and the `worker_ready` event.
    fn worker_ready(
        &mut self,
        st: &mut WorkerState,
        pid: u32,
        device: &str,
        boot_ms: &BootTimes,
        now: Instant,
    ) {
        st.set_phase(Phase::Ready, now);
        self.reload.ready(st.cfg_gen);
        st.last_heartbeat = now;
        self.boots.ready(now);
        if let Some(s) = self.slots.iter_mut().find(|s| s.id == st.slot) {
            s.succeeded();
        }
        let ms = now.duration_since(st.started).as_secs_f64() * 1e3;
        self.lend.booted(ms);
        if let Some(m) = &self.metrics {
            m.worker_ready(st.pid, ms / 1e3);
        }
        tracing::info!(
            event = "worker_ready",
            slot = st.slot,
            pid,
            generation = st.generation,
            device,
            ms,
            model_ms = boot_ms.model_ms,
            warmup_ms = boot_ms.warmup_ms,
            "worker {} (pid {pid}, generation {}) ready in {ms:.0} ms (model {:.1} ms, warm-up {:.1} ms)",
            st.slot,
            st.generation,
            boot_ms.model_ms,
            boot_ms.warmup_ms
        );
    }
}

/// Reads what a worker's control channel holds and parses the complete lines.
pub(super) fn read_lines(w: &mut Live) -> Vec<ControlMsg> {
    let mut chunk = [0u8; 4096];
    loop {
        match (&w.control).read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => w.buf.extend_from_slice(&chunk[..n]),
        }
    }
    let mut out = Vec::new();
    while let Some(text) = take_line(&mut w.buf) {
        match ControlMsg::from_line(&text) {
            Ok(m) => out.push(m),
            Err(e) => tracing::warn!(
                "worker pid {}: bad control message {text:?}: {e}",
                w.state.pid
            ),
        }
    }
    out
}
