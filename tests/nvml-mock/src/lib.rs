//! A stand-in for `libnvidia-ml.so` so that the real NVML code path (`nvml-wrapper`, then
//! `resources::NvmlProbe`) runs without a GPU. Load it with `--nvml-library
//! target/<profile>/libnvml_mock.so` (or `NvmlProbe::open(Some(path))`).
//!
//! The simulated GPUs come from the JSON file named by `NVML_MOCK_FILE`, re-read on every
//! call, so a test can change free memory or processes while a server runs:
//!
//! ```json
//! {"driver": "550.54.15",
//!  "gpus": [{"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-…", "total_mb": 40960,
//!            "free_mb": 40000, "processes": [{"pid": 123, "used_mb": 500}]}]}
//! ```
//!
//! Per GPU: `name`, `uuid` (default `GPU-mock-<index>`), `total_mb` or `total_bytes`,
//! `free_mb` or `free_bytes` (default: total), `used_mb`/`used_bytes` (default: total −
//! free), `processes` (`pid`, `used_mb` or `used_bytes`; omit both for "not available"),
//! and `"lost": true` to make every call on that GPU fail with `GPU_IS_LOST`. Top level
//! `"init_error": <nvmlReturn_t>` makes `nvmlInit` fail with that code.
//!
//! Without the variable, or with a file that cannot be read or parsed, `nvmlInit_v2` fails
//! with `NVML_ERROR_DRIVER_NOT_LOADED` and says why on stderr. MB = 2^20 bytes.
//!
//! Implemented: `nvmlInit_v2`, `nvmlInit`, `nvmlInitWithFlags`, `nvmlShutdown`,
//! `nvmlErrorString`, `nvmlSystemGetDriverVersion`, `nvmlSystemGetNVMLVersion`,
//! `nvmlDeviceGetCount(_v2)`, `nvmlDeviceGetHandleByIndex(_v2)`, `nvmlDeviceGetIndex`,
//! `nvmlDeviceGetName`, `nvmlDeviceGetUUID`, `nvmlDeviceGetMemoryInfo(_v2)`,
//! `nvmlDeviceGetComputeRunningProcesses(_v2, _v3)`. `nvml-wrapper` resolves every other
//! symbol as a missing one and fails only if it is called.

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

type Ret = c_uint;
const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
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

/// Successful `nvmlInit` calls not yet matched by `nvmlShutdown` (NVML counts references).
static INITS: AtomicU32 = AtomicU32::new(0);

/// An opaque device handle: the index + 1, so that null stays invalid.
type Handle = *mut c_void;

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

struct Gpu {
    name: String,
    uuid: String,
    total: u64,
    free: u64,
    used: u64,
    lost: bool,
    /// (pid, bytes or NOT_AVAILABLE)
    processes: Vec<(u32, u64)>,
}

