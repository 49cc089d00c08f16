//! The master↔worker contract in one place: how a worker is told what to do (environment),
//! which file descriptors it inherits, the control messages it sends back (newline-delimited
//! JSON over a Unix socket pair), and what its exit status means.
//!
//! The master talks to a worker with signals only: TERM = retire gracefully (stop accepting,
//! finish in-flight requests, exit 0), QUIT/INT = exit now, KILL = last resort.

use serde::{Deserialize, Serialize};

/// The listening socket a worker inherits (systemd's `LISTEN_FDS` convention: fd 3).
pub const LISTEN_FD: i32 = 3;
/// The worker's end of its control channel, when it has one.
pub const CONTROL_FD: i32 = 4;
/// The `/metrics` listener a development-mode worker serves (`--metrics-port`).
pub const METRICS_FD: i32 = 5;
/// The idle board ([`crate::board`]) every process the master starts inherits.
pub const BOARD_FD: i32 = 6;
/// The key and TLS material the master last accepted ([`crate::secrets`]), when the
/// worker's configuration says `secrets`.
pub const SECRETS_FD: i32 = 7;

/// Environment: number of inherited listening sockets (always 1), systemd style.
pub const ENV_LISTEN_FDS: &str = "LISTEN_FDS";
/// Environment: the worker's configuration as JSON (`crate::master::worker_config`).
pub const ENV_WORKER_CONFIG: &str = "VRAMFORK_WORKER_CONFIG";
/// Environment: set to `1` to start `app-worker` as the template process (see
/// `crate::master::worker_config::TemplateRequest`) instead of a worker.
pub const ENV_TEMPLATE: &str = "VRAMFORK_TEMPLATE";

/// Which device the model runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// CUDA when libtorch sees a GPU, else CPU.
    Auto,
    Cpu,
    Cuda,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

mod gpu;

pub use gpu::{
    cuda_version_text, gpu_env, mps_limit_value, GpuAssignment, MigInstance, CUDA_BUILD_MIN_DRIVER,
    CUDA_BUILD_VERSION, ENV_MPS_MEM_LIMIT,
};

/// `--warmup-passes`' default: TorchScript's profiling executor profiles on a function's
/// first call and optimizes on its second, so two passes leave a model optimized whichever
/// executor runs it; the first also pays the one-time costs (kernels loaded, allocator
/// grown).
pub const DEFAULT_WARMUP_PASSES: u32 = 2;

/// One worker's GPU memory as declared, measured and planned (MB), for `GET /`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FootprintFigures {
    /// The metadata's `est_gpu_mem_typ`.
    pub declared_mb: u64,
    /// Measured by a profiling worker, or remembered (`--footprint-file`).
    pub measured_mb: u64,
    /// What the plan assumes per worker.
    pub planned_mb: u64,
}

/// What a worker does for `/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerMetrics {
    /// Serve `/metrics` itself on [`METRICS_FD`] (development mode: no master).
    pub serve: bool,
    /// The plan's numbers, for the families a development-mode worker serves.
    pub cpu_bound: u32,
    pub gpu_bound: Option<u32>,
    pub planned: u32,
    /// MB per worker the plan assumes (`Plan::planned_typ_mb`).
    #[serde(default)]
    pub planned_typ_mb: u64,
}

/// Why a worker retires by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetireReason {
    /// Reached `--max-requests` (+ jitter).
    MaxRequests,
    /// Its GPU memory grew past `--max-worker-gpu-mb`.
    GpuMemory,
    /// Its own host memory grew past `--max-worker-memory-mb`.
    HostMemory,
    /// A CUDA out-of-memory error: the allocator's state is no longer trusted.
    OutOfMemory,
    /// A request ran past `--request-timeout`; the forward pass cannot be interrupted.
    RequestTimeout,
    /// The master asked (TERM).
    Asked,
}

impl RetireReason {
    /// Its name in control messages and the master's events (`max_requests`, …).
    pub fn code(self) -> &'static str {
        match self {
            RetireReason::MaxRequests => "max_requests",
            RetireReason::GpuMemory => "gpu_memory",
            RetireReason::HostMemory => "host_memory",
            RetireReason::OutOfMemory => "out_of_memory",
            RetireReason::RequestTimeout => "request_timeout",
            RetireReason::Asked => "asked",
        }
    }
}

