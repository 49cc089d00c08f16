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

mod common;
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

// ---------------------------------------------------------------------------------------
// (a) app plan on 1, 2 and 8 simulated GPUs.

#[test]
fn plan_on_one_gpu_follows_the_rule() {
    // 40 GB A100: usable = floor(40960 × 0.90) − 500 = 36364.
    let sim = Sim::new(SimGpus::new(vec![SimGpu::a100_40gb()]), &meta(1000, 15000));
    check_plan("1 GPU, typ 15000", &sim, Rule::new(1000, 15000), &[]);
    // A small estimate: the CPU bound decides.
    let sim = Sim::new(SimGpus::new(vec![SimGpu::a100_40gb()]), &meta(100, 300));
    let p = check_plan("1 GPU, typ 300", &sim, Rule::new(100, 300), &[]);
    assert_eq!(mb(&p["workers"]), u64::from(cpu_bound()));
    // The text form says the same.
    let text = sim.plan_text(&[]);
    assert!(text.contains("NVIDIA A100-SXM4-40GB"), "{text}");
    assert!(text.contains(&sim.gpus.uuid_of(0)), "{text}");
    assert!(
        text.contains(&format!("=> {} worker(s) on cuda (plan)", cpu_bound())),
        "{text}"
    );
}

#[test]
fn plan_on_two_gpus_of_different_sizes() {
    let gpus = SimGpus::new(vec![
        SimGpu::a100_40gb().free_mb(30_000),
        SimGpu::t4().free_mb(15_000),
    ]);
    let sim = Sim::new(gpus, &meta(2000, 9000));
    let rule = Rule::new(2000, 9000);
    // Sanity of the test's own arithmetic: A100 29500 → 3, T4 12402 → 1.
    assert_eq!(rule.fits(&sim.gpus), vec![3, 1]);
    check_plan("2 GPUs", &sim, rule, &[]);
    // Policy overrides go into the same rule.
    let rule = Rule {
        reserve: 2000,
        utilisation: Some(0.5),
        ..rule
    };
    check_plan(
        "2 GPUs, reserve 2000, utilisation 0.5",
        &sim,
        rule,
        &[
            "--gpu-reserve-mb",
            "2000",
            "--gpu-memory-utilization",
            "0.5",
        ],
    );
}

#[test]
fn plan_on_eight_mixed_gpus() {
    let gpus = SimGpus::new(vec![
        SimGpu::h100_80gb().free_mb(81_000),
        SimGpu::h100_80gb().free_mb(30_000),
        SimGpu::a100_40gb(),
        SimGpu::a100_40gb().free_mb(4_000), // below min + reserve: not admitted
        SimGpu::rtx_4090().free_mb(24_000),
        SimGpu::t4(),
        SimGpu::new("NVIDIA A100-SXM4-80GB", 81_920),
        SimGpu::new("NVIDIA L4", 23_034).free_mb(20_000),
    ]);
    let sim = Sim::new(gpus, &meta(4000, 20000));
    let rule = Rule::new(4000, 20000);
    assert_eq!(rule.fits(&sim.gpus), vec![3, 1, 1, 0, 1, 0, 3, 0]);
    let p = check_plan("8 GPUs", &sim, rule, &[]);
    // Every GPU that takes no worker is named in a warning.
    let warnings = p["warnings"].to_string();
    for i in [3, 5, 7] {
        assert!(warnings.contains(&format!("GPU {i} (")), "{warnings}");
    }
    // With a larger estimate only the big ones take a worker, and the GPU bound decides.
    let sim = Sim::new(sim.gpus.clone(), &meta(4000, 38000));
    let rule = Rule::new(4000, 38000);
    assert_eq!(rule.fits(&sim.gpus), vec![2, 0, 0, 0, 0, 0, 2, 0]);
    check_plan("8 GPUs, typ 38000", &sim, rule, &[]);
}

// ---------------------------------------------------------------------------------------
// (b) app --production places workers on their GPUs.

#[test]
fn production_places_workers_on_their_gpu_by_uuid() {
    // A100 40 GB: 36364 usable → 2 of 15000; RTX 4090: floor(24564 × 0.9) − 500 = 21607 → 1.
    let gpus = SimGpus::new(vec![SimGpu::a100_40gb(), SimGpu::rtx_4090()]);
    let sim = Sim::new(gpus, &meta(1000, 15000));
    let rule = Rule::new(1000, 15000);
    let fits = rule.fits(&sim.gpus);
    assert_eq!(fits, vec![2, 1]);
    let n = fits.iter().sum::<u32>().min(cpu_bound());
    let s = sim.start(&["--production"], &[]);
    // The master reports n wanted and n ready; /proc agrees.
    let workers = s.wait_workers(n as usize);
    assert_eq!(worker_pids(s.pid()), workers, "more workers than planned");

    let want: BTreeMap<String, u32> = place(&fits, n)
        .iter()
        .enumerate()
        .map(|(i, c)| (sim.gpus.uuid_of(i), *c))
        .collect();
    assert_eq!(per_device(&workers), want);
    let user_conf = std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok();
    for w in &workers {
        let env = environ(*w);
        let uuid = env["CUDA_VISIBLE_DEVICES"].clone();
        // The allocator setting: ours unless the environment already had one.
        assert_eq!(
            env.get("PYTORCH_CUDA_ALLOC_CONF").map(String::as_str),
            Some(user_conf.as_deref().unwrap_or("expandable_segments:True")),
            "worker {w}"
        );
        // The master's handover agrees with the environment, and the cap is the GPU's
        // per-worker share of usable memory.
        let cfg = worker_config(*w);
        let i = mb(&cfg["gpu"]["index"]) as usize;
        assert_eq!(sim.gpus.uuid_of(i), uuid, "worker {w}: {cfg}");
        assert_eq!(cfg["gpu"]["uuid"], uuid.as_str());
        let e = rule.gpu(&sim.gpus.gpus[i]);
        let cap = cfg["gpu"]["memory_fraction"].as_f64().unwrap();
        assert!(
            (cap - memory_fraction(&e, sim.gpus.gpus[i].total_mb)).abs() < 1e-9,
            "worker {w}: cap {cap}"
        );
        assert_eq!(mb(&cfg["gpu"]["cap_mb"]), cap_mb(&e), "worker {w}: {cfg}");
        assert_eq!(cfg["device"], "cuda", "worker {w}: placed on a GPU: {cfg}");
        assert_eq!(cfg["nvml_library"], lib().as_str());
    }
    // The master itself is on no GPU list and never answers; workers serve (on the CPU here).
    for _ in 0..6 {
        let r = s.post("/", MLP_INPUT);
        assert_eq!(r.status, 200, "{r:?}");
        assert!(workers.contains(&r.pid()), "{r:?}");
    }
}

