//! A stand-in for `libnvidia-ml.so` so that the real NVML code path (`nvml-wrapper`, then
//! `resources::NvmlProbe`) runs without a GPU. Load it with `--nvml-library
//! target/<profile>/libnvml_mock.so` (or `NvmlProbe::open(Some(path))`).
//!
//! The simulated GPUs come from the JSON file named by `NVML_MOCK_FILE`, re-read on every
//! call, so a test can change free memory or processes while a server runs:
//!
//! ```json
//! {"driver": "550.54.15", "cuda_driver_version": 12040,
//!  "gpus": [{"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-…", "total_mb": 40960,
//!            "free_mb": 40000, "reserved_mb": 512, "compute_mode": "default",
//!            "processes": [{"pid": 123, "used_mb": 500}],
//!            "errors": {"nvmlDeviceGetComputeMode": 3}}]}
//! ```
//!
//! Sizes: every `X_mb` key may be given as `X_bytes` instead (bytes win); MB = 2^20 bytes.
//!
//! # Top level
//!
//! - `driver` (string, default `"580.65.06"`, a driver whose CUDA version is 13.0): `nvmlSystemGetDriverVersion`.
//! - `cuda_driver_version` (int, CUDA's encoding 1000 × major + 10 × minor, default 13000):
//!   `nvmlSystemGetCudaDriverVersion(_v2)`. `nvmlSystemGetNVMLVersion` follows it as real
//!   NVML does: `"<CUDA major>.<driver>"`, e.g. `"12.550.54.15"`.
//! - `init_error` (`nvmlReturn_t`): `nvmlInit*` fails with that code.
//! - `pid_namespace_offset` (int, default 0): see `visible_process_used_mb` below.
//! - `errors` (object, function name → `nvmlReturn_t`): that exported function answers the
//!   code instead of doing its work, for every device and for the system-wide calls
//!   (`nvmlSystemGet*`, `nvmlDeviceGetCount*`, `nvmlInit*`; not `nvmlShutdown` or
//!   `nvmlErrorString`). Names are exact: `nvmlDeviceGetMemoryInfo` (v1) and
//!   `nvmlDeviceGetMemoryInfo_v2` are different functions; `nvml-wrapper` 0.12 calls
//!   `nvmlDeviceGetCount_v2`, `nvmlDeviceGetHandleByIndex_v2`,
//!   `nvmlDeviceGetMemoryInfo_v2`, `nvmlDeviceGetComputeRunningProcesses_v3` and
//!   `nvmlSystemGetCudaDriverVersion_v2`.
//! - `gpus` (array): the GPUs, in index order.
//!
//! # Per GPU
//!
//! - `name` (default `"NVIDIA Mock GPU"`), `uuid` (default `GPU-mock-<index>`).
//! - `total_mb` (required).
//! - `reserved_mb` (default 0): memory the driver and firmware set aside. As on recent real
//!   drivers, `nvmlMemory_v2_t` reports total = free + used + reserved, while v1
//!   (`nvmlDeviceGetMemoryInfo`) counts the reserved memory as used (used = total − free).
//! - `free_mb` (default: total − reserved; at most total − reserved).
//! - `used_mb` (default: total − reserved − free): the v2 `used`; v1 reports used +
//!   reserved. With `free_follows_processes` it is the base use of things other than the
//!   listed processes (default 0).
//! - `free_follows_processes` (bool, default false): free memory falls as processes use
//!   memory: used = `used_mb` + Σ(the `used` of every process this device reports,
//!   including those found through `visible_process_used_mb`, and the MPS server and
//!   clients; "not available" ones count 0), free = total − reserved − used (saturating at
//!   0). `free_mb` is then ignored.
//! - `processes` (array of `{"pid", "used_mb"}`; omit the size for "not available"): the
//!   compute processes reported as they are (no PID offset applied).
//! - `visible_process_used_mb`: every process of this machine whose `CUDA_VISIBLE_DEVICES`
//!   is exactly this GPU's UUID (found in `/proc`) is reported as a compute process using
//!   that much, under its pid + `pid_namespace_offset` (as NVML reports host PIDs to a
//!   container that lacks the host PID namespace, where the caller's own pid is then
//!   never found).
//! - `pid_namespace_offset`: overrides the top-level one for this GPU and its MIG instances.
//! - `mps` (object `{"server_pid", "server_used_mb"}`): an MPS server runs on this device
//!   (NVIDIA's MPS documentation: the server holds the one compute context its clients
//!   share; `nvidia-smi` types the server "C" and its clients "M"). The compute list
//!   (`nvmlDeviceGetComputeRunningProcesses*`) then shows the server (and `processes`,
//!   processes that bypass it), while the clients — `mps_processes`, and every process
//!   `visible_process_used_mb` finds — are listed by
//!   `nvmlDeviceGetMPSComputeRunningProcesses_v3` alone, under their host pids as any
//!   process list. Without `mps` that list is empty (`SUCCESS`, no entry).
//! - `mps_processes` (array, as `processes`): MPS clients listed as they are.
//! - `lists_grow` (default 0): the first so many fill calls of a process list (compute or
//!   MPS; counted per process using the library) find one process more than the count call
//!   before them reported, and answer `INSUFFICIENT_SIZE` with that count — as a real
//!   driver does when a client starts between the two calls.
//! - `compute_mode`: `"default"` | `"exclusive_thread"` | `"prohibited"` |
//!   `"exclusive_process"` (or the integer `nvmlComputeMode_t` 0–3; default `"default"`):
//!   `nvmlDeviceGetComputeMode`.
//! - `compute_capability` (string `"major.minor"`, default `"9.0"`, an H100's):
//!   `nvmlDeviceGetCudaComputeCapability`, which answers it for the GPU's MIG instances
//!   too (they run on its SMs).
//! - `lost` (bool): every call on this GPU (and on its MIG instances) fails with
//!   `GPU_IS_LOST`.
//! - `errors`: as the top-level one, for calls on this GPU's handle (and
//!   `nvmlDeviceGetHandleByIndex(_v2)` for its index); not for its MIG instances.
//! - `mig_capable` (bool, default false; implied by `mig`): a MIG-capable GPU with MIG
//!   disabled, when there is no `mig` key.
//! - `mig` (object): the GPU supports MIG:
//!   - `current`, `pending` (bool, default true and `current`): `nvmlDeviceGetMigMode`
//!     (`NVML_DEVICE_MIG_ENABLE` = 1 / `DISABLE` = 0).
//!   - `max_instances` (int, default 7 as on A100/H100, at least the length of
//!     `instances`): `nvmlDeviceGetMaxMigDeviceCount` while MIG is enabled.
//!   - `privileged` (bool, default true): false makes the parent's aggregate queries
//!     (`nvmlDeviceGetMemoryInfo(_v2)`, `nvmlDeviceGetComputeRunningProcesses*`) fail
//!     with `NO_PERMISSION` while MIG is enabled, as real NVML does for a caller without
//!     the privileges nvml.h asks for ("In MIG mode, if device handle is provided, the API
//!     returns aggregate information, only if the caller has appropriate privileges").
//!   - `instances` (array): the MIG devices, in index order; `null` is an empty slot.
//!     Each takes `name` (default `"<GPU name> MIG"`), `uuid` (default
//!     `MIG-mock-<gpu>-<index>`), `total_mb` (required), `reserved_mb`, `free_mb`,
//!     `used_mb`, `free_follows_processes`, `processes`, `visible_process_used_mb`
//!     (matched against the instance's UUID), `pid_namespace_offset`, `compute_mode`
//!     (default: the GPU's), `errors` (for calls on this instance's handle), `mps`,
//!     `mps_processes`, with the GPU's meanings, and `gpu_instance_id` (default index + 1)
//!     and `compute_instance_id` (default 0), which its processes carry too. Instances
//!     with the same `gpu_instance_id` are compute instances of one GPU instance and share
//!     its memory (NVIDIA's MIG user guide: the compute instances of a GPU instance share
//!     its memory): each reports the memory of the first of them (its `total_mb`,
//!     `reserved_mb`, `free_mb`, `used_mb`, `free_follows_processes`), and with
//!     `free_follows_processes` free memory falls with the processes of every one of them.
//!
//! # MIG behaviour
//!
//! `nvmlDeviceGetCount`/`nvmlDeviceGetHandleByIndex` list physical GPUs only (as real
//! NVML). A MIG device's handle comes from `nvmlDeviceGetMigDeviceHandleByIndex` and is
//! distinct from every GPU handle: GPU `g` is `g + 1`, its instance `i` is
//! `(g + 1) | ((i + 1) << 16)`. On a MIG-enabled GPU:
//!
//! - `nvmlDeviceGetMaxMigDeviceCount` answers `max_instances`; on a GPU without MIG or with
//!   MIG disabled, and on a MIG handle, it answers 0 (nvml.h: "Returns zero if MIG is not
//!   supported or enabled").
//! - `nvmlDeviceGetMigDeviceHandleByIndex`: an instance, `NOT_FOUND` for an empty slot
//!   below `max_instances`, `INVALID_ARGUMENT` at or past it or on a MIG handle,
//!   `NOT_SUPPORTED` when MIG is not enabled.
//! - `nvmlDeviceGetMigMode`: `NOT_SUPPORTED` on a GPU that is not MIG-capable and on a MIG
//!   handle.
//! - The parent's memory info reports the whole GPU (its own fields), and its compute
//!   processes are the aggregate, as nvml.h documents: its own `processes` (without
//!   instance IDs) then those of every instance (with their instance IDs). With
//!   `free_follows_processes` on the parent, that aggregate is what is summed.
//! - A MIG handle answers name, UUID, memory info (v1, v2), compute processes (with
//!   `gpuInstanceId`/`computeInstanceId` set), compute mode, `nvmlDeviceGetGpuInstanceId`,
//!   `nvmlDeviceGetComputeInstanceId`, `nvmlDeviceIsMigDeviceHandle` (1) and
//!   `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`; `nvmlDeviceGetIndex` on it is
//!   `NOT_SUPPORTED`. On a GPU handle the two instance-ID queries are `NOT_SUPPORTED` and
//!   `nvmlDeviceGetDeviceHandleFromMigDeviceHandle` is `INVALID_ARGUMENT`.
//! - With MIG disabled (`current` false), the instances are not there.
//!
//! Order of checks on a device call: not initialised → `UNINITIALIZED`; unknown handle →
//! `INVALID_ARGUMENT`; lost GPU → `GPU_IS_LOST`; the device's own `errors`, then the
//! top-level ones; then the call's work.
//!
//! Without the variable, or with a file that cannot be read or parsed, `nvmlInit_v2` fails
//! with `NVML_ERROR_DRIVER_NOT_LOADED` and says why on stderr (a file that turns bad after
//! init makes calls answer `UNKNOWN`).
//!
//! Implemented: `nvmlInit_v2`, `nvmlInit`, `nvmlInitWithFlags`, `nvmlShutdown`,
//! `nvmlErrorString`, `nvmlSystemGetDriverVersion`, `nvmlSystemGetNVMLVersion`,
//! `nvmlSystemGetCudaDriverVersion(_v2)`, `nvmlDeviceGetCount(_v2)`,
//! `nvmlDeviceGetHandleByIndex(_v2)`, `nvmlDeviceGetIndex`, `nvmlDeviceGetName`,
//! `nvmlDeviceGetUUID`, `nvmlDeviceGetMemoryInfo(_v2)`,
//! `nvmlDeviceGetComputeRunningProcesses(_v2, _v3)`,
//! `nvmlDeviceGetMPSComputeRunningProcesses_v3`, `nvmlDeviceGetComputeMode`,
//! `nvmlDeviceGetMigMode`, `nvmlDeviceGetMaxMigDeviceCount`,
//! `nvmlDeviceGetMigDeviceHandleByIndex`, `nvmlDeviceIsMigDeviceHandle`,
//! `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`, `nvmlDeviceGetGpuInstanceId`,
//! `nvmlDeviceGetComputeInstanceId`. `nvml-wrapper` resolves every other symbol as a missing
//! one and fails only if it is called.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

