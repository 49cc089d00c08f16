//! Simulated GPUs for tests: writes the JSON file that the NVML stand-in
//! (`tests/nvml-mock`, built as `libnvml_mock.so`) reads, and finds or builds that library.
//!
//! It is `common::nvml_sim` (`mod common;` then `use common::nvml_sim;`). For a process
//! test:
//!
//! ```ignore
//! let sim = nvml_sim::SimGpus::new(vec![nvml_sim::SimGpu::a100_40gb().free_mb(30_000)]);
//! sim.write(&dir.join("gpus.json"));
//! Command::new(env!("CARGO_BIN_EXE_app"))
//!     .arg("--nvml-library").arg(nvml_sim::mock_library())
//!     .env(nvml_sim::ENV_FILE, dir.join("gpus.json"))
//! ```
//!
//! The mock re-reads the file on every NVML call, so `sim.write(..)` again changes what a
//! running server sees (free memory for admission, per-process memory for hwFetch).
//!
//! Beyond free memory and processes, a [`SimGpu`] can carry what real drivers show: memory
//! the driver reserves (`reserved_mb`), free memory that follows the processes
//! (`free_follows_processes`), a PID namespace offset, a compute mode, MIG ([`SimMig`],
//! [`SimMigInstance`]; instances with one `gpu_instance_id` are compute instances sharing
//! its memory), an MPS server and its clients (`mps`, `mps_process`) and injected
//! `nvmlReturn_t` errors per function (`error`); a
//! [`SimGpus`] the CUDA driver version and machine-wide offsets and errors. The JSON fields
//! are documented in `tests/nvml-mock/src/lib.rs`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};

/// The environment variable naming the JSON file the mock reads.
pub const ENV_FILE: &str = "NVML_MOCK_FILE";
/// Set it to use an already built mock library instead of building one.
pub const ENV_LIB: &str = "NVML_MOCK_LIB";

/// `nvmlReturn_t` codes for [`SimGpu::error`], [`SimGpus::error`] and
/// [`SimMigInstance::error`].
pub mod nvml_return {
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NO_PERMISSION: u32 = 4;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const DRIVER_NOT_LOADED: u32 = 9;
    pub const TIMEOUT: u32 = 10;
    pub const FUNCTION_NOT_FOUND: u32 = 13;
    pub const GPU_IS_LOST: u32 = 15;
    pub const UNKNOWN: u32 = 999;
}

/// `nvmlComputeMode_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimComputeMode {
    Default,
    ExclusiveThread,
    Prohibited,
    ExclusiveProcess,
}

impl SimComputeMode {
    /// The mock's JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SimComputeMode::Default => "default",
            SimComputeMode::ExclusiveThread => "exclusive_thread",
            SimComputeMode::Prohibited => "prohibited",
            SimComputeMode::ExclusiveProcess => "exclusive_process",
        }
    }
}

/// One MIG device of a [`SimMig`] (MB = 2^20 bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct SimMigInstance {
    pub name: String,
    pub uuid: String,
    pub total_mb: u64,
    /// `None`: total − reserved.
    pub free_mb: Option<u64>,
    pub reserved_mb: u64,
    /// `None`: total − reserved − free (or 0 with `free_follows_processes`).
    pub used_mb: Option<u64>,
    pub free_follows_processes: bool,
    /// (pid, MB used; `None` = "not available")
    pub processes: Vec<(u32, Option<u64>)>,
    /// MB every process with `CUDA_VISIBLE_DEVICES` = this instance's UUID is reported to use.
    pub workers_use_mb: Option<u64>,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// `None`: the GPU's.
    pub compute_mode: Option<SimComputeMode>,
    /// Injected answers for calls on this instance's handle: function → `nvmlReturn_t`.
    pub errors: BTreeMap<String, u32>,
}