#[test]
fn production_keeps_the_users_allocator_setting() {
    let gpus = SimGpus::new(vec![SimGpu::a100_40gb(), SimGpu::rtx_4090()]);
    let sim = Sim::new(gpus, &meta(1000, 15000));
    let conf = "max_split_size_mb:64";
    let s = sim.start(
        &["--production", "--workers", "2"],
        &[("PYTORCH_CUDA_ALLOC_CONF", conf)],
    );
    let workers = s.wait_workers(2);
    for w in &workers {
        let env = environ(*w);
        assert_eq!(
            env.get("PYTORCH_CUDA_ALLOC_CONF").map(String::as_str),
            Some(conf)
        );
        let d = &env["CUDA_VISIBLE_DEVICES"];
        assert!(
            *d == sim.gpus.uuid_of(0) || *d == sim.gpus.uuid_of(1),
            "worker {w}: {d}"
        );
    }
    // --workers 2 on fits [2, 1]: both on the GPU with the most room, the A100.
    assert_eq!(
        per_device(&workers),
        BTreeMap::from([(sim.gpus.uuid_of(0), 2)])
    );
}

// ---------------------------------------------------------------------------------------
// (c) a model too big for every GPU.

#[test]
fn model_too_big_exits_2_naming_the_gpu_then_device_cpu_starts() {
    let gpus = SimGpus::new(vec![SimGpu::t4().free_mb(15_000)]);
    let sim = Sim::new(gpus, &meta(1000, 20000));
    // The rule agrees that it does not fit: 12402 usable < 20000.
    assert_eq!(Rule::new(1000, 20000).fits(&sim.gpus), vec![0]);
    for args in [&["--production"][..], &["plan"][..]] {
        let mut s = sim.spawn(args, &[]);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(2), "{args:?}: {log}");
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line wanted:\n{log}");
        let line = lines[0];
        for want in [
            "app: ",
            "GPU 0 (Tesla T4",
            "15000 MB free",
            "est_gpu_mem_typ 20000 MB",
            "--device cpu",
        ] {
            assert!(line.contains(want), "{args:?}: no {want:?} in {line}");
        }
        assert!(!log.contains("listening"), "{log}");
    }

    // --device cpu: the CPU bound, every worker on the CPU, serving.
    let p = sim.plan(&["--device", "cpu"]);
    assert_eq!(p["device"], "cpu", "{p:#}");
    assert_eq!(mb(&p["workers"]), u64::from(cpu_bound()), "{p:#}");
    let s = sim.start(&["--production", "--device", "cpu"], &[]);
    let workers = s.wait_workers(cpu_bound() as usize);
    for w in &workers {
        assert_eq!(visible_devices(*w).as_deref(), Some(""), "worker {w}");
        assert_eq!(worker_config(*w)["device"], "cpu");
    }
    assert_eq!(s.post("/", MLP_INPUT).status, 200);
}

#[test]
fn model_too_big_for_two_gpus_names_both() {
    let gpus = SimGpus::new(vec![
        SimGpu::rtx_4090().free_mb(10_000),
        SimGpu::a100_40gb().free_mb(2_000),
    ]);
    let sim = Sim::new(gpus, &meta(3000, 12000));
    assert_eq!(Rule::new(3000, 12000).fits(&sim.gpus), vec![0, 0]);
    let mut s = sim.spawn(&["--production"], &[]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(2));
    let log = s.log_text();
    assert_eq!(log.trim().lines().count(), 1, "{log}");
    for want in [
        "GPU 0 (NVIDIA GeForce RTX 4090",
        "10000 MB free",
        "GPU 1 (NVIDIA A100-SXM4-40GB",
        "2000 MB free",
        "est_gpu_mem_typ 12000 MB",
    ] {
        assert!(log.contains(want), "no {want:?} in {log}");
    }
}

// ---------------------------------------------------------------------------------------
// (d) partially used GPUs.

#[test]
fn partially_used_gpus_plan_fewer_workers() {
    let rule = Rule::new(1000, 10000);
    let idle = SimGpus::new(vec![SimGpu::a100_40gb(), SimGpu::rtx_4090()]);
    let used = SimGpus::new(vec![
        SimGpu::a100_40gb().free_mb(20_000),
        SimGpu::rtx_4090().free_mb(9_000),
    ]);
    let full: u32 = rule.fits(&idle).iter().sum();
    let part: u32 = rule.fits(&used).iter().sum();
    assert_eq!((full, part), (5, 1), "the test's own arithmetic");
    let mut sim = Sim::new(idle, &meta(1000, 10000));
    let p_full = check_plan("idle", &sim, rule, &[]);
    sim.set(used);
    let p_part = check_plan("partially used", &sim, rule, &[]);
    assert!(mb(&p_part["workers"]) < mb(&p_full["workers"]));

    // The server on the partially used GPUs starts that many workers, on the A100.
    let s = sim.start(&["--production"], &[]);
    let workers = s.wait_workers(1);
    stays(&s, 1, 1, Duration::from_millis(500));
    assert_eq!(
        per_device(&workers),
        BTreeMap::from([(sim.gpus.uuid_of(0), 1)])
    );
}

// ---------------------------------------------------------------------------------------
// (e) no GPU although the app expects one.

#[test]
fn no_gpu_starts_on_the_cpu_and_says_so_loudly() {
    let sim = Sim::new(SimGpus::new(vec![]), &meta(3000, 5000));
    let text = sim.plan_text(&[]);
    assert!(
        text.contains(
            "WARNING: the app expects a GPU (est_gpu_mem_typ 5000 MB) but none is visible"
        ),
        "{text}"
    );
    assert!(text.contains("NVML sees no GPU"), "{text}");
    let p = sim.plan(&[]);
    assert_eq!(p["device"], "cpu", "{p:#}");
    assert_eq!(mb(&p["workers"]), u64::from(cpu_bound()), "{p:#}");
    assert!(p["gpu_bound"].is_null(), "{p:#}");
    assert!(
        p["warnings"].to_string().contains("the app expects a GPU"),
        "{p:#}"
    );

    let s = sim.start(&["--production"], &[]);
    let workers = s.wait_workers(cpu_bound() as usize);
    let warn = s.wait_event("plan_warning", |e| {
        e.message().contains("the app expects a GPU")
    });
    assert_eq!(warn.level, "WARN", "not a warning: {warn:?}");
    assert!(warn.message().contains("serving on the CPU"), "{warn:?}");
    for w in &workers {
        assert_eq!(visible_devices(*w).as_deref(), Some(""), "worker {w}");
        assert!(worker_config(*w)["gpu"].is_null());
    }
    assert_eq!(s.post("/", MLP_INPUT).status, 200);
}