type Ret = c_uint;
const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NO_PERMISSION: Ret = 4;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const GPU_IS_LOST: Ret = 15;
const ARGUMENT_VERSION_MISMATCH: Ret = 25;
const UNKNOWN: Ret = 999;

const MB: u64 = 1 << 20;
/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned long long.
const NOT_AVAILABLE: u64 = u64::MAX;
/// NVML's "no MIG instance" marker in process records.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;
/// `NVML_DEVICE_MIG_ENABLE` / `NVML_DEVICE_MIG_DISABLE`.
const MIG_ENABLE: c_uint = 1;
const MIG_DISABLE: c_uint = 0;
/// MIG devices per GPU unless `max_instances` says otherwise (A100, H100).
const DEFAULT_MAX_MIG: u32 = 7;
/// `cuda_driver_version` unless the file says otherwise (CUDA 13.0).
const DEFAULT_CUDA: c_int = 13_000;

/// Successful `nvmlInit` calls not yet matched by `nvmlShutdown` (NVML counts references).
static INITS: AtomicU32 = AtomicU32::new(0);
/// Fill calls of process lists that found the list grown (`lists_grow`), in this process.
static GROWN: AtomicU32 = AtomicU32::new(0);

/// An opaque device handle: `(gpu index + 1) | ((MIG index + 1) << 16)`, MIG part 0 for a
/// physical GPU, so that null stays invalid and every handle is distinct.
type Handle = *mut c_void;

