//! [`PlacementMode`] and rule 2 of the plan: where workers go (CPU, GPUs by memory, GPUs
//! round-robin), from `--device`, the estimate and the GPUs seen.

use serde::Serialize;

use super::{Demand, Notes, PlanError, Policy};
use crate::master::resources::Resources;
use crate::protocol::Device;

/// How workers are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementMode {
    /// Every worker on the CPU.
    Cpu,
    /// On GPUs, bounded by what fits in their memory.
    GpuMemory,
    /// On GPUs round-robin, not bounded by memory (`--device cuda`, no estimate).
    GpuSpread,
}

impl PlacementMode {
    /// Rule 2 (see the module documentation of `plan`): the mode, and why in `notes`.
    pub(super) fn choose(
        res: &Resources,
        demand: &Demand,
        policy: &Policy,
        notes: &mut Notes,
    ) -> Result<PlacementMode, PlanError> {
        let typ = demand.typ_mb;
        let no_gpu_reason = || {
            res.gpu_note
                .clone()
                .unwrap_or_else(|| "NVML sees no GPU".into())
        };
        Ok(match policy.device {
            Device::Cpu => {
                notes.why("--device cpu: every worker on the CPU".into());
                PlacementMode::Cpu
            }
            Device::Cuda if res.gpus.is_empty() => {
                return Err(PlanError::NoGpu(format!(
                    "--device cuda, but no GPU is visible through NVML ({}); use --device auto or \
                     --device cpu, or point --nvml-library at the driver's libnvidia-ml.so.1",
                    no_gpu_reason()
                )))
            }
            Device::Cuda if typ == 0 => {
                notes.warn(format!(
                    "--device cuda but the app metadata's est_gpu_mem_typ is 0: workers are spread \
                     over {} GPU(s) with no memory bound and no allocator cap; set est_gpu_mem_min \
                     and est_gpu_mem_typ in {}",
                    res.gpus.len(),
                    demand.metadata.display()
                ));
                PlacementMode::GpuSpread
            }
            Device::Auto if typ == 0 => {
                notes.why(
                    "est_gpu_mem_typ is 0 (the app does not use a GPU): every worker on the CPU"
                        .into(),
                );
                if !res.gpus.is_empty() {
                    // Often a forgotten or misspelt field: say so where the server starts.
                    notes.warn(format!(
                        "{} GPU(s) visible, but {} declares no est_gpu_mem_typ, or 0 (= the app uses \
                         no GPU), so every worker runs on the CPU: set est_gpu_mem_typ (MB one worker \
                         uses, as nvidia-smi shows it) to serve on the GPUs, or pass --device cpu to \
                         say the CPU is meant",
                        res.gpus.len(),
                        demand.metadata.display()
                    ));
                }
                PlacementMode::Cpu
            }
            Device::Auto if res.gpus.is_empty() => {
                notes.warn(format!(
                    "the app expects a GPU (est_gpu_mem_typ {typ} MB) but none is visible ({}): \
                     serving on the CPU",
                    no_gpu_reason()
                ));
                PlacementMode::Cpu
            }
            Device::Auto | Device::Cuda => PlacementMode::GpuMemory,
        })
    }
}