// ---------------------------------------------------------------------------------------
// (f) admission while running.

/// One A100 40 GB with room for 2 workers of 15000 MB; admission needs 3000 + 500 MB free.
fn admission_sim() -> Sim {
    let sim = Sim::new(SimGpus::new(vec![SimGpu::a100_40gb()]), &meta(3000, 15000));
    assert_eq!(Rule::new(3000, 15000).fits(&sim.gpus), vec![2]);
    sim
}

/// `worker_waits` reason: GPU 0 lacks the free memory for est_gpu_mem_min + reserve.
const NO_MEMORY: &str = "gpu_memory";

/// Starts the admission server with `--max-requests 1`, drops free memory to 3499 MB (one
/// short of est_gpu_mem_min + reserve), sends one request and waits until the master has
/// reaped the worker that served it. Returns the server, the workers before, the retired
/// pid and the master's `worker_exited` event for it.
fn retire_one_short_of_memory(sim: &mut Sim) -> (Server, Vec<u32>, u32, Event) {
    let s = sim.start(&["--production", "--max-requests", "1"], &[]);
    let before = s.wait_workers(2);
    sim.set_free(0, 3499);
    let r = s.post("/", MLP_INPUT);
    assert_eq!(r.status, 200, "{r:?}");
    let gone = r.pid();
    let exited = s.wait_event("worker_exited", |e| e.u64("pid") == Some(gone.into()));
    assert_eq!(exited.str("reason"), Some("max_requests"), "{exited:?}");
    (s, before, gone, exited)
}

#[test]
fn a_recycled_worker_waits_for_gpu_memory_then_starts() {
    let mut sim = admission_sim();
    // The worker that served retires; its replacement is not started.
    let (s, before, gone, _) = retire_one_short_of_memory(&mut sim);
    // The master says why the slot waits (first, possibly, "no room until a retiring
    // worker exits"; once it has exited, the memory reason).
    wait_reason(&s, 0, NO_MEMORY);
    stays(&s, 1, 2, Duration::from_millis(1500));
    let survivor: Vec<u32> = before.iter().copied().filter(|p| *p != gone).collect();
    assert_eq!(worker_pids(s.pid()), survivor);
    // Memory back: the slot fills again, on the same GPU.
    sim.set_free(0, 40_960);
    let after = wait_ready(&s, 2, 3);
    assert_eq!(
        per_device(&after),
        BTreeMap::from([(sim.gpus.uuid_of(0), 2)])
    );
}

#[test]
fn ttin_waits_for_gpu_memory_then_more_is_refused() {
    let mut sim = admission_sim();
    let s = sim.start(&["--production", "--workers", "1"], &[]);
    s.wait_workers(1);
    sim.set_free(0, 3000);
    let mark = s.mark();
    s.signal(libc::SIGTTIN);
    let (_, ttin) = s.wait_event_after(mark, "ttin", |_| true);
    assert_eq!(ttin.u64("workers"), Some(2), "{ttin:?}");
    wait_reason(&s, mark, NO_MEMORY);
    stays(&s, 1, 1, Duration::from_millis(1000));
    sim.set_free(0, 30_000);
    let workers = wait_ready(&s, 2, 2);
    assert_eq!(
        per_device(&workers),
        BTreeMap::from([(sim.gpus.uuid_of(0), 2)])
    );
    // (g) The GPU is full by the plan (fits 2): one more is refused with a warning.
    s.signal(libc::SIGTTIN);
    let refused = s.wait_event("ttin_refused", |_| true);
    assert_eq!(refused.level, "WARN", "{refused:?}");
    assert_eq!(refused.u64("workers"), Some(2), "{refused:?}");
    stays(&s, 2, 2, Duration::from_millis(800));
}

// ---------------------------------------------------------------------------------------
// (g) TTIN beyond what fits.

#[test]
fn ttin_beyond_the_gpus_is_refused_with_a_warning() {
    // Two GPUs, fits [2, 1]: the plan starts 3 and that is all the memory allows.
    let gpus = SimGpus::new(vec![SimGpu::a100_40gb(), SimGpu::rtx_4090()]);
    let sim = Sim::new(gpus, &meta(1000, 15000));
    let s = sim.start(&["--production"], &[]);
    s.wait_workers(3);
    s.signal(libc::SIGTTIN);
    let refused = s.wait_event("ttin_refused", |_| true);
    assert_eq!(refused.level, "WARN", "{refused:?}");
    assert_eq!(refused.u64("workers"), Some(3), "{refused:?}");
    stays(&s, 3, 3, Duration::from_millis(800));
    // One fewer, then one more fits again.
    s.signal(libc::SIGTTOU);
    s.wait_workers(2);
    s.signal(libc::SIGTTIN);
    let workers = wait_ready(&s, 3, 4);
    assert_eq!(
        per_device(&workers),
        BTreeMap::from([(sim.gpus.uuid_of(0), 2), (sim.gpus.uuid_of(1), 1)])
    );
}

// ---------------------------------------------------------------------------------------
// (h) an explicit NVML library that does not load.

#[test]
fn an_explicit_nvml_library_that_does_not_load_exits_2() {
    let sim = Sim::new(SimGpus::new(vec![SimGpu::a100_40gb()]), &meta(1000, 5000));
    let not_a_lib = sim.app.dir.path().join("libnvidia-ml.so.1");
    std::fs::write(&not_a_lib, "not a shared library").unwrap();
    let missing = "/nonexistent/libnvidia-ml.so.1".to_string();
    let not_a_lib = not_a_lib.display().to_string();
    for (lib, why) in [
        (missing.as_str(), "no such file"),
        (not_a_lib.as_str(), "cannot be loaded"),
    ] {
        for mode in ["--production", "plan"] {
            let mut s = Server::spawn(
                &sim.app,
                &[mode, "--nvml-library", lib],
                &[(nvml_sim::ENV_FILE, &sim.file.display().to_string())],
            );
            let st = s.wait_exit(PATIENCE);
            let log = s.log_text();
            assert_eq!(st.code(), Some(2), "{mode} {lib}: {log}");
            assert_eq!(log.trim().lines().count(), 1, "{log}");
            for want in ["app: ", "--nvml-library", lib, why] {
                assert!(log.contains(want), "no {want:?} in {log}");
            }
            assert!(!log.contains("listening"), "{log}");
        }
    }
    // A real NVML whose initialisation fails (driver not loaded) is as fatal when named.
    let mut broken = SimGpus::new(vec![SimGpu::a100_40gb()]);
    broken.init_error = Some(9);
    let sim = Sim::new(broken, &meta(1000, 5000));
    let mut s = sim.spawn(&["--production"], &[]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(2));
    let log = s.log_text();
    assert!(log.contains("the NVIDIA driver is not loaded"), "{log}");
    assert!(!log.contains("listening"), "{log}");
}