/// Worker → master, one JSON object per line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ControlMsg {
    /// The model is loaded and the worker accepts connections.
    Ready {
        pid: u32,
        /// Milliseconds from the worker's `main` to ready, split where it was measured.
        boot_ms: BootTimes,
        /// Where the model really runs: `cuda:0`, `cpu`, or `cpu (simulated GPU)`
        /// (`--simulated-gpus`); empty from a template, which never serves.
        #[serde(default)]
        device: String,
        /// Its own host memory when ready, and the template's warm-up's peak.
        #[serde(default)]
        memory: Option<ReadyMemory>,
    },
    /// A profiling worker's pass (sent before `Ready`): what the CUDA caching allocator
    /// reserved at its peak and reserves now (`None` off CUDA), or why the pass failed.
    Footprint {
        allocator_peak: Option<u64>,
        allocator_reserved: Option<u64>,
        pass_ms: Option<f64>,
        error: Option<String>,
    },
    /// Sent every `heartbeat_ms` by the worker's event loop; on CUDA with the caching
    /// allocator's peak and current reserved bytes (what the master learns footprints from).
    Heartbeat {
        served: u64,
        in_flight: u32,
        /// Requests it has taken that wait for the model (not started yet).
        #[serde(default)]
        queued: u32,
        /// `queued` by priority lane, highest first (`crate::lanes::LANES`).
        #[serde(default)]
        queued_lanes: [u32; 3],
        #[serde(default)]
        allocator_peak: Option<u64>,
        #[serde(default)]
        allocator_reserved: Option<u64>,
        /// Its GPU footprint now ([`gpu_footprint`] of its own NVML figure and allocator),
        /// when NVML lists a figure for it (never the allocator's figures alone, which
        /// leave the CUDA context out).
        #[serde(default)]
        footprint: Option<u64>,
        /// Its own host memory now ([`crate::own_memory`]), bytes.
        #[serde(default)]
        own_memory: Option<u64>,
        /// Once a pass has answered a request: how far its passes took its resident set
        /// since ready (what the master bounds the pool by when nothing was measured at start).
        #[serde(default)]
        passes_peak: Option<PassesPeak>,
    },
    /// What it has answered so far (cumulative), sent with a heartbeat when it changed
    /// and once more before it exits.
    Metrics {
        traffic: crate::metrics::traffic::Traffic,
        /// The CUDA caching allocator's peak reserved bytes (CUDA workers).
        allocator_peak: Option<u64>,
    },
    /// The worker stopped accepting and will exit once its in-flight requests are done.
    Retiring {
        reason: RetireReason,
        served: u64,
        /// Requests it was handling when it stopped accepting (they are finished first).
        #[serde(default)]
        in_flight: u32,
        /// Its own host memory when it decided (`host_memory`), bytes.
        #[serde(default)]
        own_memory: Option<u64>,
    },
}

/// A process's host memory when it says it is ready (bytes; [`crate::own_memory`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyMemory {
    /// What it alone holds.
    pub own: u64,
    /// Its resident set.
    pub rss: u64,
    /// The template: how far its warm-up passes took its resident set above where it was
    /// before them (the peak of a pass's activations and scratch); `None` when it ran none
    /// or the kernel could not reset the peak. A worker that warmed itself up (exec'd): how
    /// far its load and warm-up took its resident set above where it is when ready.
    #[serde(default)]
    pub pass_peak: Option<u64>,
}

/// A serving worker's host memory as its passes took it (bytes): its own memory when it
/// became ready, and how far the peak of its resident set rose above the resident set it
/// had then, over the passes it has run since (activations, scratch, what the allocator
/// kept). Their sum is what one more such worker costs at its peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassesPeak {
    pub own_at_ready: u64,
    pub rise: u64,
}

/// A worker's GPU footprint in bytes: the caching allocator's peak reserved bytes plus what
/// the process holds besides the allocator (NVML's figure for it − the allocator's reserved
/// bytes now: the CUDA context, library workspaces). With NVML's figure alone (no
/// allocator figures: a worker running on the CPU), that figure; with the allocator alone
/// (NVML cannot see the process, as in a container without the host's PID namespace), the
/// peak — which leaves the context out.
pub fn gpu_footprint(
    nvml_used: Option<u64>,
    peak: Option<u64>,
    reserved: Option<u64>,
) -> Option<u64> {
    match (nvml_used, peak, reserved) {
        (Some(used), Some(peak), Some(reserved)) => Some(used.saturating_sub(reserved) + peak),
        (Some(used), _, _) => Some(used),
        (None, Some(peak), _) => Some(peak),
        (None, None, _) => None,
    }
}

/// A worker's GPU memory as `nvidia-smi` shows it, which `--max-worker-gpu-mb` compares:
/// its caching allocator's reserved bytes plus what it holds besides them (`context`:
/// NVML's figure for it less its reserved bytes at its last heartbeat, else the plan's
/// context figure).
pub fn gpu_used(reserved: u64, context: u64) -> u64 {
    reserved.saturating_add(context)
}

