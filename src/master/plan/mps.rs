//! The plan under NVIDIA MPS bounded by the per-client limit the server inherits
//! (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, [`crate::master::resources::mps::ClientLimit`]).
//!
//! Every worker is one MPS client, and the limit holds per client. NVML in the pod still
//! shows the whole GPU, so a plan over all of it overcommits what the pod was given: the
//! Kubernetes device plugin's MPS sharing (NVIDIA/k8s-device-plugin,
//! `cmd/mps-control-daemon/mps/daemon.go`) sets each client's default limit to total ÷
//! replicas (`set_default_device_pinned_mem_limit <index> <MiB>M`) and its thread share to
//! 100 ÷ replicas (`set_default_active_thread_percentage`), and gives a container one
//! replica at most (`failRequestsGreaterThanOne` defaults to true under MPS,
//! `api/config/v1/config.go`). One replica's limit is therefore the pod's share:
//!
//! - a GPU's usable memory is at most the limit (`usable = min(usable, L)`), so the
//!   workers there share the limit instead of taking one limit each;
//! - a worker that needs more than the limit (its per-worker figure, context included)
//!   fits nowhere: the GPU is excluded naming both figures, and a plan with no GPU left is
//!   the start-up refusal (exit 2);
//! - each worker's own limit, the per-worker figure (at most `usable / fits`), is then
//!   never above the inherited one.
//!
//! The plugin sets the limit on the daemon, not in the container, so the master cannot
//! read it there (the daemon answers `get_default_device_pinned_mem_limit` only through
//! `nvidia-cuda-mps-control`); without a limit in its environment the plan takes the whole
//! GPU and warns so, naming the variable that bounds it.

use super::{GpuPlan, Notes, Policy};

/// The inherited per-client limit on CUDA device `ordinal` under MPS, MB.
pub(super) fn client_limit(policy: &Policy, ordinal: u32) -> Option<u64> {
    let limit = policy.mps_client_limit.as_ref().filter(|_| policy.mps)?;
    limit.on(ordinal)
}

/// Why a GPU under the limit `limit_mb` takes no worker of `per_worker_mb`, when that is
/// the reason.
pub(super) fn too_big(limit_mb: Option<u64>, per_worker_mb: u64) -> Option<String> {
    let limit = limit_mb.filter(|l| per_worker_mb > *l)?;
    Some(format!(
        "one worker needs {per_worker_mb} MB but each MPS client may allocate only {limit} MB \
         here (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, or the share the MPS daemon gives each \
         client): ask for a larger MPS share (fewer replicas per GPU in the device plugin's \
         sharing.mps) or a whole GPU, or serve a smaller model"
    ))
}

/// What the plan says of MPS: each GPU's inherited limit and what it bounds, or, with no
/// limit known, that the plan takes the whole GPU.
pub(super) fn mps_notes(gpus: &[GpuPlan], policy: &Policy, notes: &mut Notes) {
    if !policy.mps || gpus.is_empty() {
        return;
    }
    let limited: Vec<&GpuPlan> = gpus
        .iter()
        .filter(|g| g.mps_client_limit_mb.is_some())
        .collect();
    for g in &limited {
        let limit = g.mps_client_limit_mb.unwrap_or_default();
        notes.warn(format!(
            "{} is shared through MPS with a per-client limit of {limit} MB \
             (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT): every worker is one client, so this server's \
             share of its {} MB is {limit} MB; its workers share {} MB usable, each limited to \
             its part of it",
            g.label, g.total_mb, g.usable_mb
        ));
    }
    if limited.is_empty() {
        notes.warn(
            "MPS serves the GPUs but no per-client memory limit is set here \
             (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT): the plan takes each GPU's memory as NVML shows \
             it. If the MPS daemon gives each client a share (the Kubernetes device plugin's MPS \
             sharing sets total ÷ replicas on the daemon, which NVML in the pod does not show), \
             the workers are cut off at that share and the pods beside this one run out of \
             memory: set CUDA_MPS_PINNED_DEVICE_MEM_LIMIT to this server's share (e.g. 0=10G) \
             to plan within it"
                .to_string(),
        );
    }
}
