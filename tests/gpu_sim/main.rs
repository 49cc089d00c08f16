//! Process tests of the real `app` binary on simulated GPUs: the master loads the NVML
//! stand-in (`tests/nvml-mock`) through `--nvml-library`, so the real `nvml-wrapper` →
//! `resources::NvmlProbe` → `plan` → supervisor path runs without a GPU. The simulated
//! machine is a JSON file (`NVML_MOCK_FILE`) that the mock re-reads on every call, so a
//! test can change a GPU's free memory while the server runs (admission).
//!
//! Workers placed on a simulated GPU run their model on the CPU because the tests say so
//! (`--simulated-gpus`: such a worker reports `cpu (simulated GPU)`; without the flag a
//! worker placed on a GPU that comes up without CUDA stops the server, as tested below).
//! What these tests check is what the master decides: how many workers, on which GPU
//! (`CUDA_VISIBLE_DEVICES` = the GPU's UUID), with which allocator cap, and when a worker
//! must wait for memory.
//!
//! Expected numbers are computed here from the documented rule (docs/production.md and
//! docs/gpu.md, the utilisation table in `src/master/plan/fit.rs`), never copied from the
//! program's output:
//! `usable = min(floor(total × fraction), free) − reserve`, `fits = floor(usable / max(typ,
//! context + 64))` (0 when `free < est_gpu_mem_min + reserve`), workers = min(2 × cores +
//! 1, Σ fits), each worker to the GPU with the most room left (ties to the lower index),
//! each worker's allocator cap `per worker − context` with per worker = max(typ, context +
//! 64) — what the GPU-memory ledger reserves for it — and context = 500 MB.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod caps;
mod gpu_path;
mod mps;
mod placement;
mod plan;

use common::nvml_sim;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use nvml_sim::{SimGpu, SimGpus};
use serde_json::Value;

/// MB kept free per GPU unless `--gpu-reserve-mb` says otherwise.
const DEFAULT_RESERVE_MB: u64 = 500;
/// MB one worker's CUDA context takes beside its allocator's cap (README, "GPU memory").
const CONTEXT_MB: u64 = 500;

// ---------------------------------------------------------------------------------------
// The documented rule, written out independently of src/master/plan/.

/// `UTILIZATION_BY_GPU_SIZE`: 0.95 from 60 GiB, 0.90 from 20 GiB, else 0.84.
fn utilisation(total_mb: u64) -> f64 {
    if total_mb >= 60 * 1024 {
        0.95
    } else if total_mb >= 20 * 1024 {
        0.90
    } else {
        0.84
    }
}

/// What the rule says about one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Expect {
    fraction: f64,
    usable_mb: u64,
    fits: u32,
    /// MB one worker is planned as: `max(typ, context + 64)`.
    per_worker_mb: u64,
    /// Left out by admission (free < est_gpu_mem_min + reserve).
    not_admitted: bool,
}

#[derive(Debug, Clone, Copy)]
struct Rule {
    min: u64,
    typ: u64,
    reserve: u64,
    utilisation: Option<f64>,
}

impl Rule {
    fn new(min: u64, typ: u64) -> Rule {
        Rule {
            min,
            typ,
            reserve: DEFAULT_RESERVE_MB,
            utilisation: None,
        }
    }

    fn gpu(&self, g: &SimGpu) -> Expect {
        let fraction = self.utilisation.unwrap_or_else(|| utilisation(g.total_mb));
        let cap = (g.total_mb as f64 * fraction).floor() as u64;
        let usable_mb = cap.min(g.free_mb).saturating_sub(self.reserve);
        let not_admitted = g.free_mb < self.min + self.reserve;
        let per_worker_mb = self.typ.max(CONTEXT_MB + 64);
        let fits = if not_admitted {
            0
        } else {
            (usable_mb / per_worker_mb) as u32
        };
        Expect {
            fraction,
            usable_mb,
            fits,
            per_worker_mb,
            not_admitted,
        }
    }

    fn fits(&self, sim: &SimGpus) -> Vec<u32> {
        sim.gpus.iter().map(|g| self.gpu(g).fits).collect()
    }
}

/// Workers per GPU when `n` workers go, one by one, to the GPU with the most room left.
fn place(fits: &[u32], n: u32) -> Vec<u32> {
    let mut assigned = vec![0u32; fits.len()];
    for _ in 0..n {
        let mut best: Option<usize> = None;
        for i in 0..fits.len() {
            let room = fits[i] - assigned[i];
            if room > 0 && best.is_none_or(|b| room > fits[b] - assigned[b]) {
                best = Some(i);
            }
        }
        assigned[best.expect("n ≤ Σ fits")] += 1;
    }
    assigned
}

/// The CPU bound: `2 × cores + 1`, cores as `num_cpus` counts them.
fn cpu_bound() -> u32 {
    2 * num_cpus::get().max(1) as u32 + 1
}

/// The allocator cap of each worker on a GPU in MB: the figure it is planned as (what the
/// ledger reserves for it) less its context.
fn cap_mb(e: &Expect) -> u64 {
    e.per_worker_mb - CONTEXT_MB
}