fn gpu_handle(gpu: usize) -> Handle {
    (gpu + 1) as Handle
}

fn mig_handle(gpu: usize, instance: usize) -> Handle {
    ((gpu + 1) | ((instance + 1) << 16)) as Handle
}

#[repr(C)]
pub struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
pub struct ProcessV1 {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_t` (v2), used by the `_v2` and `_v3` process queries.
#[repr(C)]
pub struct ProcessV2 {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `NVML_STRUCT_VERSION(Memory, 2)`.
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

/// Injected answers: exported function name → `nvmlReturn_t`.
type Errors = HashMap<String, Ret>;

/// One compute process as reported.
#[derive(Clone, Copy)]
struct Proc {
    pid: u32,
    /// Bytes, or `NOT_AVAILABLE`.
    used: u64,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

/// A device's memory as the file describes it.
struct MemSpec {
    total: u64,
    reserved: u64,
    free: Option<u64>,
    used: Option<u64>,
    follows_processes: bool,
}

/// What the v2 query reports (v1: the same total and free, used + reserved).
struct Mem {
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

impl MemSpec {
    fn report(&self, procs: &[Proc]) -> Mem {
        let total = self.total;
        let reserved = self.reserved.min(total);
        let usable = total - reserved;
        if self.follows_processes {
            let sum = procs
                .iter()
                .filter(|p| p.used != NOT_AVAILABLE)
                .fold(0u64, |a, p| a.saturating_add(p.used));
            let used = self.used.unwrap_or(0).saturating_add(sum);
            Mem {
                total,
                reserved,
                free: usable.saturating_sub(used),
                used,
            }
        } else {
            let free = self.free.unwrap_or(usable).min(usable);
            Mem {
                total,
                reserved,
                free,
                used: self.used.unwrap_or(usable - free),
            }
        }
    }
}

/// What a GPU and a MIG instance have in common.
struct Node {
    name: String,
    uuid: String,
    mem: MemSpec,
    compute_mode: c_uint,
    /// The compute list (`nvmlDeviceGetComputeRunningProcesses*`): under MPS, the MPS
    /// server and processes that bypass it.
    processes: Vec<Proc>,
    /// The MPS list (`nvmlDeviceGetMPSComputeRunningProcesses_v3`): MPS clients.
    mps_processes: Vec<Proc>,
    errors: Errors,
}

struct Instance {
    node: Node,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

struct Mig {
    current: bool,
    pending: bool,
    max: u32,
    privileged: bool,
    /// `None`: an empty slot.
    instances: Vec<Option<Instance>>,
}

struct Gpu {
    node: Node,
    lost: bool,
    /// CUDA compute capability (major, minor).
    capability: (c_int, c_int),
    /// `lists_grow`: fill calls of a process list that find one process more than the
    /// count call before them reported.
    lists_grow: u32,
    /// `None`: not MIG-capable.
    mig: Option<Mig>,
}

impl Gpu {
    /// The instances, when MIG is enabled.
    fn live_mig(&self) -> Option<&Mig> {
        self.mig.as_ref().filter(|m| m.current)
    }

    /// The compute processes (or, `mps`, the MPS clients) the GPU's handle reports: its
    /// own, then (MIG enabled) every instance's.
    fn aggregate_processes(&self, mps: bool) -> Vec<Proc> {
        let list = |n: &Node| {
            if mps {
                n.mps_processes.clone()
            } else {
                n.processes.clone()
            }
        };
        let mut all = list(&self.node);
        if let Some(mig) = self.live_mig() {
            for inst in mig.instances.iter().flatten() {
                all.extend(list(&inst.node));
            }
        }
        all
    }

    /// The compute instances of the GPU instance `gi`: they share its memory.
    fn gpu_instance(&self, gi: u32) -> Vec<&Instance> {
        self.live_mig()
            .map(|m| {
                m.instances
                    .iter()
                    .flatten()
                    .filter(|i| i.gpu_instance_id == gi)
                    .collect()
            })
            .unwrap_or_default()
    }
}

struct State {
    driver: String,
    cuda: c_int,
    init_error: Option<Ret>,
    errors: Errors,
    gpus: Vec<Gpu>,
}

/// What a handle names.
enum Dev<'a> {
    Gpu(usize, &'a Gpu),
    Mig(usize, &'a Gpu, &'a Instance),
}

impl Dev<'_> {
    fn node(&self) -> &Node {
        match self {
            Dev::Gpu(_, g) => &g.node,
            Dev::Mig(_, _, i) => &i.node,
        }
    }

    fn processes(&self) -> Vec<Proc> {
        match self {
            Dev::Gpu(_, g) => g.aggregate_processes(false),
            Dev::Mig(_, _, i) => i.node.processes.clone(),
        }
    }

    fn mps_processes(&self) -> Vec<Proc> {
        match self {
            Dev::Gpu(_, g) => g.aggregate_processes(true),
            Dev::Mig(_, _, i) => i.node.mps_processes.clone(),
        }
    }

    /// Whether this fill call of a process list finds a process that started since the
    /// count call (`lists_grow`): the first so many of this process's fill calls do.
    fn list_grew(&self) -> bool {
        let grows = match self {
            Dev::Gpu(_, g) => g.lists_grow,
            Dev::Mig(_, g, _) => g.lists_grow,
        };
        grows > 0 && GROWN.fetch_add(1, Ordering::SeqCst) < grows
    }

    /// `NO_PERMISSION` for an aggregate query on a MIG-enabled GPU without privileges.
    fn aggregate_denied(&self) -> bool {
        matches!(self, Dev::Gpu(_, g) if g.live_mig().is_some_and(|m| !m.privileged))
    }

    /// A GPU's memory follows every process on it (both lists); a MIG device's is its GPU
    /// instance's, shared by the compute instances in it: reported from the first of them,
    /// following the processes of all of them.
    fn memory(&self) -> Mem {
        match self {
            Dev::Gpu(..) => {
                let mut all = self.processes();
                all.extend(self.mps_processes());
                self.node().mem.report(&all)
            }
            Dev::Mig(_, g, inst) => {
                let members = g.gpu_instance(inst.gpu_instance_id);
                let lead = members.first().copied().unwrap_or(inst);
                let all: Vec<Proc> = members
                    .iter()
                    .flat_map(|m| m.node.processes.iter().chain(&m.node.mps_processes))
                    .copied()
                    .collect();
                lead.node.mem.report(&all)
            }
        }
    }
}

fn bytes(v: &Value, key: &str) -> Option<u64> {
    v.get(format!("{key}_bytes"))
        .and_then(Value::as_u64)
        .or_else(|| {
            v.get(format!("{key}_mb"))
                .and_then(Value::as_u64)
                .map(|mb| mb.saturating_mul(MB))
        })
}

fn flag(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// The processes of this machine whose `CUDA_VISIBLE_DEVICES` is exactly `uuid` (the
/// workers a master placed on that device), from `/proc`; those it cannot read are skipped.
fn visible_processes(uuid: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let want = format!("CUDA_VISIBLE_DEVICES={uuid}");
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|v| v == want.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

fn parse_errors(v: &Value, ctx: &str) -> Result<Errors, String> {
    let Some(e) = v.get("errors") else {
        return Ok(Errors::new());
    };
    let obj = e
        .as_object()
        .ok_or(format!("{ctx}errors must be an object"))?;
    obj.iter()
        .map(|(name, code)| {
            code.as_u64()
                .and_then(|c| Ret::try_from(c).ok())
                .map(|c| (name.clone(), c))
                .ok_or(format!("{ctx}errors.{name} must be an nvmlReturn_t"))
        })
        .collect()
}

fn parse_compute_mode(v: &Value, ctx: &str, default: c_uint) -> Result<c_uint, String> {
    match v.get("compute_mode") {
        None => Ok(default),
        Some(Value::String(s)) => match s.as_str() {
            "default" => Ok(0),
            "exclusive_thread" => Ok(1),
            "prohibited" => Ok(2),
            "exclusive_process" => Ok(3),
            other => Err(format!("{ctx}compute_mode {other:?} is not one of default, exclusive_thread, prohibited, exclusive_process")),
        },
        Some(n) => n
            .as_u64()
            .and_then(|n| c_uint::try_from(n).ok())
            .ok_or(format!("{ctx}compute_mode must be a string or an integer")),
    }
}

/// `compute_capability`: `"major.minor"` (default 9.0).
fn parse_capability(v: &Value, ctx: &str) -> Result<(c_int, c_int), String> {
    let Some(cc) = v.get("compute_capability") else {
        return Ok((9, 0));
    };
    let bad = || format!("{ctx}compute_capability {cc} is not \"major.minor\" (e.g. \"8.0\")");
    let (major, minor) = cc
        .as_str()
        .and_then(|t| t.split_once('.'))
        .ok_or_else(bad)?;
    Ok((
        major.parse().map_err(|_| bad())?,
        minor.parse().map_err(|_| bad())?,
    ))
}

/// What a device's JSON object and its surroundings give `parse_node`.
struct NodeCtx<'a> {
    ctx: String,
    default_name: String,
    default_uuid: String,
    default_compute_mode: c_uint,
    pid_offset: u32,
    gpu_instance_id: u32,
    compute_instance_id: u32,
    /// For `Gpu`: `lost` etc. are read by the caller.
    v: &'a Value,
}

/// The processes listed under `key` (`{"pid", "used_mb"}`, no size: "not available").
fn parse_processes(v: &Value, key: &str, n: &NodeCtx<'_>) -> Vec<Proc> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .map(|p| Proc {
                    pid: p.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32,
                    used: bytes(p, "used").unwrap_or(NOT_AVAILABLE),
                    gpu_instance_id: n.gpu_instance_id,
                    compute_instance_id: n.compute_instance_id,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn parse_node(n: NodeCtx<'_>) -> Result<Node, String> {
    let v = n.v;
    let ctx = &n.ctx;
    let total = bytes(v, "total").ok_or(format!("{ctx}needs total_mb or total_bytes"))?;
    let mut processes = parse_processes(v, "processes", &n);
    let mut mps_processes = parse_processes(v, "mps_processes", &n);
    // An MPS server on this device: it holds the compute context (the compute list shows
    // it), and the processes that reach the device through it are MPS clients.
    let mps = match v.get("mps") {
        None | Some(Value::Null) => false,
        Some(m) if m.is_object() => {
            let pid = m
                .get("server_pid")
                .and_then(Value::as_u64)
                .ok_or(format!("{ctx}mps needs server_pid"))?;
            processes.push(Proc {
                pid: pid as u32,
                used: bytes(m, "server_used").unwrap_or(NOT_AVAILABLE),
                gpu_instance_id: n.gpu_instance_id,
                compute_instance_id: n.compute_instance_id,
            });
            true
        }
        Some(_) => return Err(format!("{ctx}mps must be an object")),
    };
    let uuid = v
        .get("uuid")
        .and_then(Value::as_str)
        .map_or(n.default_uuid, str::to_string);
    let pid_offset = v
        .get("pid_namespace_offset")
        .and_then(Value::as_u64)
        .map_or(n.pid_offset, |o| o as u32);
    if let Some(used) = bytes(v, "visible_process_used") {
        let found = if mps {
            &mut mps_processes
        } else {
            &mut processes
        };
        for pid in visible_processes(&uuid) {
            let pid = pid.wrapping_add(pid_offset);
            if !found.iter().any(|p| p.pid == pid) {
                found.push(Proc {
                    pid,
                    used,
                    gpu_instance_id: n.gpu_instance_id,
                    compute_instance_id: n.compute_instance_id,
                });
            }
        }
    }
    Ok(Node {
        name: v
            .get("name")
            .and_then(Value::as_str)
            .map_or(n.default_name, str::to_string),
        uuid,
        mem: MemSpec {
            total,
            reserved: bytes(v, "reserved").unwrap_or(0),
            free: bytes(v, "free"),
            used: bytes(v, "used"),
            follows_processes: flag(v, "free_follows_processes", false),
        },
        compute_mode: parse_compute_mode(v, ctx, n.default_compute_mode)?,
        processes,
        mps_processes,
        errors: parse_errors(v, ctx)?,
    })
}

fn parse_gpu(i: usize, g: &Value, top_offset: u32) -> Result<Gpu, String> {
    let ctx = format!("gpus[{i}].");
    let pid_offset = g
        .get("pid_namespace_offset")
        .and_then(Value::as_u64)
        .map_or(top_offset, |o| o as u32);
    let node = parse_node(NodeCtx {
        ctx: ctx.clone(),
        default_name: "NVIDIA Mock GPU".into(),
        default_uuid: format!("GPU-mock-{i}"),
        default_compute_mode: 0,
        pid_offset,
        gpu_instance_id: NO_INSTANCE,
        compute_instance_id: NO_INSTANCE,
        v: g,
    })?;
    let mig = match g.get("mig") {
        Some(m) => {
            let current = flag(m, "current", true);
            let list = m
                .get("instances")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let mut instances = Vec::new();
            for (j, inst) in list.iter().enumerate() {
                if inst.is_null() {
                    instances.push(None);
                    continue;
                }
                let id = |key: &str, default: u32| {
                    inst.get(key)
                        .and_then(Value::as_u64)
                        .map_or(default, |x| x as u32)
                };
                let gpu_instance_id = id("gpu_instance_id", j as u32 + 1);
                let compute_instance_id = id("compute_instance_id", 0);
                let node = parse_node(NodeCtx {
                    ctx: format!("{ctx}mig.instances[{j}]."),
                    default_name: format!("{} MIG", node.name),
                    default_uuid: format!("MIG-mock-{i}-{j}"),
                    default_compute_mode: node.compute_mode,
                    pid_offset,
                    gpu_instance_id,
                    compute_instance_id,
                    v: inst,
                })?;
                instances.push(Some(Instance {
                    node,
                    gpu_instance_id,
                    compute_instance_id,
                }));
            }
            let max = m
                .get("max_instances")
                .and_then(Value::as_u64)
                .map_or(DEFAULT_MAX_MIG, |x| x as u32)
                .max(instances.len() as u32);
            Some(Mig {
                current,
                pending: flag(m, "pending", current),
                max,
                privileged: flag(m, "privileged", true),
                instances,
            })
        }
        None if flag(g, "mig_capable", false) => Some(Mig {
            current: false,
            pending: false,
            max: DEFAULT_MAX_MIG,
            privileged: true,
            instances: Vec::new(),
        }),
        None => None,
    };
    Ok(Gpu {
        node,
        lost: flag(g, "lost", false),
        capability: parse_capability(g, &ctx)?,
        lists_grow: g.get("lists_grow").and_then(Value::as_u64).unwrap_or(0) as u32,
        mig,
    })
}

fn read_state() -> Result<State, String> {
    let path = std::env::var_os("NVML_MOCK_FILE")
        .ok_or("NVML_MOCK_FILE is not set (it names the JSON file describing the GPUs)")?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read NVML_MOCK_FILE {}: {e}", path.to_string_lossy()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "NVML_MOCK_FILE {} is not valid JSON: {e}",
            path.to_string_lossy()
        )
    })?;
    let top_offset = doc
        .get("pid_namespace_offset")
        .and_then(Value::as_u64)
        .map_or(0, |o| o as u32);
    let gpus = doc
        .get("gpus")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .enumerate()
                .map(|(i, g)| parse_gpu(i, g, top_offset))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    Ok(State {
        driver: doc
            .get("driver")
            .and_then(Value::as_str)
            .unwrap_or("580.65.06")
            .to_string(),
        cuda: doc
            .get("cuda_driver_version")
            .and_then(Value::as_i64)
            .and_then(|v| c_int::try_from(v).ok())
            .unwrap_or(DEFAULT_CUDA),
        init_error: doc
            .get("init_error")
            .and_then(Value::as_u64)
            .map(|c| c as Ret),
        errors: parse_errors(&doc, "")?,
        gpus,
    })
}

/// Runs `f` on the current state when NVML is initialised, with no injected error check.
fn with_state_raw(f: impl FnOnce(&State) -> Ret) -> Ret {
    if INITS.load(Ordering::SeqCst) == 0 {
        return UNINITIALIZED;
    }
    match read_state() {
        Ok(s) => f(&s),
        Err(e) => {
            eprintln!("nvml-mock: {e}");
            UNKNOWN
        }
    }
}

/// Runs the system-wide function `name` (`f`) unless the file injects an error for it.
fn with_state(name: &str, f: impl FnOnce(&State) -> Ret) -> Ret {
    with_state_raw(|s| match s.errors.get(name) {
        Some(&code) => code,
        None => f(s),
    })
}

/// What `handle` names in `s`, or the error NVML gives for it.
fn resolve(s: &State, handle: Handle) -> Result<Dev<'_>, Ret> {
    let raw = handle as usize;
    let (g, m) = (raw & 0xFFFF, raw >> 16);
    let index = g.checked_sub(1).ok_or(INVALID_ARGUMENT)?;
    let gpu = s.gpus.get(index).ok_or(INVALID_ARGUMENT)?;
    if m == 0 {
        return Ok(Dev::Gpu(index, gpu));
    }
    let inst = gpu
        .live_mig()
        .and_then(|mig| mig.instances.get(m - 1))
        .and_then(Option::as_ref)
        .ok_or(INVALID_ARGUMENT)?;
    Ok(Dev::Mig(index, gpu, inst))
}

/// Runs the device function `name` (`f`) on the device `handle` names.
fn with_device(name: &str, handle: Handle, f: impl FnOnce(&State, Dev<'_>) -> Ret) -> Ret {
    with_state_raw(|s| {
        let dev = match resolve(s, handle) {
            Ok(d) => d,
            Err(e) => return e,
        };
        let gpu = match dev {
            Dev::Gpu(_, g) | Dev::Mig(_, g, _) => g,
        };
        if gpu.lost {
            return GPU_IS_LOST;
        }
        if let Some(&code) = dev.node().errors.get(name).or(s.errors.get(name)) {
            return code;
        }
        f(s, dev)
    })
}

/// Writes `value` through `out`, or answers `INVALID_ARGUMENT` for a null pointer.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Ret {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { out.write(value) };
    SUCCESS
}

/// Copies `s` NUL-terminated into a C buffer of `len` bytes.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
unsafe fn write_str(s: &str, buf: *mut c_char, len: c_uint) -> Ret {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller guarantees `buf` holds `len` bytes and we write at most `len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    SUCCESS
}

