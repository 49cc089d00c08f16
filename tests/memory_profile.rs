//! Planning from a measured footprint (`--profile-memory`, `app plan --measure`) on
//! simulated GPUs: the NVML stand-in reports every process placed on a GPU (its
//! `CUDA_VISIBLE_DEVICES` is the GPU's UUID) as using the memory the test scripts, which is
//! what a profiling worker's footprint is read from when its model runs on the CPU (as
//! here). Expected worker counts are computed from the documented rule:
//! `usable = min(floor(total × fraction), free) − reserve`, `fits = floor(usable / per
//! worker)`, workers = min(2 × cores + 1, fits), with per worker = `max(ceil(measured ×
//! headroom), est_gpu_mem_min)` after profiling, `est_gpu_mem_typ` without.

mod common;
use common::nvml_sim;

use common::*;
use nvml_sim::{SimGpu, SimGpus};
use serde_json::Value;

/// A Tesla T4 (15,360 MB): fraction 0.84, reserve 500 → usable 12,402 MB.
const T4_USABLE_MB: u64 = 12_902 - 500;

fn cpu_bound() -> u64 {
    2 * num_cpus::get().max(1) as u64 + 1
}

fn workers_for(per_worker_mb: u64) -> u64 {
    (T4_USABLE_MB / per_worker_mb).min(cpu_bound())
}

struct Sim {
    app: App,
    file: String,
}

/// Rewrites the simulated T4 with its workers now using `mb` each (the running server's
/// next NVML call sees it).
fn workers_now_use(sim: &Sim, mb: u64) {
    SimGpus::new(vec![SimGpu::t4().workers_use(mb)]).write(std::path::Path::new(&sim.file));
}

impl Sim {
    /// mlp.pt with the declared input `shape` and the estimate `min`/`typ`, on one T4 whose
    /// workers use `workers_use_mb` each.
    fn new(shape: &str, min: u64, typ: u64, workers_use_mb: Option<u64>) -> Sim {
        let app = App::new(
            "mlp.pt",
            &format!(
                r#""input": {{"shape": {shape}}}, "est_gpu_mem_min": {min}, "est_gpu_mem_typ": {typ}"#
            ),
        );
        let mut gpu = SimGpu::t4();
        if let Some(mb) = workers_use_mb {
            gpu = gpu.workers_use(mb);
        }
        let path = app.dir.path().join("gpus.json");
        SimGpus::new(vec![gpu]).write(&path);
        Sim {
            app,
            file: path.display().to_string(),
        }
    }

    fn args<'a>(&self, lib: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec!["--nvml-library", lib, "--simulated-gpus"];
        a.extend_from_slice(args);
        a
    }

    fn spawn(&self, args: &[&str]) -> Server {
        let lib = nvml_sim::mock_library().display().to_string();
        Server::spawn(
            &self.app,
            &self.args(&lib, args),
            &[(nvml_sim::ENV_FILE, self.file.as_str())],
        )
    }

    fn start(&self, args: &[&str]) -> Server {
        let lib = nvml_sim::mock_library().display().to_string();
        Server::start_env(
            &self.app,
            &self.args(&lib, args),
            &[(nvml_sim::ENV_FILE, self.file.as_str())],
        )
    }

    /// `app plan --measure` (plus `args`): its exit status and output.
    fn measure(&self, args: &[&str]) -> (Option<i32>, String) {
        let mut a = vec!["plan", "--measure"];
        a.extend_from_slice(args);
        let mut s = self.spawn(&a);
        let st = s.wait_exit(PATIENCE);
        (st.code(), s.log_text())
    }
}