/// The reason a slot waits is logged when it changes, not up to 10 s later (the repeat
/// interval of one reason). Timed by the master's own event timestamps, so a busy machine
/// delays the test's reading, not the measure.
#[test]
fn the_wait_reason_is_logged_when_it_changes() {
    let mut sim = admission_sim();
    let (s, _, _, exited) = retire_one_short_of_memory(&mut sim);
    // The old worker has exited: from now on memory alone keeps the slot empty.
    let waits = wait_reason(&s, 0, NO_MEMORY);
    let after = waits.secs() - exited.secs();
    assert!(
        (0.0..5.0).contains(&after),
        "the memory reason came {after:.3} s after the exit:\n{}",
        s.log_text()
    );
}

/// `--workers` above what fits at start: a warning, and the extra slot waits while no GPU
/// has the memory for a typical worker (as NVML reports once the first worker has booted);
/// once one has, it starts there.
#[test]
fn workers_override_above_what_fits_waits_for_memory_then_starts() {
    let mut sim = Sim::new(
        SimGpus::new(vec![SimGpu::a100_40gb().free_mb(20_000)]),
        &meta(3000, 15000),
    );
    assert_eq!(Rule::new(3000, 15000).fits(&sim.gpus), vec![1]);
    let p = sim.plan(&["--workers", "2"]);
    assert_eq!(mb(&p["workers"]), 2, "{p:#}");
    assert_eq!(p["unplaced"], serde_json::json!([1]), "{p:#}");
    // The plan is made with 20000 MB free; then, while the master profiles a worker (before
    // it starts the pool), NVML starts saying what it would once the first worker holds its
    // ~15000 MB. (The profile itself measures nothing here and falls back to the estimate.)
    let s = sim.spawn(
        &["--production", "--workers", "2", "--profile-memory", "on"],
        &[],
    );
    s.wait_event("memory_profiling", |_| true);
    sim.set_free(0, 5_000);
    let warning = s.wait_event("plan_warning", |e| {
        e.message().contains("asks for 2 workers but only 1 fit")
    });
    assert_eq!(warning.level, "WARN", "{warning:?}");
    let waits = s.wait_event("worker_waits", |e| e.str("why") == Some("unplaced"));
    assert_eq!(waits.u64("slot"), Some(1), "{waits:?}");
    // Two wanted, one ready, nothing booting.
    s.wait_pool(|p| {
        p.u64("workers") == Some(2) && p.u64("ready") == Some(1) && p.u64("booting") == Some(0)
    });
    stays(&s, 1, 1, Duration::from_millis(800));
    sim.set_free(0, 40_000);
    let placed = s.wait_event("worker_placed", |_| true);
    assert_eq!(placed.u64("gpu"), Some(0), "{placed:?}");
    let workers = wait_ready(&s, 2, 2);
    let uuid = sim.gpus.uuid_of(0);
    for w in workers {
        assert_eq!(environ(w)["CUDA_VISIBLE_DEVICES"], uuid);
    }
}

// ---------------------------------------------------------------------------------------
// The GPU path against a faithful NVML: each test fails on the code before it.

/// `app --production` without `--simulated-gpus` (the worker really finds no CUDA here).
fn spawn_unsimulated(sim: &Sim, args: &[&str], env: &[(&str, &str)]) -> Server {
    let lib = lib();
    let file = sim.file.display().to_string();
    let mut a = vec!["--nvml-library", lib.as_str()];
    a.extend_from_slice(args);
    let mut e = vec![(nvml_sim::ENV_FILE, file.as_str())];
    e.extend_from_slice(env);
    Server::spawn(&sim.app, &a, &e)
}

/// Item 1: a worker the plan placed on a GPU that comes up without CUDA is not left
/// serving on the CPU: the master stops, exit 5, naming the GPU and the CUDA versions.
#[test]
fn a_worker_placed_on_a_gpu_without_cuda_stops_the_server() {
    let sim = Sim::new(SimGpus::new(vec![SimGpu::a100_40gb()]), &meta(1000, 15000));
    let mut s = spawn_unsimulated(&sim, &["--production"], &[]);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(5), "{log}");
    for want in [
        "was placed on GPU 0 but libtorch sees no CUDA device there",
        "this worker must run on a GPU, but libtorch sees no CUDA device",
        "the driver supports CUDA 13.0, the worker's libtorch needs CUDA 13.0",
        "--device cpu",
    ] {
        assert!(log.contains(want), "missing {want:?} in:\n{log}");
    }
    // With the flag, the same machine serves, and each worker says where it really runs.
    let s = sim.start(&["--production", "--workers", "1"], &[]);
    let e = s.wait_event("worker_ready", |_| true);
    assert_eq!(e.str("device"), Some("cpu (simulated GPU)"), "{e:?}");
}

/// Item 1: a driver whose CUDA version is older than the build's is refused by the plan,
/// naming both versions; `app plan` shows them when they agree.
#[test]
fn a_driver_too_old_for_the_build_is_refused_before_any_worker_starts() {
    let old = SimGpus::new(vec![SimGpu::a100_40gb()])
        .driver("550.54.15")
        .cuda_driver_version(12040);
    let sim = Sim::new(old, &meta(1000, 15000));
    // `app plan` shows the plan with the warning; `app` refuses to start.
    for (mode, code) in [(&["plan"][..], 0), (&["--production"][..], 2)] {
        let mut s = sim.spawn(mode, &[]);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(code), "{mode:?}: {log}");
        assert!(
            log.contains("the NVIDIA driver (550.54.15) supports CUDA up to 12.4, but the worker's libtorch is built with CUDA 13.0"),
            "{mode:?}: {log}"
        );
        assert!(log.contains("580 or newer"), "{log}");
    }
    // --device cpu needs no GPU driver.
    let t = sim.plan_text(&["--device", "cpu"]);
    assert!(t.contains("worker(s) on cpu"), "{t}");
    let ok = Sim::new(
        SimGpus::new(vec![SimGpu::a100_40gb()]).driver("580.65.06"),
        &meta(1000, 15000),
    );
    let t = ok.plan_text(&[]);
    assert!(
        t.contains(
            "driver                580.65.06 (CUDA 13.0); worker built for CUDA 13.0 (driver 580+)"
        ),
        "{t}"
    );
}