fn init(name: &str) -> Ret {
    match read_state() {
        Ok(State {
            init_error: Some(code),
            ..
        }) => code,
        Ok(s) => {
            if let Some(&code) = s.errors.get(name) {
                return code;
            }
            INITS.fetch_add(1, Ordering::SeqCst);
            SUCCESS
        }
        Err(e) => {
            eprintln!("nvml-mock: {e}");
            DRIVER_NOT_LOADED
        }
    }
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    init("nvmlInit_v2")
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    init("nvmlInit")
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    init("nvmlInitWithFlags")
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    match INITS.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
        Ok(_) => SUCCESS,
        Err(_) => UNINITIALIZED,
    }
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(code: Ret) -> *const c_char {
    let s: &'static [u8] = match code {
        SUCCESS => b"Success\0",
        UNINITIALIZED => b"Uninitialized\0",
        INVALID_ARGUMENT => b"Invalid Argument\0",
        NOT_SUPPORTED => b"Not Supported\0",
        NO_PERMISSION => b"Insufficient Permissions\0",
        5 => b"Already Initialized\0",
        NOT_FOUND => b"Not Found\0",
        INSUFFICIENT_SIZE => b"Insufficient Size\0",
        8 => b"Insufficient External Power\0",
        DRIVER_NOT_LOADED => b"Driver Not Loaded (nvml-mock: see NVML_MOCK_FILE)\0",
        10 => b"Timeout\0",
        11 => b"Interrupt request issue\0",
        12 => b"NVML Shared Library Not Found\0",
        13 => b"Function Not Found\0",
        14 => b"Corrupted infoROM\0",
        GPU_IS_LOST => b"GPU is lost\0",
        16 => b"GPU requires restart\0",
        17 => b"The operating system has blocked the request.\0",
        18 => b"RM has detected an NVML/RM version mismatch.\0",
        19 => b"In use by another client\0",
        20 => b"Insufficient Memory\0",
        21 => b"No data\0",
        22 => b"The requested vgpu operation is not available on target device, because ECC is enabled\0",
        23 => b"Insufficient resources\0",
        24 => b"Frequency not supported\0",
        ARGUMENT_VERSION_MISMATCH => b"Argument version mismatch\0",
        26 => b"Deprecated\0",
        27 => b"Not Ready\0",
        28 => b"GPU not found\0",
        29 => b"Invalid state\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

/// # Safety
/// `version` must be valid for `length` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    // SAFETY: forwarded from the caller's contract.
    with_state("nvmlSystemGetDriverVersion", |s| unsafe {
        write_str(&s.driver, version, length)
    })
}