/// The pretty-printed JSON document in `app plan --json` output (log lines are one-line JSON).
fn report(out: &str) -> Value {
    let start = out
        .find("\n{\n")
        .map(|i| i + 1)
        .or_else(|| out.starts_with("{\n").then_some(0))
        .unwrap_or_else(|| panic!("no report in:\n{out}"));
    serde_json::Deserializer::from_str(&out[start..])
        .into_iter::<Value>()
        .next()
        .unwrap()
        .unwrap_or_else(|e| panic!("bad JSON ({e}):\n{out}"))
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A footprint well under the estimate: `app plan --measure` reports it, the metadata values
/// to use, and a plan of more workers than the estimate gives.
#[test]
fn a_footprint_smaller_than_the_estimate_plans_more_workers() {
    let sim = Sim::new("[-1, 4]", 1000, 6000, Some(2000));
    let (code, out) = sim.measure(&["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let r = report(&out);
    assert_eq!(n(&r["measured"]["footprint_mb"]), 2000, "{r:#}");
    assert_eq!(n(&r["measured"]["nvml_process_bytes"]), 2000 << 20, "{r:#}");
    assert_eq!(n(&r["declared"]["est_gpu_mem_typ"]), 6000);
    // 2000 × 1.2 = 2400 MB per worker.
    assert_eq!(n(&r["planned_mb_per_worker"]), 2400);
    assert_eq!(n(&r["suggested_metadata"]["est_gpu_mem_min"]), 2000);
    assert_eq!(n(&r["suggested_metadata"]["est_gpu_mem_typ"]), 2400);
    assert_eq!(n(&r["estimate_workers"]), workers_for(6000));
    assert_eq!(n(&r["plan"]["workers"]), workers_for(2400), "{r:#}");
    assert!(workers_for(2400) > workers_for(6000));
    assert!(r["kept_estimate"].is_null());
    // The text form says the same in words.
    let (code, text) = sim.measure(&["--memory-headroom", "1.5"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("footprint             2000 MB on GPU 0"),
        "{text}"
    );
    assert!(
        text.contains("\"est_gpu_mem_min\": 2000, \"est_gpu_mem_typ\": 3000"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{} from the measurement ({} from the declared estimate)",
            workers_for(3000),
            workers_for(6000)
        )),
        "{text}"
    );
}

/// A footprint above the estimate: the production master profiles first, plans fewer
/// workers, caps each one's allocator from the measured figure, and serves.
#[test]
fn a_footprint_larger_than_the_estimate_plans_fewer_workers() {
    let sim = Sim::new("[-1, 4]", 500, 2000, Some(5000));
    let s = sim.start(&["--production", "--metrics-port", "0"]);
    let e = s.wait_event("memory_profiled", |_| true);
    assert_eq!(e.u64("measured_mb"), Some(5000), "{e:?}");
    assert_eq!(e.u64("planned_mb"), Some(6000), "{e:?}");
    assert_eq!(e.u64("declared_typ_mb"), Some(2000), "{e:?}");
    let want = workers_for(6000);
    assert_eq!(e.u64("estimate_workers"), Some(workers_for(2000)), "{e:?}");
    assert_eq!(e.u64("workers"), Some(want), "{e:?}");
    assert!(want < workers_for(2000));
    let pids = s.wait_workers(want as usize);
    // Each worker's allocator cap is the figure it is planned as (what the ledger reserves
    // for it) less its CUDA context (500 MB): 6000 − 500, shown as a share of the T4's
    // 15,360 MB.
    let cap_mb = 6000 - 500;
    let cap = ((cap_mb as f64 / 15_360.0) * 10_000.0).floor() / 10_000.0;
    for pid in &pids {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let cfg = env
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"VRAMFORK_WORKER_CONFIG="))
            .map(|v| serde_json::from_slice::<Value>(v).unwrap())
            .expect("a worker config");
        assert_eq!(cfg["gpu"]["memory_fraction"].as_f64(), Some(cap), "{cfg:#}");
        assert_eq!(cfg["gpu"]["cap_mb"].as_u64(), Some(cap_mb), "{cfg:#}");
        assert_eq!(cfg["profile"], false, "serving workers do not profile");
    }
    let r = s.post("/", r#"{"inputs": [[1, 2, 3, 4]]}"#);
    assert_eq!(r.status, 200, "{r:?}");
    // GET / shows the footprint beside the metadata's estimate.
    let meta = s.get("/").json();
    assert_eq!(
        meta["gpu_footprint_mb"],
        serde_json::json!({"declared": 2000, "measured": 5000, "planned": 6000}),
        "{meta:#}"
    );
    assert_eq!(
        meta["est_gpu_mem_typ"], 2000,
        "the metadata as written: {meta:#}"
    );
    // /metrics shows the declared, measured and planned footprints side by side, and (once
    // the master has read NVML for a serving worker) the observed one.
    let mport = s.wait_event("metrics_listening", |_| true);
    let mport: u16 = mport
        .str("addr")
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    let gauge = |text: &str, source: &str| -> Option<f64> {
        let key = format!("vramfork_worker_gpu_footprint_bytes{{source=\"{source}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
    };
    let text = s.poll("the observed footprint in /metrics", || {
        let text = http(mport, "GET", "/metrics", None).body;
        gauge(&text, "observed").map(|_| text)
    });
    let mb = |n: f64| n * (1u64 << 20) as f64;
    assert_eq!(gauge(&text, "declared"), Some(mb(2000.0)), "{text}");
    assert_eq!(gauge(&text, "measured"), Some(mb(5000.0)), "{text}");
    assert_eq!(gauge(&text, "planned"), Some(mb(6000.0)), "{text}");
    assert_eq!(gauge(&text, "observed"), Some(mb(5000.0)), "{text}");
}

/// A profiling pass that fails (its `profile_input` shape is not one the model takes) leaves
/// the estimate's plan in force, with a warning naming the reason; never zero workers. (The
/// warm-up runs at a shape the model takes: one it refuses stops the start there,
/// `tests/newcomer.rs`.)
#[test]
fn a_failed_profile_falls_back_to_the_estimate() {
    let sim = Sim::new("[-1, 4]", 500, 2000, Some(5000));
    sim.app.write_metadata(
        "mlp.pt",
        r#""input": {"shape": [-1, -1]}, "warmup_inputs": [1, 4], "profile_input": [1, 5], "est_gpu_mem_min": 500, "est_gpu_mem_typ": 2000"#,
    );
    let s = sim.start(&["--production"]);
    let e = s.wait_event("memory_profile_failed", |_| true);
    assert!(
        e.message().contains("the profiling pass failed")
            && e.message()
                .contains("planning from est_gpu_mem_typ (2000 MB) as declared"),
        "{e:?}"
    );
    s.wait_workers(workers_for(2000) as usize);
    assert!(s.events_named("memory_profiled").is_empty());
    // And `app plan --measure` says why it measured nothing, exit status 3.
    let (code, out) = sim.measure(&[]);
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains("app: cannot measure the model's GPU memory: the profiling pass failed"),
        "{out}"
    );
}

/// `--profile-memory off` plans from the estimate without starting a profiling worker; a
/// measured figure that fits no GPU keeps the estimate's plan.
#[test]
fn profiling_off_or_unfit_keeps_the_estimate() {
    let sim = Sim::new("[-1, 4]", 500, 2000, Some(5000));
    let s = sim.start(&["--production", "--profile-memory", "off"]);
    s.wait_workers(workers_for(2000) as usize);
    assert!(s.events_named("memory_profiling").is_empty());
    assert!(s.events_named("memory_profiled").is_empty());
    let meta = s.get("/").json();
    assert!(meta.get("gpu_footprint_mb").is_none(), "{meta:#}");
    drop(s);

    // 15,000 MB per worker fits no T4 (12,402 MB usable). (NVML never reports a process
    // using more than its GPU holds; a list that does is distrusted as a whole.)
    let big = Sim::new("[-1, 4]", 500, 2000, Some(15_000));
    let (code, out) = big.measure(&["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let r = report(&out);
    assert_eq!(n(&r["measured"]["footprint_mb"]), 15_000);
    assert!(
        r["kept_estimate"]
            .as_str()
            .is_some_and(|w| w.contains("Tesla T4")),
        "{r:#}"
    );
    assert_eq!(n(&r["plan"]["workers"]), workers_for(2000));
}

/// Serving past the footprint the plan assumed: the master says so once with the numbers
/// (what the GPUs hold at the observed footprint) and refuses TTIN; without
/// `--adapt-workers` it keeps its workers.
#[test]
fn a_footprint_growing_past_the_plan_is_reported_and_more_workers_refused() {
    let sim = Sim::new("[-1, 4]", 500, 2000, Some(1500));
    let s = sim.start(&["--production", "--profile-memory", "off", "--workers", "3"]);
    s.wait_workers(3);
    s.wait_event("footprint_observed", |e| e.u64("observed_mb") == Some(1500));
    assert!(s.events_named("footprint_exceeded").is_empty());
    workers_now_use(&sim, 5000);
    let e = s.wait_event("footprint_exceeded", |_| true);
    assert_eq!(e.u64("observed_mb"), Some(5000), "{e:?}");
    assert_eq!(e.u64("planned_mb"), Some(2000), "{e:?}");
    // floor(12402 / 5000) = 2 workers fit at the observed footprint.
    assert_eq!(e.u64("capacity"), Some(T4_USABLE_MB / 5000), "{e:?}");
    assert_eq!(e.u64("workers"), Some(3), "{e:?}");
    let mark = s.mark();
    s.signal(libc::SIGTTIN);
    s.wait_event_after(mark, "ttin_refused", |_| true);
    // Still 3 workers, and they serve.
    assert_eq!(worker_pids(s.pid()).len(), 3);
    assert!(s.events_named("workers_adapted").is_empty());
    let r = s.post("/", r#"{"inputs": [[1, 2, 3, 4]]}"#);
    assert_eq!(r.status, 200, "{r:?}");
}

/// With `--adapt-workers`, workers are retired one at a time down to what fits at the
/// observed footprint, while a client keeps sending: no request fails.
#[test]
fn adapt_workers_retires_down_to_what_fits_without_failing_a_request() {
    let sim = Sim::new("[-1, 4]", 500, 2000, Some(1500));
    let s = sim.start(&[
        "--production",
        "--profile-memory",
        "off",
        "--workers",
        "4",
        "--adapt-workers",
    ]);
    s.wait_workers(4);
    let port = s.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0u32, Vec::new());
            let deadline = std::time::Instant::now() + PATIENCE;
            while !stop.load(std::sync::atomic::Ordering::SeqCst)
                && std::time::Instant::now() < deadline
            {
                let r = http(port, "POST", "/", Some(r#"{"inputs": [[1, 2, 3, 4]]}"#));
                if r.status == 200 {
                    ok += 1;
                } else {
                    failed.push(format!("{r:?}"));
                }
            }
            (ok, failed)
        })
    };
    // 2 × 5000 MB fit the T4's 12402 usable MB; 4 workers do not.
    workers_now_use(&sim, 5000);
    let want = (T4_USABLE_MB / 5000) as usize;
    let first = s.wait_event("workers_adapted", |_| true);
    assert_eq!(first.u64("workers"), Some(3), "one at a time: {first:?}");
    assert_eq!(first.u64("capacity"), Some(want as u64), "{first:?}");
    s.wait_event("workers_adapted", |e| e.u64("workers") == Some(want as u64));
    s.wait_pool(|e| e.u64("workers") == Some(want as u64) && e.u64("ready") == Some(want as u64));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, failed) = client.join().unwrap();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    assert!(ok > 0);
    // Never below what fits, and it stays there.
    assert_eq!(s.events_named("workers_adapted").len(), 4 - want);
}

/// `--footprint-file`: what one run measured is recorded by the model file's hash and
/// planned from at the next start, without profiling again.
#[test]
fn a_footprint_file_carries_the_measurement_to_the_next_start() {
    let sim = Sim::new("[-1, 4]", 500, 2000, Some(5000));
    let file = sim.app.dir.path().join("footprints.json");
    let f = file.display().to_string();
    {
        let s = sim.start(&["--production", "--footprint-file", &f]);
        let e = s.wait_event("memory_profiled", |_| true);
        assert_eq!(e.str("source"), Some("profiled"), "{e:?}");
        assert_eq!(e.u64("measured_mb"), Some(5000));
    }
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let entries = doc.as_object().unwrap();
    assert_eq!(entries.len(), 1, "{doc:#}");
    let (hash, entry) = entries.iter().next().unwrap();
    assert_eq!(hash.len(), 64, "a SHA-256 in hex: {hash}");
    assert_eq!(entry["high_water_mb"], 5000, "{doc:#}");
    // Next start: the GPU would now report nothing (a profile would measure nothing), so
    // the plan can only come from the file.
    SimGpus::new(vec![SimGpu::t4()]).write(std::path::Path::new(&sim.file));
    let s = sim.start(&["--production", "--footprint-file", &f]);
    let e = s.wait_event("memory_profiled", |_| true);
    assert_eq!(e.str("source"), Some("remembered"), "{e:?}");
    assert_eq!(e.u64("measured_mb"), Some(5000), "{e:?}");
    assert_eq!(e.u64("workers"), Some(workers_for(6000)), "{e:?}");
    assert!(s.events_named("memory_profiling").is_empty());
    s.wait_workers(workers_for(6000) as usize);
    // A file that is not what it should be stops the start with a clear message.
    std::fs::write(&file, "not json").unwrap();
    let mut bad = sim.spawn(&["--production", "--footprint-file", &f]);
    let st = bad.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(2), "{}", bad.log_text());
    assert!(
        bad.log_text().contains("--footprint-file:")
            && bad.log_text().contains("is not valid JSON"),
        "{}",
        bad.log_text()
    );
}

/// In a container without the host's PID namespace NVML lists host pids,
/// so the profiling worker's own figure is never found; the footprint is then the fall of
/// the GPU's free memory while it started (CUDA context included), with a warning.
#[test]
fn a_worker_nvml_cannot_see_is_measured_from_free_memory() {
    let sim = Sim::new("[-1, 4]", 500, 6000, None);
    // A UUID of this test's own, so that workers of tests running beside it do not count.
    let gpu = SimGpu::t4()
        .uuid(&format!(
            "GPU-pidns-{}-0000-0000-000000000000",
            std::process::id()
        ))
        .workers_use(2500)
        .pid_namespace_offset(1_000_000)
        .free_follows_processes();
    SimGpus::new(vec![gpu]).write(std::path::Path::new(&sim.file));
    let (code, out) = sim.measure(&["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let r = report(&out);
    assert!(r["measured"]["nvml_process_bytes"].is_null(), "{r:#}");
    assert_eq!(
        n(&r["measured"]["device_free_memory_fall_bytes"]),
        2500 << 20,
        "{r:#}"
    );
    assert_eq!(n(&r["measured"]["footprint_mb"]), 2500, "{r:#}");
    let (code, text) = sim.measure(&[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("footprint_from_free_memory"), "{text}");
    assert!(
        text.contains("pid not visible: GPU free memory fell 2500 MB"),
        "{text}"
    );
}

/// In a container without the host's PID namespace NVML lists the
/// workers under host pids *while they serve* too. Their footprint is then taken from the
/// GPU's free memory (context included), shared among them — not left unlearnt (or, on
/// CUDA, the allocator's peak alone) — so the high-water mark, TTIN and `--adapt-workers`
/// still see what the workers really hold, and the operator is told once.
#[test]
fn in_a_container_the_footprint_while_serving_is_learnt_from_free_memory() {
    let sim = Sim::new("[-1, 4]", 500, 2000, None);
    let uuid = format!("GPU-pidns-serve-{}-0000-000000000000", std::process::id());
    let container = |mb: u64| {
        SimGpus::new(vec![SimGpu::t4()
            .uuid(&uuid)
            .workers_use(mb)
            .pid_namespace_offset(1_000_000)
            .free_follows_processes()])
    };
    container(1500).write(std::path::Path::new(&sim.file));
    let s = sim.start(&["--production", "--profile-memory", "off", "--workers", "3"]);
    s.wait_workers(3);
    s.wait_event("footprint_observed", |e| e.u64("observed_mb") == Some(1500));
    let w = s.wait_event("footprint_without_context", |_| true);
    assert_eq!(w.u64("mb"), Some(1500), "{w:?}");
    assert!(
        w.message()
            .contains("in a container without the host's PID namespace"),
        "{w:?}"
    );
    assert!(s.events_named("footprint_exceeded").is_empty());
    container(5000).write(std::path::Path::new(&sim.file));
    let e = s.wait_event("footprint_exceeded", |_| true);
    assert_eq!(e.u64("observed_mb"), Some(5000), "{e:?}");
    assert_eq!(e.u64("capacity"), Some(T4_USABLE_MB / 5000), "{e:?}");
    let mark = s.mark();
    s.signal(libc::SIGTTIN);
    s.wait_event_after(mark, "ttin_refused", |_| true);
}
