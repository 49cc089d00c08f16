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
//! `nvidia-cuda-mps-control`). Without a limit in its environment a plan over the whole GPU
//! would overcommit the pod's share, so it fails safe: serving refuses to start (exit 2)
//! unless the operator states the share, as `--gpu-memory-utilization` (1 ÷ replicas under
//! the device plugin) or as the variable; `app plan` shows the plan with that refusal.
//!
//! The thread share is per client too: the plugin sets 100 ÷ replicas as the daemon's
//! default active-thread percentage, and a client's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` can
//! only lower it (NVIDIA's MPS documentation). N workers are N clients, so they may take N
//! times that share of a GPU's SMs; the plan's text counts it.

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

/// What the plan says of MPS: each GPU's inherited limit and what it bounds; with no limit
/// known, the share `--gpu-memory-utilization` states, or else why serving refuses (the
/// refusal returned).
pub(super) fn mps_notes(gpus: &[GpuPlan], policy: &Policy, notes: &mut Notes) -> Option<String> {
    if !policy.mps || gpus.is_empty() {
        return None;
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
    if !limited.is_empty() {
        return None;
    }
    if let Some(f) = policy.gpu_memory_utilization {
        notes.warn(format!(
            "MPS serves the GPUs with no per-client memory limit known here \
             (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT): the plan takes {f} of each GPU, as \
             --gpu-memory-utilization says; under the Kubernetes device plugin's MPS sharing \
             that should be 1 ÷ replicas, the share the daemon gives each pod"
        ));
        return None;
    }
    let why = "MPS serves the GPUs but this server's share of them is unknown: no per-client \
               memory limit is set here (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), and the MPS daemon \
               may give each client a share NVML does not show (the Kubernetes device plugin's \
               MPS sharing sets total ÷ replicas on the daemon and passes only \
               CUDA_MPS_PIPE_DIRECTORY to the pod), so a plan over each GPU's whole memory \
               would take the memory of the pods beside this one. State the share: \
               --gpu-memory-utilization 1/replicas (e.g. 0.25 for 4 replicas), or \
               CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (e.g. 0=20G); or --mps off where no MPS \
               daemon shares the GPUs"
        .to_string();
    notes.warn(why.clone());
    Some(why)
}

/// The SM share the workers on each MPS GPU take together: every worker is one client with
/// its own active-thread percentage (the inherited `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, else
/// the daemon's default, 100 ÷ replicas under the device plugin).
pub(super) fn thread_share(gpus: &[GpuPlan], policy: &Policy, notes: &mut Notes) {
    if !policy.mps {
        return;
    }
    for g in gpus.iter().filter(|g| g.mps && g.assigned > 0) {
        let n = g.assigned;
        notes.why(match policy.mps_thread_percentage {
            Some(p) => format!(
                "{}: {n} workers are {n} MPS clients, each with {p} % of its SMs \
                 (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): together up to {} %",
                g.label,
                (f64::from(n) * p).min(100.0)
            ),
            None => format!(
                "{}: {n} workers are {n} MPS clients, each with the daemon's default share of its \
                 SMs (the device plugin sets 100 ÷ replicas): together {n} times that share; \
                 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE lowers each client's",
                g.label
            ),
        });
    }
}