/// # Safety
/// `version` must be valid for `length` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_state("nvmlSystemGetNVMLVersion", |s| {
        let v = format!("{}.{}", s.cuda / 1000, s.driver);
        // SAFETY: forwarded from the caller's contract.
        unsafe { write_str(&v, version, length) }
    })
}

/// # Safety
/// `out` must be null or valid for a write.
unsafe fn cuda_driver_version(name: &str, out: *mut c_int) -> Ret {
    // SAFETY: `put` checks null; the caller guarantees it is otherwise writable.
    with_state(name, |s| unsafe { put(out, s.cuda) })
}

/// # Safety
/// `version` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Ret {
    // SAFETY: same contract.
    unsafe { cuda_driver_version("nvmlSystemGetCudaDriverVersion", version) }
}

/// # Safety
/// `version` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    // SAFETY: same contract.
    unsafe { cuda_driver_version("nvmlSystemGetCudaDriverVersion_v2", version) }
}

/// # Safety
/// `count` must be null or valid for a write.
unsafe fn device_count(name: &str, count: *mut c_uint) -> Ret {
    // SAFETY: `put` checks null; the caller guarantees it is otherwise writable.
    with_state(name, |s| unsafe { put(count, s.gpus.len() as c_uint) })
}

/// # Safety
/// `count` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    // SAFETY: same contract.
    unsafe { device_count("nvmlDeviceGetCount_v2", count) }
}

