//! Simulated GPUs for tests: writes the JSON file that the NVML stand-in
//! (`tests/nvml-mock`, built as `libnvml_mock.so`) reads, and finds or builds that library.
//!
//! Include it with `#[path = "support/nvml_sim.rs"] mod nvml_sim;`. For a process test:
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
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};

/// The environment variable naming the JSON file the mock reads.
pub const ENV_FILE: &str = "NVML_MOCK_FILE";
/// Set it to use an already built mock library instead of building one.
pub const ENV_LIB: &str = "NVML_MOCK_LIB";

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
        }
    }
    pub fn a100_40gb() -> SimGpu {
        SimGpu::new("NVIDIA A100-SXM4-40GB", 40_960)
    }
    pub fn h100_80gb() -> SimGpu {
        SimGpu::new("NVIDIA H100 80GB HBM3", 81_559)
    }
    pub fn rtx_4090() -> SimGpu {
        SimGpu::new("NVIDIA GeForce RTX 4090", 24_564)
    }
    pub fn t4() -> SimGpu {
        SimGpu::new("Tesla T4", 15_360)
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
}

/// The whole simulated machine.
#[derive(Debug, Clone, PartialEq)]
pub struct SimGpus {
    pub driver: String,
    pub gpus: Vec<SimGpu>,
    /// Make `nvmlInit` fail with this `nvmlReturn_t` (e.g. 9 = driver not loaded).
    pub init_error: Option<u32>,
}

impl SimGpus {
    pub fn new(gpus: Vec<SimGpu>) -> SimGpus {
        SimGpus {
            driver: "550.54.15".into(),
            gpus,
            init_error: None,
        }
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
                let procs: Vec<Value> = g
                    .processes
                    .iter()
                    .map(|(pid, mb)| match mb {
                        Some(mb) => json!({"pid": pid, "used_mb": mb}),
                        None => json!({"pid": pid}),
                    })
                    .collect();
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
                gpu
            })
            .collect();
        let mut doc = json!({"driver": self.driver, "gpus": gpus});
        if let Some(code) = self.init_error {
            doc["init_error"] = json!(code);
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
