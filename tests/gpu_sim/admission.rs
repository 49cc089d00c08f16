//! Admission while running: a recycled worker or a TTIN waits for GPU memory, TTIN beyond
//! what fits, an explicit NVML library that does not load, the wait reason logged when it
//! changes, `--workers` above what fits.

use super::*;

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