/// The same cap as a share of the GPU's total, rounded down to 4 decimals.
fn memory_fraction(e: &Expect, total_mb: u64) -> f64 {
    ((cap_mb(e) as f64 / total_mb as f64) * 10_000.0).floor() / 10_000.0
}

// ---------------------------------------------------------------------------------------
// Harness: an app whose directory also holds the simulated machine.

struct Sim {
    app: App,
    file: PathBuf,
    gpus: SimGpus,
}

impl Sim {
    fn new(gpus: SimGpus, meta: &str) -> Sim {
        let app = App::new(
            "mlp.pt",
            &format!(r#""input": {{"shape": [-1, 4]}}, {meta}"#),
        );
        let file = app.dir.path().join("gpus.json");
        gpus.write(&file);
        Sim { app, file, gpus }
    }

    /// Rewrites the simulated machine (the running server sees it on its next NVML call).
    fn set(&mut self, gpus: SimGpus) {
        gpus.write(&self.file);
        self.gpus = gpus;
    }

    fn set_free(&mut self, index: usize, free_mb: u64) {
        let mut g = self.gpus.clone();
        g.gpus[index].free_mb = free_mb;
        self.set(g);
    }

    fn args<'a>(&self, lib: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec!["--nvml-library", lib, "--simulated-gpus"];
        a.extend_from_slice(args);
        a
    }

    fn spawn(&self, args: &[&str], env: &[(&str, &str)]) -> Server {
        let lib = lib();
        let file = self.file.display().to_string();
        let mut e = vec![(nvml_sim::ENV_FILE, file.as_str())];
        e.extend_from_slice(env);
        Server::spawn(&self.app, &self.args(&lib, args), &e)
    }

    fn start(&self, args: &[&str], env: &[(&str, &str)]) -> Server {
        let lib = lib();
        let file = self.file.display().to_string();
        let mut e = vec![(nvml_sim::ENV_FILE, file.as_str())];
        e.extend_from_slice(env);
        Server::start_env(&self.app, &self.args(&lib, args), &e)
    }

    /// `app plan --json` (plus `args`): exit 0 and the plan.
    fn plan(&self, args: &[&str]) -> Value {
        self.plan_env(args, &[])
    }

    /// [`Sim::plan`] with these environment variables.
    fn plan_env(&self, args: &[&str], env: &[(&str, &str)]) -> Value {
        let mut a = vec!["plan", "--json"];
        a.extend_from_slice(args);
        let mut s = self.spawn(&a, env);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(0), "app plan {args:?}:\n{log}");
        s.stdout_json()
    }

    /// `app plan` as text.
    fn plan_text(&self, args: &[&str]) -> String {
        let mut a = vec!["plan"];
        a.extend_from_slice(args);
        let mut s = self.spawn(&a, &[]);
        let st = s.wait_exit(PATIENCE);
        assert_eq!(st.code(), Some(0), "app plan:\n{}", s.log_text());
        s.log_text()
    }
}

fn lib() -> String {
    nvml_sim::mock_library().display().to_string()
}