/// # Safety
/// As [`nvmlDeviceGetCount_v2`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    // SAFETY: same contract.
    unsafe { device_count("nvmlDeviceGetCount", count) }
}

/// # Safety
/// `device` must be null or valid for a write.
unsafe fn handle_by_index(name: &str, index: c_uint, device: *mut Handle) -> Ret {
    if device.is_null() {
        return INVALID_ARGUMENT;
    }
    with_state(name, |s| {
        let Some(gpu) = s.gpus.get(index as usize) else {
            return INVALID_ARGUMENT;
        };
        if let Some(&code) = gpu.node.errors.get(name) {
            return code;
        }
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(device, gpu_handle(index as usize)) }
    })
}

/// # Safety
/// `device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut Handle) -> Ret {
    // SAFETY: same contract.
    unsafe { handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, device) }
}

/// # Safety
/// As [`nvmlDeviceGetHandleByIndex_v2`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut Handle) -> Ret {
    // SAFETY: same contract.
    unsafe { handle_by_index("nvmlDeviceGetHandleByIndex", index, device) }
}

/// # Safety
/// `index` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Handle, index: *mut c_uint) -> Ret {
    if index.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device("nvmlDeviceGetIndex", device, |_, dev| match dev {
        // SAFETY: checked non-null; the caller guarantees it is writable.
        Dev::Gpu(i, _) => unsafe { put(index, i as c_uint) },
        Dev::Mig(..) => NOT_SUPPORTED,
    })
}

