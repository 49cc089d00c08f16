//! Measuring one worker's GPU memory before planning (`--profile-memory`, `app plan
//! --measure`): a worker is started on the first GPU the plan uses, with no allocator cap
//! and on a private loopback listener (it never takes a client's request); it loads the
//! model, runs one forward pass at the metadata's profile input (`profile_input`, else the
//! declared shapes with `-1` as 1) and reports the CUDA caching allocator's peak and current
//! reserved bytes. The master reads NVML's figure for the worker's process, stops it, and
//! computes the footprint:
//!
//! `footprint = allocator peak reserved + (NVML's process figure − allocator reserved now)`
//!
//! — the peak of what the allocator held plus what the process holds besides it (the CUDA
//! context, cuBLAS/cuDNN workspaces). Without allocator figures (a worker that runs on the
//! CPU, as on the simulated GPUs of the tests), NVML's process figure alone.

use std::io::Read;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::spawn::{launch, worker_config, WorkerSpec};
use crate::master::config::Config;
use crate::master::plan::Plan;
use crate::master::resources::NvmlProbe;
use crate::protocol::{take_line, ControlMsg, GpuAssignment};

const MB: u64 = 1 << 20;

/// What the profiling worker measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// NVML index of the GPU it ran on.
    pub gpu: u32,
    /// The footprint, in MB (rounded up).
    pub footprint_mb: u64,
    /// NVML's figure for its process, bytes.
    pub nvml_used: Option<u64>,
    /// When NVML does not list the worker's pid (a container without the host's PID
    /// namespace): how much the device's free memory fell while it started, bytes.
    pub device_delta: Option<u64>,
    pub allocator_peak: Option<u64>,
    pub allocator_reserved: Option<u64>,
    /// The context `--footprint-file` recorded beside the footprint, MB, for a plan made
    /// from the file (nothing was measured now).
    pub recorded_context_mb: Option<u64>,
    /// The profiling pass, ms.
    pub pass_ms: f64,
    /// The worker's pid (gone by now).
    pub pid: u32,
}

impl Measured {
    /// What the worker held besides its allocator (the CUDA context, library handles and
    /// workspaces), MB: NVML's figure for it (or the fall of free memory) less the
    /// allocator's reserved bytes, when both were read.
    pub fn context_mb(&self) -> Option<u64> {
        self.recorded_context_mb.or_else(|| {
            let whole = self.nvml_used.or(self.device_delta)?;
            let reserved = self.allocator_reserved?;
            Some(whole.saturating_sub(reserved).div_ceil(MB))
        })
    }

    /// The per-worker figure a plan should assume: footprint × headroom, at least
    /// `est_gpu_mem_min`.
    pub fn planned_mb(&self, headroom: f64, est_min: u64) -> u64 {
        ((self.footprint_mb as f64 * headroom).ceil() as u64).max(est_min)
    }
}

pub use crate::protocol::gpu_footprint as footprint;

