//! The GPU path against a faithful NVML: CUDA missing on a GPU, a driver too old, compute
//! modes, MIG instances, the operator's `CUDA_VISIBLE_DEVICES`, no estimate.

use super::*;

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