/// # Safety
/// `name` must be valid for `length` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: Handle,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    // SAFETY: forwarded from the caller's contract.
    with_device("nvmlDeviceGetName", device, |_, d| unsafe {
        write_str(&d.node().name, name, length)
    })
}

/// # Safety
/// `uuid` must be valid for `length` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: Handle,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    // SAFETY: forwarded from the caller's contract.
    with_device("nvmlDeviceGetUUID", device, |_, d| unsafe {
        write_str(&d.node().uuid, uuid, length)
    })
}

/// # Safety
/// `memory` must be valid for a write of `nvmlMemory_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Handle, memory: *mut Memory) -> Ret {
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device("nvmlDeviceGetMemoryInfo", device, |_, d| {
        if d.aggregate_denied() {
            return NO_PERMISSION;
        }
        let m = d.memory();
        let v1 = Memory {
            total: m.total,
            free: m.free,
            used: m.used.saturating_add(m.reserved),
        };
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(memory, v1) }
    })
}

/// # Safety
/// `memory` must be valid for reads and writes of `nvmlMemory_v2_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Handle, memory: *mut MemoryV2) -> Ret {
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller guarantees it is readable.
    if unsafe { (*memory).version } != MEMORY_V2_VERSION {
        return ARGUMENT_VERSION_MISMATCH;
    }
    with_device("nvmlDeviceGetMemoryInfo_v2", device, |_, d| {
        if d.aggregate_denied() {
            return NO_PERMISSION;
        }
        let m = d.memory();
        let v2 = MemoryV2 {
            version: MEMORY_V2_VERSION,
            total: m.total,
            reserved: m.reserved,
            free: m.free,
            used: m.used,
        };
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(memory, v2) }
    })
}

/// NVML's two-call protocol: with too small a buffer (or none), set the count needed and
/// answer `INSUFFICIENT_SIZE`; else fill `infos` and set the count written.
///
/// # Safety
/// `count` must be valid for reads and writes; `infos` null or valid for `*count` writes.
unsafe fn processes<T>(
    name: &str,
    device: Handle,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(&Proc) -> T,
) -> Ret {
    // SAFETY: same contract.
    unsafe { processes_of(name, device, count, infos, |d| d.processes(), make) }
}

/// [`processes`] of the list `list` picks.
///
/// # Safety
/// As [`processes`].
unsafe fn processes_of<T>(
    name: &str,
    device: Handle,
    count: *mut c_uint,
    infos: *mut T,
    list: impl Fn(&Dev<'_>) -> Vec<Proc>,
    make: impl Fn(&Proc) -> T,
) -> Ret {
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(name, device, |_, d| {
        if d.aggregate_denied() {
            return NO_PERMISSION;
        }
        let procs = list(&d);
        let n = procs.len();
        // SAFETY: checked non-null; the caller guarantees it is readable and writable.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = n as c_uint };
        if n == 0 {
            return SUCCESS;
        }
        if infos.is_null() || room < n {
            return INSUFFICIENT_SIZE;
        }
        if d.list_grew() {
            // A process started between the caller's count call and this one.
            // SAFETY: as above.
            unsafe { *count = n as c_uint + 1 };
            return INSUFFICIENT_SIZE;
        }
        for (i, p) in procs.iter().enumerate() {
            // SAFETY: i < n ≤ room, and the caller guarantees `room` elements.
            unsafe { infos.add(i).write(make(p)) };
        }
        SUCCESS
    })
}

fn v2(p: &Proc) -> ProcessV2 {
    ProcessV2 {
        pid: p.pid,
        used_gpu_memory: p.used,
        gpu_instance_id: p.gpu_instance_id,
        compute_instance_id: p.compute_instance_id,
    }
}

/// # Safety
/// See [`processes`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ProcessV2,
) -> Ret {
    // SAFETY: same contract.
    unsafe {
        processes(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            device,
            count,
            infos,
            v2,
        )
    }
}