impl SimMigInstance {
    /// An idle MIG device.
    pub fn new(
        name: &str,
        uuid: &str,
        total_mb: u64,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> SimMigInstance {
        SimMigInstance {
            name: name.to_string(),
            uuid: uuid.to_string(),
            total_mb,
            free_mb: None,
            reserved_mb: 0,
            used_mb: None,
            free_follows_processes: false,
            processes: Vec::new(),
            workers_use_mb: None,
            gpu_instance_id,
            compute_instance_id,
            compute_mode: None,
            errors: BTreeMap::new(),
        }
    }
    /// An A100-40GB `1g.5gb` slice (4864 MB, as `nvidia-smi` shows it).
    pub fn a100_1g_5gb(uuid: &str, gpu_instance_id: u32) -> SimMigInstance {
        SimMigInstance::new(
            "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
            uuid,
            4_864,
            gpu_instance_id,
            0,
        )
    }
    /// An A100-40GB `3g.20gb` slice (19968 MB).
    pub fn a100_3g_20gb(uuid: &str, gpu_instance_id: u32) -> SimMigInstance {
        SimMigInstance::new(
            "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
            uuid,
            19_968,
            gpu_instance_id,
            0,
        )
    }
    pub fn free_mb(mut self, mb: u64) -> SimMigInstance {
        self.free_mb = Some(mb);
        self
    }
    pub fn reserved_mb(mut self, mb: u64) -> SimMigInstance {
        self.reserved_mb = mb;
        self
    }
    pub fn used_mb(mut self, mb: u64) -> SimMigInstance {
        self.used_mb = Some(mb);
        self
    }
    pub fn free_follows_processes(mut self) -> SimMigInstance {
        self.free_follows_processes = true;
        self
    }
    pub fn process(mut self, pid: u32, used_mb: u64) -> SimMigInstance {
        self.processes.push((pid, Some(used_mb)));
        self
    }
    pub fn process_unavailable(mut self, pid: u32) -> SimMigInstance {
        self.processes.push((pid, None));
        self
    }
    pub fn workers_use(mut self, mb: u64) -> SimMigInstance {
        self.workers_use_mb = Some(mb);
        self
    }
    pub fn compute_mode(mut self, mode: SimComputeMode) -> SimMigInstance {
        self.compute_mode = Some(mode);
        self
    }
    /// `function` (e.g. `"nvmlDeviceGetMemoryInfo_v2"`) answers `code` on this instance.
    pub fn error(mut self, function: &str, code: u32) -> SimMigInstance {
        self.errors.insert(function.to_string(), code);
        self
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "name": self.name,
            "uuid": self.uuid,
            "total_mb": self.total_mb,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
            "processes": processes_json(&self.processes),
        });
        memory_json(
            &mut v,
            self.free_mb,
            self.reserved_mb,
            self.used_mb,
            self.free_follows_processes,
        );
        if let Some(mb) = self.workers_use_mb {
            v["visible_process_used_mb"] = json!(mb);
        }
        if let Some(m) = self.compute_mode {
            v["compute_mode"] = json!(m.as_str());
        }
        if !self.errors.is_empty() {
            v["errors"] = json!(self.errors);
        }
        v
    }
}

/// The MIG side of a [`SimGpu`].
#[derive(Debug, Clone, PartialEq)]
pub struct SimMig {
    /// MIG mode now (`nvmlDeviceGetMigMode` current).
    pub current: bool,
    /// MIG mode after the next reset.
    pub pending: bool,
    /// `nvmlDeviceGetMaxMigDeviceCount` while enabled (7 on A100/H100).
    pub max_instances: u32,
    /// False: the parent's aggregate memory/process queries answer `NO_PERMISSION`.
    pub privileged: bool,
    /// In index order; `None` is an empty slot (`NOT_FOUND`).
    pub instances: Vec<Option<SimMigInstance>>,
}

impl SimMig {
    /// MIG enabled (now and pending), 7 slots, none used yet.
    pub fn enabled() -> SimMig {
        SimMig {
            current: true,
            pending: true,
            max_instances: 7,
            privileged: true,
            instances: Vec::new(),
        }
    }
    /// MIG-capable but disabled (now and pending).
    pub fn disabled() -> SimMig {
        SimMig {
            current: false,
            pending: false,
            ..SimMig::enabled()
        }
    }
    pub fn pending(mut self, on: bool) -> SimMig {
        self.pending = on;
        self
    }
    pub fn max_instances(mut self, n: u32) -> SimMig {
        self.max_instances = n;
        self
    }
    /// The caller lacks the privileges for the parent's aggregate queries.
    pub fn unprivileged(mut self) -> SimMig {
        self.privileged = false;
        self
    }
    /// The next slot holds `instance`.
    pub fn instance(mut self, instance: SimMigInstance) -> SimMig {
        self.instances.push(Some(instance));
        self
    }
    /// The next slot is empty.
    pub fn empty_slot(mut self) -> SimMig {
        self.instances.push(None);
        self
    }