/// Item 7: compute modes. Exclusive-process GPUs take one worker, prohibited ones none, and
/// the plan says why.
#[test]
fn compute_modes_limit_the_workers_per_gpu() {
    use nvml_sim::SimComputeMode;
    let gpus = SimGpus::new(vec![
        SimGpu::a100_40gb().compute_mode(SimComputeMode::ExclusiveProcess),
        SimGpu::a100_40gb().compute_mode(SimComputeMode::Prohibited),
        SimGpu::a100_40gb(),
    ]);
    let sim = Sim::new(gpus, &meta(1000, 5000));
    let p = sim.plan(&[]);
    let fits: Vec<u64> = p["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| mb(&g["fits"]))
        .collect();
    let open = Rule::new(1000, 5000).gpu(&sim.gpus.gpus[2]).fits;
    assert_eq!(fits, vec![1, 0, u64::from(open)], "{p:#}");
    assert_eq!(p["gpus"][0]["compute_mode"], "exclusive_process");
    assert!(p["gpus"][1]["excluded"]
        .as_str()
        .unwrap()
        .contains("compute mode prohibited"));
    let t = sim.plan_text(&[]);
    assert!(
        t.contains("GPU 0 is in exclusive_process compute mode: at most one worker"),
        "{t}"
    );
    assert!(
        t.contains("GPU 1 is in prohibited compute mode: no worker"),
        "{t}"
    );
    assert!(t.contains("compute mode prohibited"), "{t}");
}

/// Item 8: MIG. A GPU in MIG mode is planned per instance, each worker pinned to its
/// instance by its MIG UUID, with the instance's own memory and cap.
#[test]
fn mig_instances_are_planned_and_served_one_worker_set_each() {
    use nvml_sim::{SimMig, SimMigInstance};
    let a = "MIG-4b7a1a0e-0000-5000-8000-000000000001";
    let b = "MIG-4b7a1a0e-0000-5000-8000-000000000002";
    let mig = SimGpu::a100_40gb().mig(
        SimMig::enabled()
            .instance(SimMigInstance::a100_3g_20gb(a, 1))
            .empty_slot()
            .instance(SimMigInstance::a100_1g_5gb(b, 2)),
    );
    let sim = Sim::new(
        SimGpus::new(vec![mig, SimGpu::rtx_4090()]),
        &meta(1000, 4000),
    );
    let p = sim.plan(&[]);
    let gpus = p["gpus"].as_array().unwrap();
    let labels: Vec<&str> = gpus.iter().map(|g| g["label"].as_str().unwrap()).collect();
    // The whole GPU in MIG mode is no device; its instances are (slot 1 is empty).
    assert_eq!(labels, vec!["GPU 1", "GPU 0 MIG 0", "GPU 0 MIG 2"], "{p:#}");
    // 3g.20gb: 19968 MB × 0.84 = 16773 − 500 = 16273 usable → 4 of 4000; 1g.5gb: 4864 ×
    // 0.84 = 4085 − 500 = 3585 < 4000 → none.
    assert_eq!(mb(&gpus[1]["total_mb"]), 19968);
    assert_eq!(mb(&gpus[1]["usable_mb"]), 16273);
    assert_eq!(mb(&gpus[1]["fits"]), 4);
    assert_eq!(mb(&gpus[1]["cap_mb"]), 4000 - CONTEXT_MB);
    assert_eq!(mb(&gpus[2]["fits"]), 0);
    assert_eq!(gpus[1]["uuid"], a);
    assert_eq!(gpus[1]["mig"]["parent"], 0);
    let t = sim.plan_text(&[]);
    assert!(t.contains(&format!("-> GPU 0 MIG 0 ({a})")), "{t}");

    // Served: the workers on the instance see exactly it.
    let s = sim.start(&["--production", "--workers", "6"], &[]);
    let workers = s.wait_workers(6);
    let on: BTreeMap<String, u32> = per_device(&workers);
    let rtx_fits = Rule::new(1000, 4000).gpu(&sim.gpus.gpus[1]).fits;
    assert_eq!(
        on.get(a).copied().unwrap_or(0) + on.get(&sim.gpus.uuid_of(1)).copied().unwrap_or(0),
        6
    );
    assert!(
        on.get(a).copied().unwrap_or(0) >= 6u32.saturating_sub(rtx_fits),
        "{on:?}"
    );
    assert!(!on.contains_key(b), "{on:?}");
    for w in &workers {
        let cfg = worker_config(*w);
        if cfg["gpu"]["uuid"] == a {
            assert_eq!(cfg["gpu"]["mig"]["parent"], 0, "{cfg}");
            assert_eq!(cfg["gpu"]["mig"]["slot"], 0, "{cfg}");
        }
    }
    let r = s.post("/?hwFetch=true", MLP_INPUT);
    assert_eq!(r.status, 200, "{r:?}");
}

/// Item 9: the operator's CUDA_VISIBLE_DEVICES limits the GPUs planned, by index or UUID,
/// and workers still get their own GPU's UUID.
#[test]
fn the_operators_cuda_visible_devices_limits_the_gpus() {
    let gpus = SimGpus::new(vec![
        SimGpu::a100_40gb(),
        SimGpu::a100_40gb(),
        SimGpu::rtx_4090(),
    ]);
    let sim = Sim::new(gpus, &meta(1000, 15000));
    let second = sim.gpus.uuid_of(1);
    for spec in ["1", second.as_str()] {
        let mut s = sim.spawn(&["plan", "--json"], &[("CUDA_VISIBLE_DEVICES", spec)]);
        assert_eq!(s.wait_exit(PATIENCE).code(), Some(0));
        let log = s.log_text();
        let p: Value = serde_json::from_str(&log[log.find('{').unwrap()..]).unwrap();
        let idx: Vec<u64> = p["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| mb(&g["index"]))
            .collect();
        assert_eq!(idx, vec![1], "CUDA_VISIBLE_DEVICES={spec}: {p:#}");
        assert!(
            p["gpu_note"]
                .as_str()
                .unwrap()
                .contains("leaves out GPU 0, GPU 2"),
            "{p:#}"
        );
    }
    let s = sim.start(&["--production"], &[("CUDA_VISIBLE_DEVICES", "2,0")]);
    let fits = Rule::new(1000, 15000).fits(&sim.gpus);
    let n = (fits[0] + fits[2]).min(cpu_bound());
    let workers = s.wait_workers(n as usize);
    let on = per_device(&workers);
    assert!(!on.contains_key(&second), "GPU 1 was not allowed: {on:?}");
    assert_eq!(on.values().sum::<u32>(), n);
    // An entry naming no GPU ends the list, as in CUDA: here nothing is left, so the app
    // that expects a GPU is planned on the CPU, loudly.
    let mut s = sim.spawn(&["plan"], &[("CUDA_VISIBLE_DEVICES", "7,1")]);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(0), "{log}");
    assert!(log.contains("'7' names no GPU"), "{log}");
    assert!(log.contains("worker(s) on cpu"), "{log}");
}

/// GPUs visible but no `est_gpu_mem_typ` (forgotten, or misspelt before that was
/// refused): the production log warns that every worker runs on the CPU and says what to set.
#[test]
fn gpus_visible_but_no_estimate_warns_at_production_start() {
    let sim = Sim::new(
        SimGpus::new(vec![SimGpu::a100_40gb()]),
        r#""est_gpu_mem_min": 0"#,
    );
    let s = sim.start(&["--production", "--workers", "1"], &[]);
    let w = s.wait_workers(1);
    let warn = s.wait_event("plan_warning", |e| e.message().contains("GPU(s) visible"));
    assert_eq!(warn.level, "WARN", "{warn:?}");
    for want in [
        "declares no est_gpu_mem_typ",
        "every worker runs on the CPU",
        "--device cpu",
    ] {
        assert!(warn.message().contains(want), "{want}: {warn:?}");
    }
    assert_eq!(visible_devices(w[0]).as_deref(), Some(""));
}

/// An H100 in exclusive-process mode whose MPS server (pid 4242, 300 MB) runs on it: the
/// GPU the MPS tests plan on.
fn exclusive_h100_under_mps() -> SimGpu {
    SimGpu::h100_80gb()
        .compute_mode(nvml_sim::SimComputeMode::ExclusiveProcess)
        .mps(4_242, 300)
}

/// MPS is detected by its control daemon's socket (where
/// `CUDA_MPS_PIPE_DIRECTORY` says), not assumed: with it, an exclusive-process GPU (its MPS
/// server the one process there) is planned as a shared one, each worker with its share as
/// its MPS memory limit; `--mps off`, or no daemon, plans one worker.
#[test]
fn mps_is_detected_and_an_exclusive_gpu_then_takes_as_many_as_a_shared_one() {
    use nvml_sim::MpsDaemon;
    let daemon = MpsDaemon::start();
    let pipe = daemon.pipe_dir();
    let h100 = exclusive_h100_under_mps();
    let sim = Sim::new(SimGpus::new(vec![h100]), &meta(1000, 5000));
    let shared = Rule::new(1000, 5000).gpu(&SimGpu::h100_80gb());
    let p = sim.plan_env(&[], &[("CUDA_MPS_PIPE_DIRECTORY", &pipe)]);
    let g = &p["gpus"][0];
    assert_eq!(g["compute_mode"], "exclusive_process", "{p:#}");
    assert_eq!(g["mps"], true, "{p:#}");
    assert_eq!(mb(&g["fits"]), u64::from(shared.fits), "{p:#}");
    assert_eq!(
        mb(&p["workers"]),
        u64::from(shared.fits.min(cpu_bound())),
        "{p:#}"
    );
    assert_eq!(mb(&g["mps_limit_mb"]), shared.per_worker_mb, "{p:#}");
    assert_eq!(mb(&g["cap_mb"]), cap_mb(&shared), "{p:#}");
    for (args, env) in [
        (
            &["--mps", "off"][..],
            &[("CUDA_MPS_PIPE_DIRECTORY", pipe.as_str())][..],
        ),
        (
            &[][..],
            &[("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/nvidia-mps")][..],
        ),
    ] {
        let p = sim.plan_env(args, env);
        assert_eq!(mb(&p["gpus"][0]["fits"]), 1, "{args:?} {env:?}: {p:#}");
        assert_eq!(p["gpus"][0]["mps"], false, "{p:#}");
        assert!(p["gpus"][0]["mps_limit_mb"].is_null(), "{p:#}");
    }
    // `--mps on` assumes it.
    let p = sim.plan_env(
        &["--mps", "on"],
        &[("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent")],
    );
    assert_eq!(mb(&p["gpus"][0]["fits"]), u64::from(shared.fits), "{p:#}");
}

/// A MIG GPU instance split into two compute instances (two MIG devices
/// reporting the same memory) is planned once: the workers its memory holds, divided
/// between them — not twice that.
#[test]
fn two_compute_instances_of_one_gpu_instance_are_planned_on_its_memory_once() {
    use nvml_sim::{SimMig, SimMigInstance};
    let ci = |uuid: &str, ci: u32| {
        SimMigInstance::new("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", uuid, 19_968, 1, ci)
    };
    let sim = Sim::new(
        SimGpus::new(vec![SimGpu::a100_40gb().mig(
            SimMig::enabled()
                .instance(ci("MIG-ci-a", 0))
                .instance(ci("MIG-ci-b", 1)),
        )]),
        &meta(1000, 5000),
    );
    let p = sim.plan(&[]);
    let gpus = p["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2, "{p:#}");
    // 19,968 MB < 20 GiB: fraction 0.84, usable floor(19968 × 0.84) − 500 = 16,273.
    let usable = 16_273;
    assert_eq!(mb(&gpus[0]["usable_mb"]), usable, "{p:#}");
    let all = usable / 5000;
    let fits: Vec<u64> = gpus.iter().map(|g| mb(&g["fits"])).collect();
    assert_eq!(fits.iter().sum::<u64>(), all, "{p:#}");
    assert_eq!(fits, vec![all.div_ceil(2), all / 2], "{p:#}");
    assert_eq!(mb(&p["gpu_bound"]), all, "{p:#}");
    for g in gpus {
        assert_eq!(g["gpu_instance"], 1, "{p:#}");
        assert_eq!(mb(&g["cap_mb"]), 5000 - CONTEXT_MB, "{p:#}");
    }
}

/// Serving under MPS. Each worker gets its share as
/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`; its footprint is read from NVML's MPS list (the
/// compute list shows only the MPS server); and a fatal CUDA error of one worker — which
/// MPS delivers to every client of the GPU — retires the GPU's other workers too, none
/// starting there until all are gone.
#[test]
fn under_mps_workers_are_limited_measured_and_retired_together() {
    use nvml_sim::MpsDaemon;
    let daemon = MpsDaemon::start();
    let pipe = daemon.pipe_dir();
    let uuid = format!("GPU-mps-{}-0000-0000-000000000000", std::process::id());
    let gpu = exclusive_h100_under_mps().uuid(&uuid).workers_use(1_500);
    let app = App::new(
        "cudaerr.pt",
        &format!(r#""input": {{"shape": [-1, 4]}}, {}"#, meta(1000, 5000)),
    );
    let file = app.dir.path().join("gpus.json");
    SimGpus::new(vec![gpu]).write(&file);
    let (lib, file) = (lib(), file.display().to_string());
    let s = Server::start_env(
        &app,
        &[
            "--nvml-library",
            &lib,
            "--simulated-gpus",
            "--production",
            "--workers",
            "3",
            "--profile-memory",
            "off",
            // the share, stated (under MPS with no per-client limit it must be)
            "--gpu-memory-utilization",
            "0.95",
        ],
        &[
            (nvml_sim::ENV_FILE, file.as_str()),
            ("CUDA_MPS_PIPE_DIRECTORY", pipe.as_str()),
        ],
    );
    assert!(
        !s.events_named("mps_detected").is_empty(),
        "{}",
        s.log_text()
    );
    let old = s.wait_workers(3);
    // Its share: the figure per worker, what the ledger reserves for it.
    let share = Rule::new(1000, 5000).gpu(&SimGpu::h100_80gb());
    for w in &old {
        assert_eq!(
            environ(*w)
                .get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
                .map(String::as_str),
            Some(format!("0={}MB", share.per_worker_mb).as_str()),
            "worker {w}"
        );
        // Item 8: what --max-worker-gpu-mb adds to the allocator's bytes until NVML shows
        // the worker's own context.
        assert_eq!(
            worker_config(*w)["gpu_context_mb"],
            CONTEXT_MB,
            "worker {w}"
        );
    }
    // The workers are only in the MPS list: their footprint is found there.
    s.wait_event("footprint_observed", |e| e.u64("observed_mb") == Some(1500));
    // One worker's fatal CUDA error.
    let mark = s.mark();
    let r = s.post("/", r#"{"inputs": [[666, 0, 0, 0]]}"#);
    assert_eq!(r.json()["type"], "cuda_error", "{r:?}");
    let faulted = r.pid();
    let (at, fault) = s.wait_event_after(mark, "mps_fault", |_| true);
    assert_eq!(fault.u64("pid"), Some(faulted.into()), "{fault:?}");
    assert_eq!(fault.u64("workers"), Some(2), "{fault:?}");
    for w in old.iter().filter(|w| **w != faulted) {
        let e = s
            .wait_event_after(at, "worker_retire_asked", |e| {
                e.u64("pid") == Some((*w).into())
            })
            .1;
        assert_eq!(e.str("why"), Some("mps_fault"), "{e:?}");
    }
    let new = s.wait_workers_where(3, |p| p.iter().all(|w| !old.contains(w)));
    // No replacement started before every old worker had exited.
    let events = s.events();
    let last_exit = events
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            e.name == "worker_exited" && e.u64("pid").is_some_and(|p| old.contains(&(p as u32)))
        })
        .map(|(i, _)| i)
        .max()
        .unwrap();
    let first_start = events
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            e.name == "worker_started" && e.u64("pid").is_some_and(|p| new.contains(&(p as u32)))
        })
        .map(|(i, _)| i)
        .min()
        .unwrap();
    assert!(last_exit < first_start, "{}", s.log_text());
    let r = s.post("/", r#"{"inputs": [[1, 2, 3, 4]]}"#);
    assert_eq!(r.status, 200, "{r:?}");
}

/// Under MPS the per-client limit the server inherits
/// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, the pod's share where the device plugin shares the
/// GPU through MPS) bounds the plan: usable memory is at most the limit, each worker's own
/// limit is its part of it, and a worker bigger than a client may be is refused (exit 2)
/// naming both figures.
#[test]
fn under_mps_the_inherited_client_limit_bounds_the_plan() {
    use nvml_sim::MpsDaemon;
    let daemon = MpsDaemon::start();
    let pipe = daemon.pipe_dir();
    let h100 = exclusive_h100_under_mps();
    let sim = Sim::new(SimGpus::new(vec![h100]), &meta(1000, 5000));
    let env = |limit: &'static str| {
        [
            ("CUDA_MPS_PIPE_DIRECTORY", pipe.clone()),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limit.to_string()),
        ]
    };
    let e = env("0=16G");
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let p = sim.plan_env(&[], &e);
    let g = &p["gpus"][0];
    assert_eq!(mb(&g["usable_mb"]), 16_384, "{p:#}");
    assert_eq!(mb(&g["mps_client_limit_mb"]), 16_384, "{p:#}");
    assert_eq!(mb(&g["fits"]), 3, "{p:#}");
    assert_eq!(mb(&g["mps_limit_mb"]), 5000, "the figure per worker: {p:#}");
    let warned = p["warnings"].as_array().unwrap();
    assert!(
        warned
            .iter()
            .any(|w| w.as_str().unwrap().contains("per-client limit of 16384 MB")),
        "{p:#}"
    );
    // A worker bigger than one client may be: refused before any worker starts.
    let e = env("4G");
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut s = sim.spawn(&["--production"], &e);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(2), "{log}");
    for want in [
        "needs 5000 MB",
        "only 4096 MB",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ] {
        assert!(log.contains(want), "{want}: {log}");
    }
    // A value MPS would not read is refused, naming the variable.
    let e = env("lots");
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut s = sim.spawn(&["plan"], &e);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(2), "{}", s.log_text());
    assert!(
        s.log_text().contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        "{}",
        s.log_text()
    );
}

/// The profiling worker under MPS runs with the GPU's whole usable memory
/// as its per-client limit, not the estimate's share, so a model bigger than its estimate
/// can be measured.
#[test]
fn under_mps_the_profiling_worker_is_limited_to_the_usable_memory_only() {
    use nvml_sim::MpsDaemon;
    let daemon = MpsDaemon::start();
    let pipe = daemon.pipe_dir();
    let gpu = exclusive_h100_under_mps().workers_use(1_500);
    let sim = Sim::new(SimGpus::new(vec![gpu]), &meta(1000, 5000));
    let s = sim.start(
        &[
            "--production",
            "--workers",
            "1",
            "--profile-memory",
            "on",
            "--gpu-memory-utilization",
            "0.95",
        ],
        &[("CUDA_MPS_PIPE_DIRECTORY", pipe.as_str())],
    );
    let e = s.wait_event("memory_profiling", |_| true);
    let usable = Rule::new(1000, 5000).gpu(&SimGpu::h100_80gb()).usable_mb;
    assert_eq!(e.u64("mps_limit_mb"), Some(usable), "{e:?}");
    s.wait_workers(1);
}

/// The MPS daemon found at start is looked for again (at once when a
/// worker on an MPS GPU dies): gone, no worker starts on the exclusive-process GPU (it
/// would crash at boot again and again); back, the workers start again.
#[test]
fn under_mps_a_daemon_that_goes_away_stops_starts_until_it_is_back() {
    use nvml_sim::MpsDaemon;
    let mut daemon = MpsDaemon::start();
    let pipe = daemon.pipe_dir();
    let gpu = exclusive_h100_under_mps();
    let sim = Sim::new(SimGpus::new(vec![gpu]), &meta(1000, 5000));
    let s = sim.start(
        &[
            "--production",
            "--workers",
            "2",
            "--profile-memory",
            "off",
            "--gpu-memory-utilization",
            "0.95",
        ],
        &[("CUDA_MPS_PIPE_DIRECTORY", pipe.as_str())],
    );
    let old = s.wait_workers(2);
    daemon.stop();
    let mark = s.mark();
    // SAFETY: kill(2) on a worker of the server this test started.
    unsafe { libc::kill(old[0] as i32, libc::SIGKILL) };
    let (lost_at, lost) = s.wait_event_after(mark, "mps_daemon_lost", |_| true);
    assert_eq!(lost.level, "ERROR", "{lost:?}");
    for want in ["GPU 0", "nvidia-cuda-mps-control -d", "--mps off"] {
        assert!(lost.message().contains(want), "{want}: {lost:?}");
    }
    daemon.restart();
    let (back_at, _) = s.wait_event_after(lost_at, "mps_daemon_back", |_| true);
    let now = s.wait_workers_where(2, |p| !p.contains(&old[0]));
    // No worker started while the daemon was gone.
    let events = s.events();
    let started_between = events[lost_at..back_at]
        .iter()
        .filter(|e| e.name == "worker_started")
        .count();
    assert_eq!(started_between, 0, "{}", s.log_text());
    assert_eq!(now.len(), 2);
}

/// Operator settings that would defeat the cap in silence.
/// `PYTORCH_NO_CUDA_MEMORY_CACHING=1` (no caching allocator: no cap, no statistics) is
/// refused with a message naming it, unless the workers run on the CPU; an operator's
/// `per_process_memory_fraction` below the plan's cap lowers the cap, instead of being
/// overridden by it; one torch would refuse is refused, naming the variable.
#[test]
fn allocator_settings_that_defeat_the_cap_are_refused_or_honoured() {
    let sim = Sim::new(SimGpus::new(vec![SimGpu::a100_40gb()]), &meta(1000, 5000));
    let uncached = [("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")];
    let mut s = sim.spawn(&["--production"], &uncached);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(
        log.contains(
            "app: PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns PyTorch's CUDA caching allocator off"
        ),
        "{log}"
    );
    assert!(!log.contains("listening"), "{log}");
    let s = sim.start(
        &["--production", "--device", "cpu", "--workers", "1"],
        &uncached,
    );
    s.wait_workers(1);
    drop(s);
    // torch's own "0" (and anything but "1") keeps the caching allocator.
    let p = sim.plan_env(&[], &[("PYTORCH_NO_CUDA_MEMORY_CACHING", "0")]);
    assert!(p["uncached_allocator"].is_null(), "{p:#}");

    let plain = sim.plan(&[]);
    let cap = mb(&plain["gpus"][0]["cap_mb"]);
    let lower = (40_960.0 * 0.05_f64).floor() as u64;
    assert!(lower < cap, "{plain:#}");
    for var in ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"] {
        let conf = "expandable_segments:True,per_process_memory_fraction:0.05";
        let p = sim.plan_env(&[], &[(var, conf)]);
        assert_eq!(mb(&p["gpus"][0]["cap_mb"]), lower, "{var}: {p:#}");
        assert_eq!(p["gpus"][0]["memory_fraction"], 0.05, "{var}: {p:#}");
    }
    // Above the plan's cap it changes nothing.
    let p = sim.plan_env(
        &[],
        &[("PYTORCH_ALLOC_CONF", "per_process_memory_fraction:0.9")],
    );
    assert_eq!(mb(&p["gpus"][0]["cap_mb"]), cap, "{p:#}");
    let mut s = sim.spawn(
        &["plan"],
        &[("PYTORCH_ALLOC_CONF", "per_process_memory_fraction:1.5")],
    );
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(
        log.contains("PYTORCH_ALLOC_CONF=per_process_memory_fraction:1.5: per_process_memory_fraction '1.5' is not a fraction from 0 to 1"),
        "{log}"
    );
}

/// `--max-worker-gpu-mb` means what `nvidia-smi` shows of a worker, its
/// CUDA context included, so each GPU worker is told the plan's context figure to add to
/// its allocator's bytes (until NVML shows its own); before, it compared the allocator's
/// bytes alone and recycled about a context late.
#[test]
fn max_worker_gpu_mb_counts_the_context_each_worker_is_told() {
    let sim = Sim::new(SimGpus::new(vec![SimGpu::a100_40gb()]), &meta(1000, 5000));
    let p = sim.plan(&[]);
    assert_eq!(mb(&p["cuda_context_mb"]), CONTEXT_MB, "{p:#}");
    let s = sim.start(
        &[
            "--production",
            "--workers",
            "2",
            "--max-worker-gpu-mb",
            "3000",
        ],
        &[],
    );
    for w in s.wait_workers(2) {
        let cfg = worker_config(w);
        assert_eq!(mb(&cfg["max_worker_gpu_mb"]), 3000, "worker {w}: {cfg}");
        assert_eq!(
            cfg["gpu_context_mb"], CONTEXT_MB,
            "worker {w}: the context it adds to its allocator's bytes: {cfg}"
        );
    }
}

/// With every worker on a GPU there is no template, so no warm-up pass was
/// measured at start. The first worker's own warm-up (it declares its input) measures
/// its host memory before the others start, and the plan takes the host-memory bound from
/// it: no request is needed.
#[test]
fn workers_on_gpus_bound_host_memory_by_the_first_workers_own_warm_up() {
    let gpus = SimGpus::new(vec![SimGpu::a100_40gb()]);
    let sim = Sim::new(gpus, &meta(1000, 4000));
    let cg = sim.app.dir.path().join("cgroup");
    std::fs::create_dir_all(&cg).unwrap();
    for (name, text) in [
        ("memory.max", format!("{}", 8000u64 << 20)),
        ("memory.current", format!("{}", 100u64 << 20)),
        ("memory.stat", "anon 0\nfile 0\ninactive_file 0\n".into()),
        ("memory.events", "oom_kill 0\n".into()),
    ] {
        std::fs::write(cg.join(name), text + "\n").unwrap();
    }
    let s = sim.start(
        &["--production", "--memory-cgroup", cg.to_str().unwrap()],
        &[],
    );
    let unmeasured = s.wait_event("host_memory_unmeasured", |_| true);
    assert!(
        unmeasured.message().contains("without a template"),
        "{unmeasured:?}"
    );
    let e = s.wait_event("host_memory_planned", |_| true);
    assert!(e.str("source").unwrap().contains("worker 0 holds"), "{e:?}");
    let before = s.count_before("worker_started", "host_memory_planned");
    assert_eq!(before, 1, "one worker until it was measured");
    let n = Rule::new(1000, 4000).fits(&sim.gpus)[0].min(cpu_bound());
    let n = n.min(e.u64("bound").unwrap() as u32);
    s.wait_workers(n as usize);
    assert_eq!(s.post("/", MLP_INPUT).status, 200);
}
