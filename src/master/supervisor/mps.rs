//! A fatal CUDA error under NVIDIA MPS. MPS delivers a fatal GPU fault of one client to
//! every client sharing that GPU, and its server then takes no new client there until all
//! of them have exited (NVIDIA's MPS documentation, "Error Containment"; new clients get
//! `cudaErrorMpsServerNotReady` meanwhile). So when a worker on an MPS GPU ends with a
//! fatal CUDA error (`worker_exit::CUDA_FATAL`), the master asks the others there to retire
//! (`mps_fault`), and starts no worker on that GPU until they are gone ([`MpsFaults`]).

use std::time::Instant;

use nix::sys::signal::Signal;

use super::Supervisor;
use crate::master::slot::{RetireAsk, WorkerState};

/// The GPUs waiting for the workers that shared a fatal MPS fault to exit.
#[derive(Debug, Default)]
pub(super) struct MpsFaults {
    /// (GPU, the pids that were on it).
    waiting: Vec<(u32, Vec<u32>)>,
}

impl MpsFaults {
    /// GPU `gpu` waits for `pids` to exit.
    pub fn fault(&mut self, gpu: u32, pids: Vec<u32>) {
        self.waiting.retain(|(g, _)| *g != gpu);
        if !pids.is_empty() {
            self.waiting.push((gpu, pids));
        }
    }

    /// Forgets the GPUs whose faulted workers are all gone (`live`: the pids alive now).
    pub fn settle(&mut self, live: &[u32]) {
        for (_, pids) in &mut self.waiting {
            pids.retain(|p| live.contains(p));
        }
        self.waiting.retain(|(_, pids)| !pids.is_empty());
    }

    /// Whether no worker may start on `gpu` yet.
    pub fn blocks(&self, gpu: u32) -> bool {
        self.waiting.iter().any(|(g, _)| *g == gpu)
    }
}

impl Supervisor {
    /// Worker `st` ended with a fatal CUDA error: under MPS its GPU's other workers got it
    /// too (module docs).
    pub(super) fn mps_fault(&mut self, st: &WorkerState, now: Instant) {
        let Some(gpu) = st.gpu else { return };
        if !self.plan.gpus.iter().any(|g| g.index == gpu && g.mps) {
            return;
        }
        let others: Vec<u32> = self
            .workers
            .iter()
            .filter(|w| w.state.gpu == Some(gpu) && w.state.pid != st.pid)
            .map(|w| w.state.pid)
            .collect();
        tracing::error!(
            event = "mps_fault",
            gpu,
            pid = st.pid,
            workers = others.len(),
            "worker {} (pid {}) on {} ended with a fatal CUDA error; under MPS every client of that GPU gets it and its MPS server takes no new client until they have all exited: retiring its {} other worker(s) and starting none there until they are gone",
            st.slot,
            st.pid,
            self.plan.gpu_label(gpu),
            others.len()
        );
        for &pid in &others {
            let asked = self
                .workers
                .iter()
                .any(|w| w.state.pid == pid && w.state.asked_to_stop.is_some());
            if !asked {
                self.ask(pid, RetireAsk::MpsFault, Signal::SIGTERM, now);
            }
        }
        self.mps_faults.fault(gpu, others);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_faulted_gpu_blocks_until_its_workers_are_gone() {
        let mut f = MpsFaults::default();
        assert!(!f.blocks(0));
        f.fault(0, vec![11, 12]);
        f.fault(1, vec![]);
        assert!(f.blocks(0) && !f.blocks(1));
        f.settle(&[12, 99]);
        assert!(f.blocks(0), "12 is still alive");
        f.settle(&[99]);
        assert!(!f.blocks(0));
    }
}