    fn to_json(&self) -> Value {
        let instances: Vec<Value> = self
            .instances
            .iter()
            .map(|i| i.as_ref().map_or(Value::Null, SimMigInstance::to_json))
            .collect();
        json!({
            "current": self.current,
            "pending": self.pending,
            "max_instances": self.max_instances,
            "privileged": self.privileged,
            "instances": instances,
        })
    }
}

fn processes_json(processes: &[(u32, Option<u64>)]) -> Vec<Value> {
    processes
        .iter()
        .map(|(pid, mb)| match mb {
            Some(mb) => json!({"pid": pid, "used_mb": mb}),
            None => json!({"pid": pid}),
        })
        .collect()
}

/// The optional memory keys, written only when they differ from the mock's defaults.
fn memory_json(
    v: &mut Value,
    free_mb: Option<u64>,
    reserved_mb: u64,
    used_mb: Option<u64>,
    follows: bool,
) {
    if let Some(mb) = free_mb {
        v["free_mb"] = json!(mb);
    }
    if reserved_mb > 0 {
        v["reserved_mb"] = json!(reserved_mb);
    }
    if let Some(mb) = used_mb {
        v["used_mb"] = json!(mb);
    }
    if follows {
        v["free_follows_processes"] = json!(true);
    }
}

/// One simulated GPU (MB = 2^20 bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct SimGpu {
    pub name: String,
    /// `None`: `GPU-sim-<index>` when written.
    pub uuid: Option<String>,
    pub total_mb: u64,
    pub free_mb: u64,
    /// (pid, MB used on this GPU; `None` = "not available")
    pub processes: Vec<(u32, Option<u64>)>,
    /// Every call on this GPU fails with `GPU_IS_LOST`.
    pub lost: bool,
    /// MB every process placed on this GPU (`CUDA_VISIBLE_DEVICES` = its UUID) is reported
    /// to use: what a test scripts as the workers' real footprint.
    pub workers_use_mb: Option<u64>,
    /// MB the driver reserves (`nvmlMemory_v2_t.reserved`; v1 counts it as used).
    pub reserved_mb: u64,
    /// The v2 `used` (`None`: total − reserved − free); with `free_follows_processes`, the
    /// base use besides the processes (`None`: 0).
    pub used_mb: Option<u64>,
    /// Free = total − reserved − used − Σ(process memory), `free_mb` ignored.
    pub free_follows_processes: bool,
    /// Processes found through `workers_use` are reported under pid + this (`None`: the
    /// machine's [`SimGpus::pid_namespace_offset`]).
    pub pid_namespace_offset: Option<u32>,
    /// `None`: default.
    pub compute_mode: Option<SimComputeMode>,
    /// MIG-capable with MIG disabled, when `mig` is `None`.
    pub mig_capable: bool,
    pub mig: Option<SimMig>,
    /// An MPS server runs here: (its pid, MB it uses). Workers (`workers_use`) are then
    /// MPS clients, listed by `nvmlDeviceGetMPSComputeRunningProcesses_v3` only.
    pub mps_server: Option<(u32, u64)>,
    /// MPS clients listed as they are: (pid, MB).
    pub mps_processes: Vec<(u32, Option<u64>)>,
    /// Injected answers for calls on this GPU's handle: function → `nvmlReturn_t`.
    pub errors: BTreeMap<String, u32>,
    /// Fill calls of a process list that find one process more than the count call before
    /// them (a client started in between), answered `INSUFFICIENT_SIZE`.
    pub lists_grow: u32,
    /// CUDA compute capability `major.minor` (`None`: the mock's default, 9.0).
    pub compute_capability: Option<String>,
}

