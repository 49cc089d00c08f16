//! Starting a worker: its configuration, an explicit environment (`CUDA_VISIBLE_DEVICES`
//! for its GPU, `PYTORCH_CUDA_ALLOC_CONF`), the inherited listening socket on fd 3 and its
//! control channel on fd 4, the idle board (`crate::board`) on fd 6, the key and TLS
//! material (`crate::secrets`) on fd 7, `PR_SET_PDEATHSIG` so it never outlives the master,
//! and its own process group so a terminal's Ctrl-C reaches only the master.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::master::config::Config;
use crate::master::plan::Plan;
use crate::master::worker_config::WorkerConfig;
use crate::protocol::{
    gpu_env, Device, FootprintFigures, GpuAssignment, WorkerMetrics, BOARD_FD, CONTROL_FD,
    ENV_LISTEN_FDS, ENV_WORKER_CONFIG, LISTEN_FD, SECRETS_FD,
};

/// Milliseconds between worker heartbeats.
pub const HEARTBEAT_MS: u64 = 1000;

/// What one worker is started with.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub config: WorkerConfig,
    /// The master's idle board, placed on `BOARD_FD` in the child; `None`: no board.
    pub board: Option<std::os::fd::RawFd>,
    /// The sealed key and TLS material (`crate::secrets`), placed on `SECRETS_FD`.
    pub secrets: Option<std::os::fd::RawFd>,
}

/// A started worker: its pid and the master's end of its control channel.
#[derive(Debug)]
pub struct Launched {
    pub pid: u32,
    pub control: UnixStream,
}

/// The configuration handed to the worker of `slot`.
pub fn worker_config(
    cfg: &Config,
    plan: &Plan,
    slot: u32,
    generation: u64,
    max_requests: u64,
) -> WorkerConfig {
    let gpu = plan
        .placement
        .iter()
        .find(|p| p.slot == slot)
        .and_then(|p| p.gpu.clone());
    let device = match (cfg.gpu.device, &gpu) {
        (Device::Cpu, _) => Device::Cpu,
        // The plan put it on a GPU: CUDA it must be (`auto` would fall back to the CPU).
        (_, Some(_)) => Device::Cuda,
        // No GPU placed for this worker (no GPU seen, or the app needs none): CPU.
        (_, None) if plan.planned_typ_mb == 0 && cfg.gpu.device == Device::Auto => Device::Cpu,
        (d, None) => d,
    };
    WorkerConfig {
        simulated_gpu: cfg.gpu.simulated_gpus && gpu.is_some(),
        slot,
        generation,
        metadata_json: cfg.app.metadata.to_json(),
        metadata_path: cfg.app.metadata.path.display().to_string(),
        model_path: cfg.model_display(),
        model_name: cfg.app.model_name.clone(),
        device,
        gpu,
        max_requests,
        max_worker_gpu_mb: cfg.gpu.max_worker_gpu_mb,
        gpu_context_mb: plan.cuda_context_mb,
        oom_score_adj: crate::master::oom::worker_score_adj(),
        profile: false,
        heartbeat_ms: HEARTBEAT_MS,
        torch_threads: plan.torch_threads,
        nvml_library: cfg
            .gpu
            .nvml_library
            .as_ref()
            .map(|p| p.display().to_string()),
        has_control: true,
        board_seat: None,
        secrets: false,
        footprint: plan.measured_mb.map(|m| FootprintFigures {
            declared_mb: plan.declared_typ_mb,
            measured_mb: m,
            planned_mb: plan.planned_typ_mb,
        }),
        metrics: cfg.address.metrics_port.map(|_| WorkerMetrics {
            serve: false,
            cpu_bound: plan.cpu_bound,
            gpu_bound: plan.gpu_bound,
            planned: plan.workers,
            planned_typ_mb: plan.planned_typ_mb,
        }),
        limits: cfg.limits.clone(),
        batch: cfg.batch.clone(),
        host_memory: cfg.host_memory.clone(),
        access: cfg.access.clone(),
        log: cfg.log.clone(),
        tracing: cfg.tracing.clone(),
    }
}

