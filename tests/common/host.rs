//! One host whose servers share a GPU: a simulated GPU (the NVML stand-in,
//! `--simulated-gpus`: workers run on the CPU, so NVML's free memory never falls as they
//! start — only the GPU-memory ledger keeps servers apart) and the ledger directory every
//! server started here shares. Used by `tests/ledger.rs` and `tests/idle_release.rs`.

use std::path::PathBuf;

use serde_json::Value;

use super::nvml_sim::{self, SimGpu, SimGpus};
use super::{App, Server, PATIENCE};

/// The A100 40 GB's share of its memory the servers plan on (the default usable fraction,
/// 0.9, of its 40,960 MB), in MB.
pub const A100_SHARE_MB: u64 = 36_864;

/// A simulated GPU and the ledger directory its servers share.
pub struct Host {
    pub dir: tempfile::TempDir,
    /// More environment for every server started here.
    env: Vec<(String, String)>,
}

impl Host {
    /// A host with one A100 40 GB.
    pub fn new() -> Host {
        Host::with_gpu(SimGpu::a100_40gb())
    }

    /// A host with one A100 40 GB in exclusive-process mode behind a running (simulated) MPS
    /// control daemon, which every server started here is pointed at; the daemon is
    /// returned too, so that it lives as long as the test holds it. The servers state their
    /// share of the GPU (under MPS with no per-client limit they must): 0.9, the A100 40 GB's
    /// default, so that [`A100_SHARE_MB`] holds.
    pub fn under_mps() -> (nvml_sim::MpsDaemon, Host) {
        let daemon = nvml_sim::MpsDaemon::start();
        let exclusive = SimGpu::a100_40gb()
            .compute_mode(nvml_sim::SimComputeMode::ExclusiveProcess)
            .mps(4_242, 300);
        let host = Host::with_gpu(exclusive)
            .with_env("CUDA_MPS_PIPE_DIRECTORY", &daemon.pipe_dir())
            .with_env("VRAMFORK_GPU_MEMORY_UTILIZATION", "0.9");
        (daemon, host)
    }

    /// A host with `gpu`.
    pub fn with_gpu(gpu: SimGpu) -> Host {
        let dir = tempfile::tempdir().unwrap();
        SimGpus::new(vec![gpu]).write(&dir.path().join("gpus.json"));
        Host {
            dir,
            env: Vec::new(),
        }
    }

    /// Every server started here also gets `name=value`.
    pub fn with_env(mut self, name: &str, value: &str) -> Host {
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn ledger(&self) -> PathBuf {
        self.dir.path().join("ledger")
    }

    /// The environment of a server here: the simulated GPU's file, the ledger, and what
    /// [`Host::with_env`] added.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                nvml_sim::ENV_FILE.to_string(),
                self.dir.path().join("gpus.json").display().to_string(),
            ),
            (
                "VRAMFORK_LEDGER".into(),
                self.ledger().display().to_string(),
            ),
        ];
        env.extend(self.env.iter().cloned());
        env
    }

    /// An app of this host: the MLP fixture declaring its input and `typ_mb` per worker.
    pub fn app(&self, typ_mb: u64) -> App {
        App::new(
            "mlp.pt",
            &format!(
                r#""input": {{"shape": [-1, 4]}}, "est_gpu_mem_min": 1000, "est_gpu_mem_typ": {typ_mb}"#
            ),
        )
    }

    /// The arguments that put a server on the simulated GPU (`lib`: the NVML stand-in),
    /// then `more`.
    pub fn args<'a>(&self, lib: &'a str, more: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec!["--nvml-library", lib, "--simulated-gpus"];
        a.extend_from_slice(more);
        a
    }

    /// `app` of `app` on this host with `more`.
    pub fn spawn(&self, app: &App, more: &[&str]) -> Server {
        let lib = nvml_sim::mock_library().display().to_string();
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Server::spawn(app, &self.args(&lib, more), &env)
    }

    /// `app --production` of `app` on this host with `more`, listening with every planned
    /// worker ready; the worker count it planned.
    pub fn serving(&self, app: &App, more: &[&str]) -> (Server, u64) {
        let mut args = vec!["--production"];
        args.extend_from_slice(more);
        let s = self.spawn(app, &args).wait_listening();
        let n = s.wait_event("listening", |_| true).u64("workers").unwrap();
        s.wait_workers(n as usize);
        (s, n)
    }

    /// `app plan --json` of `app` on this host with `more`, with the ledger as it is now.
    pub fn plan(&self, app: &App, more: &[&str]) -> Value {
        let mut a = vec!["plan", "--json"];
        a.extend_from_slice(more);
        let mut s = self.spawn(app, &a);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(0), "app plan:\n{log}");
        s.stdout_json()
    }

    /// The live reservations in the ledger, read as any tool would (each server's
    /// `server-*.json`, live until its `expires_boot_ms` on `CLOCK_BOOTTIME`): per server,
    /// its master's pid and the MB it reserved (every device together).
    pub fn reservations(&self) -> Vec<(u32, u64)> {
        let Ok(dir) = std::fs::read_dir(self.ledger()) else {
            return Vec::new();
        };
        let now = boot_ms();
        let entry = |e: &Value| -> (u32, u64) {
            let gpus = e["gpus"].as_object().unwrap().values();
            let pid = e["pid"].as_u64().unwrap() as u32;
            (pid, gpus.map(|mb| mb.as_u64().unwrap()).sum())
        };
        let mut out = Vec::new();
        for f in dir.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("server-") && name.ends_with(".json")) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(f.path()) else {
                continue; // removed since it was listed
            };
            let e: Value = serde_json::from_str(&text).unwrap();
            if e["expires_boot_ms"].as_u64().unwrap() > now {
                out.push(entry(&e));
            }
        }
        out
    }

    /// The live reservations in the ledger file, MB, all servers together.
    pub fn reserved(&self) -> u64 {
        self.reservations().iter().map(|e| e.1).sum()
    }

    /// The live reservation of the server whose master is `pid`, MB (0: none).
    pub fn reserved_by(&self, pid: u32) -> u64 {
        let own = self.reservations().into_iter().filter(|e| e.0 == pid);
        own.map(|e| e.1).sum()
    }
}

/// Each worker's MPS per-client limit (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in its
/// environment, and its configuration's `mps_limit_mb`), MB, by pid.
pub fn mps_limits(pids: &[u32]) -> Vec<u64> {
    let limit = |pid: &u32| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        let cfg = vars
            .iter()
            .find_map(|kv| kv.strip_prefix(b"VRAMFORK_WORKER_CONFIG="))
            .map(|v| serde_json::from_slice::<Value>(v).unwrap())
            .expect("a worker config");
        let mb = cfg["gpu"]["mps_limit_mb"].as_u64().expect("an MPS limit");
        let var = format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mb}MB");
        assert!(
            vars.contains(&var.as_bytes()),
            "worker {pid}: {var} in its environment"
        );
        mb
    };
    pids.iter().map(limit).collect()
}

/// `CLOCK_BOOTTIME` in milliseconds, the clock the ledger's leases run on.
pub fn boot_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into `ts`, which outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}