/// Where a worker's boot time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BootTimes {
    /// Process start (exec) to `main`, as far as the worker can tell.
    pub process_ms: f64,
    /// `CModule::load` and moving the model to its device.
    pub model_ms: f64,
    /// A first forward pass to warm the executor, when one was run.
    pub warmup_ms: f64,
}

/// Takes one line (without its `\n`) off the front of what was read from a channel of JSON
/// lines, when a whole one has arrived.
pub fn take_line(buf: &mut Vec<u8>) -> Option<String> {
    let nl = buf.iter().position(|b| *b == b'\n')?;
    let line: Vec<u8> = buf.drain(..=nl).collect();
    Some(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned())
}

impl ControlMsg {
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("control messages always serialize");
        s.push('\n');
        s
    }

    pub fn from_line(line: &str) -> Result<ControlMsg, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// Template → master, one JSON line per `TemplateRequest` (after its first line, a
/// [`ControlMsg::Ready`] once the model is loaded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum TemplateReply {
    Spawned { pid: u32 },
    Failed { error: String },
}

/// Worker exit statuses the master tells apart.
pub mod worker_exit {
    /// Retired or stopped normally.
    pub const OK: i32 = 0;
    /// Bad worker configuration (a bug in the master, or a hand-started worker).
    pub const CONFIG: i32 = 2;
    /// The model could not be loaded.
    pub const MODEL_LOAD: i32 = 3;
    /// A CUDA error other than out-of-memory: the context is unusable.
    pub const CUDA_FATAL: i32 = 5;
    /// Placed on a GPU, but libtorch sees no CUDA device (a driver older than the build's
    /// CUDA, no GPU device files in a container, a libtorch without CUDA): serving anyway
    /// would put the model on the CPU. (An allocator cap that cannot be set is
    /// [`MODEL_LOAD`]: that worker's load failed; it never runs uncapped.)
    pub const NO_CUDA: i32 = 7;
    /// The template cannot fork safely (it found more than one thread after loading).
    pub const TEMPLATE_UNFIT: i32 = 6;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_round_trip_as_single_lines() {
        let msgs = [
            ControlMsg::Ready {
                pid: 42,
                boot_ms: BootTimes {
                    process_ms: 1.5,
                    model_ms: 20.0,
                    warmup_ms: 3.0,
                },
                device: "cuda:0".into(),
                memory: Some(ReadyMemory {
                    own: 1 << 20,
                    rss: 300 << 20,
                    pass_peak: Some(100 << 20),
                }),
            },
            ControlMsg::Heartbeat {
                served: 7,
                in_flight: 1,
                queued: 2,
                queued_lanes: [1, 0, 1],
                allocator_peak: Some(3 << 30),
                allocator_reserved: None,
                footprint: Some(3 << 30),
                own_memory: Some(40 << 20),
                passes_peak: Some(PassesPeak {
                    own_at_ready: 2 << 20,
                    rise: 100 << 20,
                }),
            },
            ControlMsg::Retiring {
                reason: RetireReason::OutOfMemory,
                served: 9,
                in_flight: 1,
                own_memory: None,
            },
        ];
        for m in msgs {
            let line = m.to_line();
            assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
            assert_eq!(ControlMsg::from_line(line.trim_end()).unwrap(), m);
        }
        assert!(ControlMsg::from_line(r#"{"msg":"bogus"}"#).is_err());
        // A reason's code is its name on the wire.
        for r in [
            RetireReason::MaxRequests,
            RetireReason::GpuMemory,
            RetireReason::HostMemory,
            RetireReason::OutOfMemory,
            RetireReason::RequestTimeout,
            RetireReason::Asked,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.code());
        }
    }

    /// `--max-worker-gpu-mb` compares what `nvidia-smi` shows of a
    /// worker — its allocator's reserved bytes plus its context — not the allocator's bytes
    /// alone, which passed the limit about a context (~500 MB) late.
    #[test]
    fn the_gpu_memory_a_limit_compares_counts_the_context() {
        let mb = 1u64 << 20;
        let limit = 2000 * mb;
        assert!(1800 * mb < limit, "the allocator alone is under it");
        assert!(
            gpu_used(1800 * mb, 500 * mb) > limit,
            "as nvidia-smi shows it, over"
        );
        assert!(gpu_used(1000 * mb, 500 * mb) < limit);
        assert_eq!(gpu_used(u64::MAX, 1), u64::MAX);
    }
}