/// Starts one profiling worker, waits (up to `--boot-timeout`) for its pass, measures, and
/// stops it. `Err` says why nothing was measured.
pub fn measure(cfg: &Config, plan: &Plan, gpus: Option<&NvmlProbe>) -> Result<Measured, String> {
    let gpus = gpus.ok_or("NVML is not available: no GPU to measure on")?;
    let place = plan
        .placement
        .iter()
        .find(|p| p.gpu.is_some())
        .ok_or("no worker is planned on a GPU: nothing to measure")?;
    let mut config = worker_config(cfg, plan, place.slot, 0, 0);
    config.profile = true;
    config.metrics = None;
    if let Some(g) = config.gpu.as_mut() {
        unbounded(g, plan);
    }
    let index = config.gpu.as_ref().map(|g| g.index).unwrap_or(0);
    let mps_limit_mb = config.gpu.as_ref().and_then(|g| g.mps_limit_mb);
    // For the fallback when NVML cannot see the worker's pid (`device_delta`).
    let free_before = gpus.free_bytes(index).ok();
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot open a loopback listener for the profiling worker: {e}"))?;
    let secrets = cfg.access.secrets.fd();
    config.secrets = secrets.is_some();
    let mut w = launch(
        &cfg.workers.binary,
        &WorkerSpec {
            config,
            board: None,
            secrets,
        },
        &listener,
    )
    .map_err(|e| {
        format!(
            "cannot start the profiling worker {}: {e}",
            cfg.workers.binary.display()
        )
    })?;
    let pid = w.pid;
    tracing::info!(
        event = "memory_profiling",
        pid,
        gpu = index,
        mps_limit_mb,
        "profiling one worker's GPU memory (pid {pid}, GPU {index}{})",
        mps_limit_mb.map_or(String::new(), |l| format!(", MPS limit {l} MB"))
    );
    let mut reaped = false;
    let outcome = wait_for_pass(&mut w.control, pid, cfg.limits.boot_timeout, &mut reaped);
    // Read NVML while the worker still holds its memory, then stop it (unless it is gone
    // and reaped already: its pid may belong to another process by now).
    let nvml_used = gpus.process_used_bytes(index, pid).ok().flatten();
    let free_after = gpus.free_bytes(index).ok();
    if !reaped {
        stop(pid);
    }
    let (peak, reserved, pass_ms) = outcome?;
    let device_delta = match (nvml_used, free_before, free_after) {
        (None, Some(before), Some(after)) if before > after => Some(before - after),
        _ => None,
    };
    if let Some(delta) = device_delta {
        tracing::warn!(
            event = "footprint_from_free_memory",
            pid,
            gpu = index,
            mb = delta >> 20,
            "NVML does not list the profiling worker (pid {pid}) among GPU {index}'s processes (in a container without the host's PID namespace it lists host pids): its footprint, CUDA context included, is taken as the fall of GPU {index}'s free memory while it started ({} MB), which also counts anything else that started on that GPU meanwhile",
            delta >> 20
        );
    }
    let bytes = footprint(nvml_used.or(device_delta), peak, reserved).ok_or_else(|| {
        format!("neither NVML nor the CUDA allocator reported the profiling worker's memory (pid {pid} on GPU {index})")
    })?;
    Ok(Measured {
        gpu: index,
        footprint_mb: bytes.div_ceil(MB),
        nvml_used,
        device_delta,
        allocator_peak: peak,
        allocator_reserved: reserved,
        recorded_context_mb: None,
        pass_ms,
        pid,
    })
}

/// The profiling worker measures what the model really takes, not what a share of the GPU
/// allows: no allocator cap, and under MPS (where the driver enforces each client's limit)
/// the whole usable memory of its GPU as its limit instead of one worker's share — which
/// the plan bounded by the per-client limit the server inherited ([`super::plan`]'s MPS
/// rules), so it never exceeds that. A model bigger than its estimate, the case profiling
/// exists for, is then measured rather than cut off at the estimate.
fn unbounded(g: &mut GpuAssignment, plan: &Plan) {
    g.memory_fraction = None;
    g.cap_mb = None;
    if g.mps_limit_mb.is_some() {
        let usable = plan
            .gpus
            .iter()
            .find(|p| p.index == g.index)
            .map(|p| p.usable_mb);
        g.mps_limit_mb = usable.or(g.mps_limit_mb);
    }
}

type Pass = (Option<u64>, Option<u64>, f64);

