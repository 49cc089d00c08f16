//! NVIDIA MPS: detected, compute instances of one GPU instance, workers limited, measured
//! and retired together, the inherited client limit, the profiling worker's limit, a daemon
//! that goes away.

use super::*;

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