impl SimGpu {
    /// An idle GPU: all of its memory free.
    pub fn new(name: &str, total_mb: u64) -> SimGpu {
        SimGpu {
            name: name.to_string(),
            uuid: None,
            total_mb,
            free_mb: total_mb,
            processes: Vec::new(),
            lost: false,
            workers_use_mb: None,
            reserved_mb: 0,
            used_mb: None,
            free_follows_processes: false,
            pid_namespace_offset: None,
            compute_mode: None,
            mig_capable: false,
            mig: None,
            mps_server: None,
            mps_processes: Vec::new(),
            errors: BTreeMap::new(),
            lists_grow: 0,
            compute_capability: None,
        }
    }
    pub fn a100_40gb() -> SimGpu {
        SimGpu::new("NVIDIA A100-SXM4-40GB", 40_960).compute_capability("8.0")
    }
    pub fn h100_80gb() -> SimGpu {
        SimGpu::new("NVIDIA H100 80GB HBM3", 81_559).compute_capability("9.0")
    }
    pub fn rtx_4090() -> SimGpu {
        SimGpu::new("NVIDIA GeForce RTX 4090", 24_564).compute_capability("8.9")
    }
    pub fn t4() -> SimGpu {
        SimGpu::new("Tesla T4", 15_360).compute_capability("7.5")
    }
    pub fn compute_capability(mut self, cc: &str) -> SimGpu {
        self.compute_capability = Some(cc.to_string());
        self
    }
    pub fn free_mb(mut self, mb: u64) -> SimGpu {
        self.free_mb = mb;
        self
    }
    pub fn uuid(mut self, uuid: &str) -> SimGpu {
        self.uuid = Some(uuid.to_string());
        self
    }
    pub fn process(mut self, pid: u32, used_mb: u64) -> SimGpu {
        self.processes.push((pid, Some(used_mb)));
        self
    }
    /// A process whose memory the driver does not report (as under some containers).
    pub fn process_unavailable(mut self, pid: u32) -> SimGpu {
        self.processes.push((pid, None));
        self
    }
    /// Every worker placed on this GPU uses `mb` (as NVML reports its process).
    pub fn workers_use(mut self, mb: u64) -> SimGpu {
        self.workers_use_mb = Some(mb);
        self
    }
    pub fn lost(mut self) -> SimGpu {
        self.lost = true;
        self
    }
    /// The driver reserves `mb` (reported in `nvmlMemory_v2_t.reserved`).
    pub fn reserved_mb(mut self, mb: u64) -> SimGpu {
        self.reserved_mb = mb;
        self
    }
    /// The v2 `used`; with [`SimGpu::free_follows_processes`], the base use.
    pub fn used_mb(mut self, mb: u64) -> SimGpu {
        self.used_mb = Some(mb);
        self
    }
    /// Free memory falls as the reported processes (scripted and `workers_use`) use memory.
    pub fn free_follows_processes(mut self) -> SimGpu {
        self.free_follows_processes = true;
        self
    }
    /// NVML reports this GPU's `workers_use` processes under pid + `offset` (a container
    /// without the host PID namespace).
    pub fn pid_namespace_offset(mut self, offset: u32) -> SimGpu {
        self.pid_namespace_offset = Some(offset);
        self
    }
    pub fn compute_mode(mut self, mode: SimComputeMode) -> SimGpu {
        self.compute_mode = Some(mode);
        self
    }
    /// MIG-capable, MIG disabled (without a [`SimMig`]).
    pub fn mig_capable(mut self) -> SimGpu {
        self.mig_capable = true;
        self
    }
    pub fn mig(mut self, mig: SimMig) -> SimGpu {
        self.mig = Some(mig);
        self
    }
    /// An MPS server (pid `server_pid`, using `server_mb`) runs on this GPU.
    pub fn mps(mut self, server_pid: u32, server_mb: u64) -> SimGpu {
        self.mps_server = Some((server_pid, server_mb));
        self
    }
    /// An MPS client of this GPU's server, listed as it is.
    pub fn mps_process(mut self, pid: u32, used_mb: u64) -> SimGpu {
        self.mps_processes.push((pid, Some(used_mb)));
        self
    }
    /// The first `n` fill calls of its process lists find a process started since the count
    /// call (`INSUFFICIENT_SIZE`), as a real driver's list does when a client starts between.
    pub fn lists_grow(mut self, n: u32) -> SimGpu {
        self.lists_grow = n;
        self
    }
    /// `function` (e.g. `"nvmlDeviceGetComputeMode"`) answers `code` on this GPU's handle.
    pub fn error(mut self, function: &str, code: u32) -> SimGpu {
        self.errors.insert(function.to_string(), code);
        self
    }
}