struct State {
    driver: String,
    init_error: Option<Ret>,
    gpus: Vec<Gpu>,
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

/// The processes of this machine whose `CUDA_VISIBLE_DEVICES` is exactly `uuid` (the
/// workers a master placed on that GPU), from `/proc`; those it cannot read are skipped.
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
    let mut gpus = Vec::new();
    let list = doc
        .get("gpus")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, g) in list.iter().enumerate() {
        let total = bytes(g, "total").ok_or(format!("gpus[{i}] needs total_mb or total_bytes"))?;
        let free = bytes(g, "free").unwrap_or(total).min(total);
        let used = bytes(g, "used").unwrap_or(total - free);
        let mut processes: Vec<(u32, u64)> = g
            .get("processes")
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .map(|p| {
                        let pid = p.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
                        (pid, bytes(p, "used").unwrap_or(NOT_AVAILABLE))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let uuid = g
            .get("uuid")
            .and_then(Value::as_str)
            .map_or_else(|| format!("GPU-mock-{i}"), str::to_string);
        if let Some(used) = bytes(g, "visible_process_used") {
            for pid in visible_processes(&uuid) {
                if !processes.iter().any(|(p, _)| *p == pid) {
                    processes.push((pid, used));
                }
            }
        }
        gpus.push(Gpu {
            name: g
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("NVIDIA Mock GPU")
                .to_string(),
            uuid,
            total,
            free,
            used,
            lost: g.get("lost").and_then(Value::as_bool).unwrap_or(false),
            processes,
        });
    }
    Ok(State {
        driver: doc
            .get("driver")
            .and_then(Value::as_str)
            .unwrap_or("550.00")
            .to_string(),
        init_error: doc
            .get("init_error")
            .and_then(Value::as_u64)
            .map(|c| c as Ret),
        gpus,
    })
}

/// Runs `f` on the current state when NVML is initialised.
fn with_state(f: impl FnOnce(&State) -> Ret) -> Ret {
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

/// Runs `f` on the GPU a handle names.
fn with_gpu(handle: Handle, f: impl FnOnce(&Gpu) -> Ret) -> Ret {
    let index = (handle as usize).wrapping_sub(1);
    with_state(|s| match s.gpus.get(index) {
        None => INVALID_ARGUMENT,
        Some(g) if g.lost => GPU_IS_LOST,
        Some(g) => f(g),
    })
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

fn init() -> Ret {
    match read_state() {
        Ok(State {
            init_error: Some(code),
            ..
        }) => code,
        Ok(_) => {
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
    init()
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    init()
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    init()
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
        INSUFFICIENT_SIZE => b"Insufficient Size\0",
        DRIVER_NOT_LOADED => b"Driver Not Loaded (nvml-mock: see NVML_MOCK_FILE)\0",
        GPU_IS_LOST => b"GPU is lost\0",
        ARGUMENT_VERSION_MISMATCH => b"Argument version mismatch\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

/// # Safety
/// `version` must be valid for `length` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    // SAFETY: forwarded from the caller's contract.
    with_state(|s| unsafe { write_str(&s.driver, version, length) })
}

/// # Safety
/// `version` must be valid for `length` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    // SAFETY: forwarded from the caller's contract.
    with_state(|s| unsafe { write_str(&format!("12.{}", s.driver), version, length) })
}

/// # Safety
/// `count` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    with_state(|s| {
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { *count = s.gpus.len() as c_uint };
        SUCCESS
    })
}

/// # Safety
/// As [`nvmlDeviceGetCount_v2`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// # Safety
/// `device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut Handle) -> Ret {
    if device.is_null() {
        return INVALID_ARGUMENT;
    }
    with_state(|s| {
        if index as usize >= s.gpus.len() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { *device = (index as usize + 1) as Handle };
        SUCCESS
    })
}

/// # Safety
/// As [`nvmlDeviceGetHandleByIndex_v2`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut Handle) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// # Safety
/// `index` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Handle, index: *mut c_uint) -> Ret {
    if index.is_null() {
        return INVALID_ARGUMENT;
    }
    with_gpu(device, |_| {
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { *index = (device as usize - 1) as c_uint };
        SUCCESS
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
    with_gpu(device, |g| unsafe { write_str(&g.name, name, length) })
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
    with_gpu(device, |g| unsafe { write_str(&g.uuid, uuid, length) })
}

/// # Safety
/// `memory` must be valid for a write of `nvmlMemory_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Handle, memory: *mut Memory) -> Ret {
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    with_gpu(device, |g| {
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe {
            *memory = Memory {
                total: g.total,
                free: g.free,
                used: g.used,
            }
        };
        SUCCESS
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
    with_gpu(device, |g| {
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe {
            *memory = MemoryV2 {
                version: MEMORY_V2_VERSION,
                total: g.total,
                reserved: 0,
                free: g.free,
                used: g.used,
            }
        };
        SUCCESS
    })
}

/// NVML's two-call protocol: with too small a buffer (or none), set the count needed and
/// answer `INSUFFICIENT_SIZE`; else fill `infos` and set the count written.
///
/// # Safety
/// `count` must be valid for reads and writes; `infos` null or valid for `*count` writes.
unsafe fn processes<T>(
    device: Handle,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> Ret {
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    with_gpu(device, |g| {
        let n = g.processes.len();
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
        for (i, (pid, used)) in g.processes.iter().enumerate() {
            // SAFETY: i < n ≤ room, and the caller guarantees `room` elements.
            unsafe { infos.add(i).write(make(*pid, *used)) };
        }
        SUCCESS
    })
}

fn v2(pid: u32, used: u64) -> ProcessV2 {
    ProcessV2 {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: NO_INSTANCE,
        compute_instance_id: NO_INSTANCE,
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
    unsafe { processes(device, count, infos, v2) }
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
    unsafe { processes(device, count, infos, v2) }
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
        processes(device, count, infos, |pid, used| ProcessV1 {
            pid,
            used_gpu_memory: used,
        })
    }
}