/// Reads the worker's control channel until its `Footprint` and `Ready` arrived.
fn wait_for_pass(
    control: &mut std::os::unix::net::UnixStream,
    pid: u32,
    limit: Duration,
    reaped: &mut bool,
) -> Result<Pass, String> {
    let deadline = Instant::now() + limit;
    let mut buf = Vec::new();
    let mut pass: Option<Pass> = None;
    loop {
        let mut chunk = [0u8; 4096];
        match control.read(&mut chunk) {
            Ok(0) => {
                return Err(format!(
                    "the profiling worker (pid {pid}) exited before it was ready{}",
                    exit_status(pid, reaped)
                ))
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("profiling worker's control channel: {e}")),
        }
        while let Some(line) = take_line(&mut buf) {
            match ControlMsg::from_line(&line) {
                Ok(ControlMsg::Footprint { error: Some(e), .. }) => {
                    return Err(format!("the profiling pass failed: {e}"))
                }
                Ok(ControlMsg::Footprint {
                    allocator_peak,
                    allocator_reserved,
                    pass_ms,
                    ..
                }) => pass = Some((allocator_peak, allocator_reserved, pass_ms.unwrap_or(0.0))),
                Ok(ControlMsg::Ready { .. }) => {
                    return pass.ok_or_else(|| {
                        "the profiling worker was ready without reporting a pass".to_string()
                    })
                }
                _ => {}
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the profiling worker (pid {pid}) was not ready within --boot-timeout ({} s)",
                limit.as_secs()
            ));
        }
        let wait = left.min(Duration::from_millis(100));
        let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLIN)];
        let _ = poll(
            &mut fds,
            PollTimeout::try_from(wait.as_millis() as u64).unwrap_or(PollTimeout::MAX),
        );
    }
}

/// `: exit status N` (or the signal) once the process has exited (and is reaped: `reaped`
/// is set), else nothing.
fn exit_status(pid: u32, reaped: &mut bool) -> String {
    match reap_within(pid, Duration::from_secs(2)) {
        Reaped::Gone(Some(how)) => {
            *reaped = true;
            format!(": {how}")
        }
        Reaped::Gone(None) | Reaped::Running => String::new(),
    }
}

/// TERM, then KILL after 10 s; reaps it.
fn stop(pid: u32) {
    let p = Pid::from_raw(pid as i32);
    let _ = kill(p, Signal::SIGTERM);
    if let Reaped::Running = reap_within(pid, Duration::from_secs(10)) {
        let _ = kill(p, Signal::SIGKILL);
        let _ = waitpid(p, None);
    }
}

/// What waiting for a child came to.
enum Reaped {
    /// Still running when the time was up.
    Running,
    /// Exited and reaped (how, when `waitpid` said), or not ours to wait for.
    Gone(Option<String>),
}

/// Waits up to `limit` for the child `pid` to exit, reaping it.
fn reap_within(pid: u32, limit: Duration) -> Reaped {
    let p = Pid::from_raw(pid as i32);
    let deadline = Instant::now() + limit;
    loop {
        match waitpid(p, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(WaitStatus::StillAlive) => return Reaped::Running,
            Ok(WaitStatus::Exited(_, code)) => {
                return Reaped::Gone(Some(format!("exit status {code}")))
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                return Reaped::Gone(Some(format!("killed by {sig}")))
            }
            _ => return Reaped::Gone(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_footprint_is_the_allocator_peak_plus_what_the_process_holds_besides() {
        let mb = |n: u64| n * MB;
        // NVML 2500 MB with 2000 reserved now (context 500) and a peak of 3000: 3500.
        assert_eq!(
            footprint(Some(mb(2500)), Some(mb(3000)), Some(mb(2000))),
            Some(mb(3500))
        );
        assert_eq!(footprint(Some(mb(900)), None, None), Some(mb(900)));
        assert_eq!(footprint(None, Some(mb(700)), Some(mb(100))), Some(mb(700)));
        assert_eq!(footprint(None, None, None), None);
        let m = Measured {
            gpu: 0,
            footprint_mb: 1000,
            nvml_used: None,
            device_delta: None,
            allocator_peak: None,
            allocator_reserved: None,
            recorded_context_mb: None,
            pass_ms: 1.0,
            pid: 1,
        };
        assert_eq!(m.planned_mb(1.2, 0), 1200);
        assert_eq!(m.planned_mb(1.2, 5000), 5000);
    }
}