/// The whole simulated machine.
#[derive(Debug, Clone, PartialEq)]
pub struct SimGpus {
    pub driver: String,
    pub gpus: Vec<SimGpu>,
    /// Make `nvmlInit` fail with this `nvmlReturn_t` (e.g. 9 = driver not loaded).
    pub init_error: Option<u32>,
    /// `nvmlSystemGetCudaDriverVersion` (1000 × major + 10 × minor; `None`: the mock's
    /// 13000).
    pub cuda_driver_version: Option<i32>,
    /// Processes found through `workers_use` are reported under pid + this on every GPU
    /// that sets none itself.
    pub pid_namespace_offset: Option<u32>,
    /// Injected answers on every device and system call: function → `nvmlReturn_t`.
    pub errors: BTreeMap<String, u32>,
}

impl SimGpus {
    pub fn new(gpus: Vec<SimGpu>) -> SimGpus {
        SimGpus {
            driver: "580.65.06".into(),
            gpus,
            init_error: None,
            cuda_driver_version: None,
            pid_namespace_offset: None,
            errors: BTreeMap::new(),
        }
    }

    pub fn driver(mut self, version: &str) -> SimGpus {
        self.driver = version.to_string();
        self
    }
    /// E.g. 12040 for CUDA 12.4.
    pub fn cuda_driver_version(mut self, version: i32) -> SimGpus {
        self.cuda_driver_version = Some(version);
        self
    }
    pub fn pid_namespace_offset(mut self, offset: u32) -> SimGpus {
        self.pid_namespace_offset = Some(offset);
        self
    }
    /// `function` answers `code` everywhere (every device and the system calls).
    pub fn error(mut self, function: &str, code: u32) -> SimGpus {
        self.errors.insert(function.to_string(), code);
        self
    }
    pub fn init_error(mut self, code: u32) -> SimGpus {
        self.init_error = Some(code);
        self
    }

    /// `n` copies of one GPU, with distinct UUIDs.
    pub fn same(n: usize, gpu: SimGpu) -> SimGpus {
        SimGpus::new(vec![gpu; n])
    }

    /// The UUID GPU `index` will report.
    pub fn uuid_of(&self, index: usize) -> String {
        self.gpus[index]
            .uuid
            .clone()
            .unwrap_or_else(|| format!("GPU-sim-{index:04}-0000-0000-0000-000000000000"))
    }

    pub fn to_json(&self) -> Value {
        let gpus: Vec<Value> = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let procs = processes_json(&g.processes);
                let mut gpu = json!({
                    "name": g.name,
                    "uuid": self.uuid_of(i),
                    "total_mb": g.total_mb,
                    "free_mb": g.free_mb,
                    "processes": procs,
                    "lost": g.lost,
                });
                if let Some(mb) = g.workers_use_mb {
                    gpu["visible_process_used_mb"] = json!(mb);
                }
                // `free_mb` is always written (as before); the rest only when set.
                memory_json(
                    &mut gpu,
                    None,
                    g.reserved_mb,
                    g.used_mb,
                    g.free_follows_processes,
                );
                if let Some(n) = g.pid_namespace_offset {
                    gpu["pid_namespace_offset"] = json!(n);
                }
                if let Some(cc) = &g.compute_capability {
                    gpu["compute_capability"] = json!(cc);
                }
                if let Some(m) = g.compute_mode {
                    gpu["compute_mode"] = json!(m.as_str());
                }
                if g.mig_capable {
                    gpu["mig_capable"] = json!(true);
                }
                if let Some(mig) = &g.mig {
                    gpu["mig"] = mig.to_json();
                }
                if let Some((pid, mb)) = g.mps_server {
                    gpu["mps"] = json!({"server_pid": pid, "server_used_mb": mb});
                }
                if !g.mps_processes.is_empty() {
                    gpu["mps_processes"] = json!(processes_json(&g.mps_processes));
                }
                if !g.errors.is_empty() {
                    gpu["errors"] = json!(g.errors);
                }
                if g.lists_grow > 0 {
                    gpu["lists_grow"] = json!(g.lists_grow);
                }
                gpu
            })
            .collect();
        let mut doc = json!({"driver": self.driver, "gpus": gpus});
        if let Some(code) = self.init_error {
            doc["init_error"] = json!(code);
        }
        if let Some(v) = self.cuda_driver_version {
            doc["cuda_driver_version"] = json!(v);
        }
        if let Some(n) = self.pid_namespace_offset {
            doc["pid_namespace_offset"] = json!(n);
        }
        if !self.errors.is_empty() {
            doc["errors"] = json!(self.errors);
        }
        doc
    }

    /// Writes the file atomically (a running server never reads half of it).
    pub fn write(&self, path: &Path) {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&self.to_json()).unwrap())
            .unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
        std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
    }
}

