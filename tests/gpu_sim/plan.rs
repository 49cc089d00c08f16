//! `app plan` on 1, 2 and 8 simulated GPUs, against the rule written out in `main.rs`.

use super::*;

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