/// The environment every worker gets on top of the master's (less the master's own
/// addresses: socket activation, systemd notify): its GPU only, and
/// `expandable_segments` unless the user chose an allocator configuration.
pub fn child_env(cmd: &mut Command, gpu: Option<&GpuAssignment>) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("VRAMFORK_") && k != "VRAMFORK_LOG"
            || k.starts_with("LISTEN_")
            || super::notify::ENV.contains(&k.as_ref())
        {
            cmd.env_remove(k.as_ref());
        }
    }
    // Where it unpacks an AOTInductor package (`super::host::unpack`).
    cmd.env(crate::unpacked::ENV, super::host::unpack::own());
    // Its GPU alone, and under MPS its share as its driver-enforced limit.
    for (k, v) in gpu_env(gpu) {
        cmd.env(k, v);
    }
    // torch 2.11 reads PYTORCH_ALLOC_CONF, and PYTORCH_CUDA_ALLOC_CONF as its older name:
    // either one set is the user's choice.
    if std::env::var_os("PYTORCH_CUDA_ALLOC_CONF").is_none()
        && std::env::var_os("PYTORCH_ALLOC_CONF").is_none()
    {
        cmd.env("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True");
    }
}

/// Starts `binary` as a worker by fork+exec.
pub fn launch(
    binary: &std::path::Path,
    spec: &WorkerSpec,
    listener: &TcpListener,
) -> std::io::Result<Launched> {
    launch_with(binary, spec, listener, &[])
}

/// Starts `binary` by fork+exec with `extra` environment variables (the template uses this).
pub fn launch_with(
    binary: &std::path::Path,
    spec: &WorkerSpec,
    listener: &TcpListener,
    extra: &[(&str, &str)],
) -> std::io::Result<Launched> {
    let (master_end, worker_end) = UnixStream::pair()?;
    let json = serde_json::to_string(&spec.config).expect("worker config serializes");
    let mut cmd = Command::new(binary);
    cmd.env(ENV_WORKER_CONFIG, json)
        .env(ENV_LISTEN_FDS, "1")
        .stdin(Stdio::null());
    child_env(&mut cmd, spec.config.gpu.as_ref());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let listen_fd = listener.as_raw_fd();
    let control_fd = worker_end.as_raw_fd();
    let board_fd = spec.board;
    let secrets_fd = spec.secrets;
    let master_pid = std::process::id() as libc::pid_t;
    // SAFETY: the hook runs in the forked child before exec and makes only
    // async-signal-safe system calls (fcntl, dup2, close, prctl, getppid, setpgid). The master is
    // single-threaded, so no lock can be held across the fork.
    unsafe {
        cmd.pre_exec(move || {
            // Move the descriptors out of the way first, so dup2 cannot clobber one with
            // another.
            let l = libc::fcntl(listen_fd, libc::F_DUPFD, 10);
            let c = libc::fcntl(control_fd, libc::F_DUPFD, 10);
            let b = board_fd.map_or(-1, |b| libc::fcntl(b, libc::F_DUPFD, 10));
            let s = secrets_fd.map_or(-1, |s| libc::fcntl(s, libc::F_DUPFD, 10));
            if l < 0 || c < 0 || board_fd.is_some() && b < 0 || secrets_fd.is_some() && s < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::dup2(l, LISTEN_FD) < 0 || libc::dup2(c, CONTROL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if b >= 0 && libc::dup2(b, BOARD_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if s >= 0 && libc::dup2(s, SECRETS_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(l);
            libc::close(c);
            for extra in [b, s] {
                if extra >= 0 {
                    libc::close(extra);
                }
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != master_pid {
                // The master died between fork and prctl.
                libc::_exit(1);
            }
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(OwnedFd::from(worker_end));
    master_end.set_nonblocking(true)?;
    Ok(Launched {
        pid: child.id(),
        control: master_end,
    })
}
