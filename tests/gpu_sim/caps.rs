//! What bounds each worker: allocator settings that defeat the cap, `--max-worker-gpu-mb`
//! and the context each worker is told, host memory bound by the first worker's warm-up.

use super::*;

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
