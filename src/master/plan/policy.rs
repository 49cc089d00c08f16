//! [`Policy`]: the planning choices from the command line (validated by `config`, checked
//! again here), and the torch threads each worker gets (rule 8).

use serde::Serialize;

use super::{Notes, PlanError};
use crate::master::resources::mps::ClientLimit;
use crate::protocol::Device;

/// A fixed worker count that replaces the planned one, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WorkerOverride {
    pub count: u32,
    /// `"--workers"`, `"VRAMFORK_WORKERS"` or `"CLAMS_GUNICORN_WORKERS"`.
    pub source: &'static str,
}

/// The planning choices from the command line (validated by `config`).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub workers_override: Option<WorkerOverride>,
    pub device: Device,
    /// `--gpu-memory-utilization`: replaces the size table for every GPU; (0, 1].
    pub gpu_memory_utilization: Option<f64>,
    /// `--gpu-reserve-mb`: kept free on every GPU.
    pub gpu_reserve_mb: u64,
    /// Torch intra-op threads per worker, when the operator set them.
    pub torch_threads: Option<TorchThreads>,
    /// NVIDIA MPS serves the GPUs (detected, or `--mps on`; never with `--mps off`).
    pub mps: bool,
    /// Under MPS, the per-client device memory limit the server inherited
    /// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`): each worker is one client, and the server's
    /// share of a GPU ([`super::gpus`]).
    pub mps_client_limit: Option<ClientLimit>,
    /// Under MPS, each client's share of a GPU's SMs the server inherited
    /// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), percent: counted per worker in the plan's text.
    pub mps_thread_percentage: Option<f64>,
    /// The operator's `per_process_memory_fraction` (`PYTORCH_ALLOC_CONF`): no worker's
    /// cap goes above it.
    pub allocator_fraction: Option<f64>,
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: PyTorch's caching allocator is off, so workers
    /// on GPUs could be neither capped nor measured (rule 12).
    pub uncached_allocator: bool,
}

/// Torch intra-op threads per worker as the operator set them, and where
/// (`--torch-threads`, `VRAMFORK_TORCH_THREADS`, `MKL_NUM_THREADS` or `OMP_NUM_THREADS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TorchThreads {
    pub count: usize,
    pub source: &'static str,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            workers_override: None,
            device: Device::Auto,
            gpu_memory_utilization: None,
            gpu_reserve_mb: 500,
            torch_threads: None,
            mps: false,
            mps_client_limit: None,
            mps_thread_percentage: None,
            allocator_fraction: None,
            uncached_allocator: false,
        }
    }
}

impl Policy {
    /// A policy value the planner cannot use (`config` should have caught it).
    pub(super) fn check(&self) -> Result<(), PlanError> {
        if let Some(f) = self.gpu_memory_utilization {
            if !(f > 0.0 && f <= 1.0) {
                return Err(PlanError::InvalidPolicy(format!(
                    "--gpu-memory-utilization is {f}; allowed: a fraction greater than 0 and at most 1"
                )));
            }
        }
        if let Some(o) = self.workers_override {
            if o.count == 0 {
                return Err(PlanError::InvalidPolicy(format!(
                    "{} is 0; allowed: a whole number of workers ≥ 1",
                    o.source
                )));
            }
        }
        if self.torch_threads.is_some_and(|t| t.count == 0) {
            return Err(PlanError::InvalidPolicy(
                "torch threads is 0; allowed: ≥ 1".into(),
            ));
        }
        Ok(())
    }

    /// Torch intra-op threads per worker (rule 8): as the operator set them, else
    /// `max(1, cpus / workers)`.
    pub(super) fn torch_threads(&self, cpus: usize, workers: u32, notes: &mut Notes) -> usize {
        match self.torch_threads {
            Some(TorchThreads { count, source }) => {
                notes.why(format!(
                    "torch threads = {count} per worker (set by {source})"
                ));
                count
            }
            None => {
                let t = (cpus / workers.max(1) as usize).max(1);
                notes.why(format!(
                    "torch threads = max(1, {cpus} cores / {workers} workers) = {t} per worker"
                ));
                t
            }
        }
    }
}
