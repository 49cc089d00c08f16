//! `app --production` places workers on their GPUs; a model too big for every GPU; partially
//! used GPUs; no GPU although the app expects one.

use super::*;

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