/// The built mock NVML library (`libnvml_mock.so`): `$NVML_MOCK_LIB` when set, else built
/// once per test process with `cargo build -p nvml-mock` into `<target>/nvml-mock/` (its own
/// target directory, so the build does not wait on the lock of the `cargo test` running us).
pub fn mock_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(p) = std::env::var_os(ENV_LIB) {
            return PathBuf::from(p);
        }
        let root = workspace_root();
        let target = target_dir().join("nvml-mock");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "--quiet", "-p", "nvml-mock", "--manifest-path"])
            .arg(root.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .output()
            .expect("run cargo to build nvml-mock");
        assert!(
            out.status.success(),
            "cargo build -p nvml-mock failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lib = target.join("debug").join("libnvml_mock.so");
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
    .clone()
}

/// The folder holding `tests/nvml-mock`, from the including package's manifest folder up.
fn workspace_root() -> PathBuf {
    let start = Path::new(env!("CARGO_MANIFEST_DIR"));
    start
        .ancestors()
        .find(|d| d.join("tests/nvml-mock/Cargo.toml").is_file())
        .unwrap_or_else(|| panic!("no tests/nvml-mock above {}", start.display()))
        .to_path_buf()
}

/// `target/` of the running test binary (`target/<profile>/deps/<test>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .nth(3)
        .expect("test binary lies in target/<profile>/deps")
        .to_path_buf()
}

/// Serialises the tests of one test process that load the mock in-process: it reads
/// `NVML_MOCK_FILE` from the process environment.
static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The mock loaded in this test process (not through a started `app`): the simulated
/// machine written to a file of its own, `NVML_MOCK_FILE` pointing at it, and the other
/// in-process tests of this binary waiting until this one is dropped.
pub struct InProcess {
    _guard: std::sync::MutexGuard<'static, ()>,
    _dir: tempfile::TempDir,
    pub file: PathBuf,
    pub lib: PathBuf,
}

impl InProcess {
    pub fn new(gpus: &SimGpus) -> InProcess {
        let lib = mock_library();
        let guard = IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gpus.json");
        gpus.write(&file);
        std::env::set_var(ENV_FILE, &file);
        InProcess {
            _guard: guard,
            _dir: dir,
            file,
            lib,
        }
    }
}

/// A stand-in for NVIDIA's MPS control daemon (`nvidia-cuda-mps-control -d`): its control
/// socket, `<pipe directory>/control`, listening as the daemon's does, `SOCK_SEQPACKET`
/// (`lsof` of a running daemon: `control type=SEQPACKET (LISTEN)`). A CUDA process becomes
/// an MPS client when it can connect there (`CUDA_MPS_PIPE_DIRECTORY`, default
/// `/tmp/nvidia-mps`), which is what vramfork looks for; give the server that variable.
pub struct MpsDaemon {
    dir: tempfile::TempDir,
    control: Option<std::os::fd::OwnedFd>,
}

impl MpsDaemon {
    pub fn start() -> MpsDaemon {
        let mut d = MpsDaemon {
            dir: tempfile::tempdir().unwrap(),
            control: None,
        };
        d.restart();
        d
    }

    /// The daemon exits: its socket is closed and removed, as `quit` leaves it.
    pub fn stop(&mut self) {
        self.control = None;
        let _ = std::fs::remove_file(self.dir.path().join("control"));
    }

    /// The daemon (started again) listens in the same pipe directory.
    pub fn restart(&mut self) {
        use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag};
        use nix::sys::socket::{SockType, UnixAddr};
        use std::os::fd::AsRawFd;
        self.stop();
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("a SOCK_SEQPACKET socket");
        let addr = UnixAddr::new(&self.dir.path().join("control")).unwrap();
        bind(fd.as_raw_fd(), &addr).expect("bind the MPS control socket");
        listen(&fd, Backlog::new(64).unwrap()).expect("listen on the MPS control socket");
        self.control = Some(fd);
    }

    /// The value of `CUDA_MPS_PIPE_DIRECTORY` for it.
    pub fn pipe_dir(&self) -> String {
        self.dir.path().display().to_string()
    }
}
