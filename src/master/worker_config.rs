//! What a worker is told ([`WorkerConfig`], as JSON in `VRAMFORK_WORKER_CONFIG`, or through
//! the template in a [`TemplateRequest`]): the master's configuration groups a worker serves
//! by, serialised as they are — so a flag a worker needs is one field of its group, read
//! where it is used — and what is this worker's own (its slot, its GPU, its seat, its share
//! of the plan). It lives with the master because the groups do; the worker reads it with
//! the rest of the library.

use serde::{Deserialize, Serialize};

use crate::master::config::{Access, Batch, HostMemory, Limits, Log, Tracing};
use crate::protocol::{Device, FootprintFigures, GpuAssignment, WorkerMetrics};

/// Everything a worker needs to serve.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// Slot number (stable across recycling), used in the process name `vf-worker-<slot>`.
    pub slot: u32,
    /// How many workers this slot has had before this one.
    pub generation: u64,
    /// The app metadata document, as JSON text (validated by the master).
    pub metadata_json: String,
    /// Where the metadata came from (for messages).
    pub metadata_path: String,
    /// Absolute path of the model file.
    pub model_path: String,
    /// The model's v2 name (`--model-name`); `None`: the metadata's `name`.
    #[serde(default)]
    pub model_name: Option<String>,
    pub device: Device,
    pub gpu: Option<GpuAssignment>,
    /// Model requests after which the worker retires (jitter already added); 0 = never.
    pub max_requests: u64,
    /// Retire after a request during which the worker's GPU memory grew past this (MB):
    /// its allocator's reserved bytes plus what it holds besides (`protocol::gpu_used`).
    pub max_worker_gpu_mb: Option<u64>,
    /// MB the plan assumes a GPU worker holds besides its allocator (its CUDA context,
    /// measured by profiling or 500), until NVML shows the worker's own.
    #[serde(default)]
    pub gpu_context_mb: u64,
    /// The `oom_score_adj` a worker sets itself as it starts (above the master's and the
    /// template's, so that the kernel's OOM killer takes a worker first); `None`: leave it.
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
    /// Run one forward pass on the device at the metadata's profile input right after
    /// loading and report what it used (`ControlMsg::Footprint`) before `Ready`.
    #[serde(default)]
    pub profile: bool,
    /// Milliseconds between heartbeats on the control channel.
    pub heartbeat_ms: u64,
    /// Torch intra-op threads.
    pub torch_threads: usize,
    /// `--simulated-gpus`: placed on a simulated GPU, so load the model on the CPU and say
    /// so instead of failing for want of CUDA.
    #[serde(default)]
    pub simulated_gpu: bool,
    pub nvml_library: Option<String>,
    /// Whether a control channel is inherited on `protocol::CONTROL_FD`.
    pub has_control: bool,
    /// This worker's seat on the idle board inherited on `protocol::BOARD_FD`
    /// ([`crate::board`]); `None`: it takes no part (development mode, the profiling worker,
    /// the template).
    #[serde(default)]
    pub board_seat: Option<u32>,
    /// Whether the master's last accepted key and TLS material ([`crate::secrets`]) is
    /// inherited on `protocol::SECRETS_FD`: then the worker never reads the key files, and
    /// starts TLS from that material, whatever the files hold when it boots.
    #[serde(default)]
    pub secrets: bool,
    /// Count requests for `/metrics` (`--metrics-port` given); `None`: count nothing.
    #[serde(default)]
    pub metrics: Option<WorkerMetrics>,
    /// When the plan came from a measured footprint: the figures, shown by `GET /`.
    #[serde(default)]
    pub footprint: Option<FootprintFigures>,
    /// The per-worker limits and timeouts (`--request-timeout`, `--max-queue-wait`,
    /// `--max-body-mb`, `--graceful-timeout`…).
    pub limits: Limits,
    /// How the model thread runs passes (batching, warm-up passes, inline passes).
    pub batch: Batch,
    /// Recycling on the worker's own host memory (`--max-worker-memory-mb`).
    pub host_memory: HostMemory,
    /// The key files and TLS (the material itself comes on `protocol::SECRETS_FD`).
    pub access: Access,
    /// The log's format and the access log.
    pub log: Log,
    /// The trace export, as the master read it from the `OTEL_*` variables.
    pub tracing: Tracing,
}

/// Master → template, one JSON line, sent with the new worker's end of its control channel
/// attached (`SCM_RIGHTS`).
///
/// The template is an `app-worker` started with `protocol::ENV_TEMPLATE`: single-threaded,
/// it has loaded libtorch and the model on the CPU and nothing more (no forward pass, no
/// CUDA, no thread). For each request it forks twice; the grandchild, re-parented to the
/// master (a child subreaper), sets `PR_SET_PDEATHSIG`, takes the attached socket as its
/// control channel (fd 4) and becomes the worker described by `config` — in milliseconds
/// instead of the ~0.3 s an exec that loads libtorch costs. It answers with a
/// `protocol::TemplateReply`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateRequest {
    pub config: WorkerConfig,
}
