//! [`Demand`]: what the app asks of a GPU, the only numbers of the app metadata the plan
//! reads.

use std::path::PathBuf;

use crate::metadata::AppMetadata;

/// What the app asks of a GPU: the numbers [`super::plan`] reads, taken from the app metadata
/// ([`Demand::declared`]) and, when a worker's footprint was measured, from that
/// (`master::measured`). The declared metadata is never changed: the plan owns the
/// figure per worker ([`super::Plan::planned_typ_mb`]) and every reader takes it from there.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    /// `est_gpu_mem_min`: what a GPU must have free (plus the reserve) to take a worker.
    pub min_mb: u64,
    /// MB per worker to plan with: `est_gpu_mem_typ` as declared, or the measured
    /// footprint with headroom.
    pub typ_mb: u64,
    /// `est_gpu_mem_typ` as declared.
    pub declared_typ_mb: u64,
    /// The footprint `typ_mb` was made from, when it was measured.
    pub measured_mb: Option<u64>,
    /// What one worker holds on its GPU besides its caching allocator (the CUDA context,
    /// library handles and workspaces), MB, when profiling measured it: NVML's figure for
    /// the worker (or the fall of free memory) less the allocator's reserved bytes.
    pub context_mb: Option<u64>,
    /// The metadata file, named in warnings.
    pub metadata: PathBuf,
    /// The metadata's own warnings, first among the plan's.
    pub warnings: Vec<String>,
}

impl Demand {
    /// What the metadata declares.
    pub fn declared(meta: &AppMetadata) -> Demand {
        Demand {
            min_mb: meta.est_gpu_mem_min,
            typ_mb: meta.est_gpu_mem_typ,
            declared_typ_mb: meta.est_gpu_mem_typ,
            measured_mb: None,
            context_mb: None,
            metadata: meta.path.clone(),
            warnings: meta.warnings(),
        }
    }

    /// Planned from a measured footprint: `planned_mb` per worker instead of the estimate;
    /// the context as measured, when it was, at least [`super::CUDA_CONTEXT_FLOOR_MB`].
    pub fn measured(self, footprint_mb: u64, planned_mb: u64, context_mb: Option<u64>) -> Demand {
        Demand {
            typ_mb: planned_mb,
            measured_mb: Some(footprint_mb),
            context_mb: context_mb.map(|c| c.max(super::CUDA_CONTEXT_FLOOR_MB)),
            ..self
        }
    }

    /// MB one worker's context takes beside its allocator: as measured, else
    /// [`super::CUDA_CONTEXT_MB`].
    pub fn context_mb(&self) -> u64 {
        self.context_mb.unwrap_or(super::CUDA_CONTEXT_MB)
    }
}