fn meta(min: u64, typ: u64) -> String {
    format!(r#""est_gpu_mem_min": {min}, "est_gpu_mem_typ": {typ}"#)
}

/// A process's environment, from /proc.
fn environ(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/environ: {e}"));
    raw.split(|b| *b == 0)
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// A worker's `CUDA_VISIBLE_DEVICES` (`None`: not set at all).
fn visible_devices(pid: u32) -> Option<String> {
    environ(pid).get("CUDA_VISIBLE_DEVICES").cloned()
}

/// The configuration the master handed a worker (`VRAMFORK_WORKER_CONFIG`).
fn worker_config(pid: u32) -> Value {
    let env = environ(pid);
    let json = env
        .get("VRAMFORK_WORKER_CONFIG")
        .unwrap_or_else(|| panic!("worker {pid} has no VRAMFORK_WORKER_CONFIG"));
    serde_json::from_str(json).unwrap()
}

/// Workers per `CUDA_VISIBLE_DEVICES` value.
fn per_device(workers: &[u32]) -> BTreeMap<String, u32> {
    let mut m = BTreeMap::new();
    for w in workers {
        let d = visible_devices(*w).unwrap_or_else(|| format!("<unset in {w}>"));
        *m.entry(d).or_insert(0) += 1;
    }
    m
}

/// How many workers the master has reported ready since it started.
fn ready_count(s: &Server) -> usize {
    s.events_named("worker_ready").len()
}

/// A negative check, after the master has said why it waits: for `dur`, exactly `n` worker
/// processes run and no new one becomes ready (`ready` stays the count since the start).
/// A slow machine can only make this window less sensitive, never fail it wrongly.
fn stays(s: &Server, n: usize, ready: usize, dur: Duration) {
    let end = Instant::now() + dur;
    while Instant::now() < end {
        let pids = worker_pids(s.pid());
        assert_eq!(pids.len(), n, "workers now {pids:?}:\n{}", s.log_text());
        assert_eq!(
            ready_count(s),
            ready,
            "a new worker became ready:\n{}",
            s.log_text()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the master reports `n` workers ready (none booting or retiring) and `ready`
/// workers have become ready since the start; returns their pids.
fn wait_ready(s: &Server, n: usize, ready: usize) -> Vec<u32> {
    s.wait_workers_where(n, |_| ready_count(s) >= ready)
}

/// The master's `worker_waits` event of the first slot waiting on GPU 0 for `why`, from
/// event index `after` on.
fn wait_reason(s: &Server, after: usize, why: &str) -> Event {
    s.wait_event_after(after, "worker_waits", |e| {
        e.str("why") == Some(why) && e.u64("gpu") == Some(0)
    })
    .1
}

fn mb(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Checks `app plan --json` against the rule for this machine and these options.
fn check_plan(name: &str, sim: &Sim, rule: Rule, args: &[&str]) -> Value {
    let p = sim.plan(args);
    let want: Vec<Expect> = sim.gpus.gpus.iter().map(|g| rule.gpu(g)).collect();
    let fits: Vec<u32> = want.iter().map(|e| e.fits).collect();
    let gpu_bound: u32 = fits.iter().sum();
    let workers = gpu_bound.min(cpu_bound());
    let ctx = format!("{name}: {p:#}");
    assert_eq!(mb(&p["cpu_bound"]), u64::from(cpu_bound()), "{ctx}");
    assert_eq!(mb(&p["cpus"]), num_cpus::get() as u64, "{ctx}");
    assert_eq!(p["device"], "cuda", "{ctx}");
    assert_eq!(p["mode"], "gpu_memory", "{ctx}");
    assert_eq!(mb(&p["gpu_bound"]), u64::from(gpu_bound), "{ctx}");
    assert_eq!(mb(&p["workers"]), u64::from(workers), "{ctx}");
    assert_eq!(mb(&p["reserve_mb"]), rule.reserve, "{ctx}");
    let gpus = p["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), sim.gpus.gpus.len(), "{ctx}");
    let assigned = place(&fits, workers);
    for (i, (g, e)) in gpus.iter().zip(&want).enumerate() {
        let sg = &sim.gpus.gpus[i];
        assert_eq!(mb(&g["index"]), i as u64, "{ctx}");
        assert_eq!(g["name"], sg.name.as_str(), "{ctx}");
        assert_eq!(g["uuid"], sim.gpus.uuid_of(i).as_str(), "{ctx}");
        assert_eq!(mb(&g["total_mb"]), sg.total_mb, "{ctx}");
        assert_eq!(mb(&g["free_mb"]), sg.free_mb, "{ctx}");
        assert_eq!(g["fraction"].as_f64(), Some(e.fraction), "GPU {i}: {ctx}");
        assert_eq!(mb(&g["usable_mb"]), e.usable_mb, "GPU {i}: {ctx}");
        assert_eq!(mb(&g["fits"]), u64::from(e.fits), "GPU {i}: {ctx}");
        assert_eq!(mb(&g["assigned"]), u64::from(assigned[i]), "GPU {i}: {ctx}");
        assert_eq!(g["excluded"].is_null(), e.fits > 0, "GPU {i}: {ctx}");
        if e.not_admitted {
            let why = g["excluded"].as_str().unwrap();
            assert!(why.contains("est_gpu_mem_min"), "GPU {i}: {why}");
        }
        match g["memory_fraction"].as_f64() {
            Some(f) => {
                assert!(
                    (f - memory_fraction(e, sg.total_mb)).abs() < 1e-9,
                    "GPU {i}: cap {f}: {ctx}"
                );
                assert_eq!(mb(&g["cap_mb"]), cap_mb(e), "GPU {i}: {ctx}");
                // The program's caps and contexts of a full GPU within its usable memory.
                let full = (mb(&g["cap_mb"]) + mb(&p["cuda_context_mb"])) * mb(&g["fits"]);
                assert!(full <= mb(&g["usable_mb"]), "GPU {i}: {ctx}");
            }
            None => assert_eq!(e.fits, 0, "GPU {i} has no cap: {ctx}"),
        }
    }
    // The placement list agrees: slot order, each slot on a GPU by UUID.
    let placement = p["placement"].as_array().unwrap();
    assert_eq!(placement.len() as u32, workers, "{ctx}");
    let mut counted = vec![0u32; gpus.len()];
    for (slot, pl) in placement.iter().enumerate() {
        assert_eq!(mb(&pl["slot"]), slot as u64, "{ctx}");
        let i = mb(&pl["gpu"]["index"]) as usize;
        assert_eq!(pl["gpu"]["uuid"], sim.gpus.uuid_of(i).as_str(), "{ctx}");
        counted[i] += 1;
    }
    assert_eq!(counted, assigned, "{ctx}");
    assert!(p["unplaced"].as_array().unwrap().is_empty(), "{ctx}");
    p
}