/// The MPS clients of the device (none where no MPS server runs: an empty list, as on a
/// real Volta or newer GPU without MPS).
///
/// # Safety
/// See [`processes`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ProcessV2,
) -> Ret {
    // SAFETY: same contract.
    unsafe {
        processes_of(
            "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            device,
            count,
            infos,
            |d| d.mps_processes(),
            v2,
        )
    }
}

/// # Safety
/// See [`processes`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ProcessV2,
) -> Ret {
    // SAFETY: same contract.
    unsafe {
        processes(
            "nvmlDeviceGetComputeRunningProcesses_v2",
            device,
            count,
            infos,
            v2,
        )
    }
}

/// # Safety
/// See [`processes`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ProcessV1,
) -> Ret {
    // SAFETY: same contract.
    unsafe {
        processes(
            "nvmlDeviceGetComputeRunningProcesses",
            device,
            count,
            infos,
            |p| ProcessV1 {
                pid: p.pid,
                used_gpu_memory: p.used,
            },
        )
    }
}

/// # Safety
/// `mode` must be valid for a write of `nvmlComputeMode_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: Handle, mode: *mut c_uint) -> Ret {
    if mode.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller guarantees it is writable.
    with_device("nvmlDeviceGetComputeMode", device, |_, d| unsafe {
        put(mode, d.node().compute_mode)
    })
}

/// # Safety
/// `major` and `minor` must be valid for writes of an `int`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: Handle,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    if major.is_null() || minor.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device("nvmlDeviceGetCudaComputeCapability", device, |_, d| {
        let (Dev::Gpu(_, g) | Dev::Mig(_, g, _)) = d;
        // SAFETY: both checked non-null; the caller guarantees they are writable.
        unsafe {
            put(major, g.capability.0);
            put(minor, g.capability.1)
        }
    })
}

/// # Safety
/// `current` and `pending` must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: Handle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    if current.is_null() || pending.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device("nvmlDeviceGetMigMode", device, |_, d| {
        let Dev::Gpu(_, Gpu { mig: Some(mig), .. }) = d else {
            return NOT_SUPPORTED;
        };
        let mode = |on: bool| if on { MIG_ENABLE } else { MIG_DISABLE };
        // SAFETY: checked non-null; the caller guarantees both are writable.
        unsafe {
            put(current, mode(mig.current));
            put(pending, mode(mig.pending))
        }
    })
}

/// # Safety
/// `count` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: Handle, count: *mut c_uint) -> Ret {
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device("nvmlDeviceGetMaxMigDeviceCount", device, |_, d| {
        let n = match d {
            Dev::Gpu(_, g) => g.live_mig().map_or(0, |m| m.max),
            Dev::Mig(..) => 0,
        };
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(count, n) }
    })
}

/// # Safety
/// `mig_device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: Handle,
    index: c_uint,
    mig_device: *mut Handle,
) -> Ret {
    if mig_device.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device("nvmlDeviceGetMigDeviceHandleByIndex", device, |_, d| {
        let Dev::Gpu(g, gpu) = d else {
            return INVALID_ARGUMENT;
        };
        let Some(mig) = gpu.live_mig() else {
            return NOT_SUPPORTED;
        };
        if index >= mig.max {
            return INVALID_ARGUMENT;
        }
        match mig.instances.get(index as usize) {
            // SAFETY: checked non-null; the caller guarantees it is writable.
            Some(Some(_)) => unsafe { put(mig_device, mig_handle(g, index as usize)) },
            _ => NOT_FOUND,
        }
    })
}

/// # Safety
/// `is_mig` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: Handle, is_mig: *mut c_uint) -> Ret {
    if is_mig.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device("nvmlDeviceIsMigDeviceHandle", device, |_, d| {
        let v = c_uint::from(matches!(d, Dev::Mig(..)));
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(is_mig, v) }
    })
}

/// # Safety
/// `device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: Handle,
    device: *mut Handle,
) -> Ret {
    if device.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        mig_device,
        |_, d| match d {
            // SAFETY: checked non-null; the caller guarantees it is writable.
            Dev::Mig(g, ..) => unsafe { put(device, gpu_handle(g)) },
            Dev::Gpu(..) => INVALID_ARGUMENT,
        },
    )
}

/// # Safety
/// `id` must be null or valid for a write.
unsafe fn instance_id(
    name: &str,
    device: Handle,
    id: *mut c_uint,
    pick: fn(&Instance) -> u32,
) -> Ret {
    if id.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(name, device, |_, d| match d {
        // SAFETY: checked non-null; the caller guarantees it is writable.
        Dev::Mig(_, _, inst) => unsafe { put(id, pick(inst)) },
        Dev::Gpu(..) => NOT_SUPPORTED,
    })
}

/// # Safety
/// `id` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: Handle, id: *mut c_uint) -> Ret {
    // SAFETY: same contract.
    unsafe {
        instance_id("nvmlDeviceGetGpuInstanceId", device, id, |i| {
            i.gpu_instance_id
        })
    }
}

/// # Safety
/// `id` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: Handle, id: *mut c_uint) -> Ret {
    // SAFETY: same contract.
    unsafe {
        instance_id("nvmlDeviceGetComputeInstanceId", device, id, |i| {
            i.compute_instance_id
        })
    }
}
