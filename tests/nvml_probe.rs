//! The real NVML code path (`nvml-wrapper` → `resources::NvmlProbe`) against the NVML
//! stand-in `tests/nvml-mock`, on 0, 1, 2 and 8 simulated GPUs, and the plan made from it.

#[path = "support/nvml_sim.rs"]
mod nvml_sim;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nvml_sim::{SimGpu, SimGpus};
use vramfork::metadata::AppMetadata;
use vramfork::plan::{plan, Policy};
use vramfork::resources::{probe, GpuProbe, NvmlProbe, ProbeError, Resources, MB};

/// The mock reads `NVML_MOCK_FILE` from the process environment: one test at a time.
static ENV: Mutex<()> = Mutex::new(());

struct Sim {
    _guard: MutexGuard<'static, ()>,
    _dir: tempfile::TempDir,
    file: PathBuf,
    lib: PathBuf,
}

impl Sim {
    fn new(gpus: &SimGpus) -> Sim {
        let lib = nvml_sim::mock_library();
        let guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gpus.json");
        gpus.write(&file);
        std::env::set_var(nvml_sim::ENV_FILE, &file);
        Sim {
            _guard: guard,
            _dir: dir,
            file,
            lib,
        }
    }

    fn open(&self) -> NvmlProbe {
        NvmlProbe::open(Some(&self.lib)).unwrap_or_else(|e| panic!("open mock NVML: {e}"))
    }
}

fn check_gpus(p: &NvmlProbe, sim: &SimGpus) {
    let gpus = p.gpus().unwrap();
    assert_eq!(gpus.len(), sim.gpus.len());
    for (i, (got, want)) in gpus.iter().zip(&sim.gpus).enumerate() {
        assert_eq!(got.index, i as u32);
        assert_eq!(got.name, want.name);
        assert_eq!(got.uuid, sim.uuid_of(i));
        assert_eq!(got.total_bytes, want.total_mb * MB);
        assert_eq!(got.free_bytes, want.free_mb * MB);
        assert_eq!(got.used_bytes, (want.total_mb - want.free_mb) * MB);
        assert_eq!(p.free_bytes(i as u32).unwrap(), want.free_mb * MB);
    }
}

#[test]
fn one_gpu_with_processes() {
    let sim = SimGpus::new(vec![SimGpu::a100_40gb()
        .free_mb(30_000)
        .process(123, 500)
        .process(456, 9_000)
        .process_unavailable(789)]);
    let s = Sim::new(&sim);
    let p = s.open();
    assert_eq!(p.count().unwrap(), 1);
    check_gpus(&p, &sim);
    assert_eq!(p.driver_version().as_deref(), Some("550.54.15"));
    assert_eq!(p.process_used_bytes(0, 123).unwrap(), Some(500 * MB));
    assert_eq!(p.process_used_bytes(0, 456).unwrap(), Some(9_000 * MB));
    assert_eq!(p.process_used_bytes(0, 789).unwrap(), None, "not available");
    assert_eq!(p.process_used_bytes(0, 1).unwrap(), None, "no such process");
    assert!(matches!(p.gpu(1), Err(ProbeError::NoSuchGpu(1))));
}

#[test]
fn two_gpus_of_different_sizes_and_a_plan() {
    let sim = SimGpus::new(vec![
        SimGpu::t4().free_mb(15_000),
        SimGpu::h100_80gb().free_mb(80_000).process(42, 1_000),
    ]);
    let s = Sim::new(&sim);
    let p = s.open();
    check_gpus(&p, &sim);
    assert_eq!(p.process_used_bytes(1, 42).unwrap(), Some(1_000 * MB));
    assert_eq!(p.process_used_bytes(0, 42).unwrap(), None);

    let res = Resources::from_probe(32, &p);
    assert_eq!(res.gpu_note, None);
    let meta = AppMetadata::parse(
        Path::new("/apps/demo/app-metadata.json"),
        r#"{"name": "demo", "est_gpu_mem_min": 2000, "est_gpu_mem_typ": 4000}"#,
    )
    .unwrap();
    let plan = plan(&res, &meta, &Policy::default()).unwrap();
    // T4: min(15360 × 0.84, 15000) − 500 = 12402 → 3; H100: min(81559 × 0.95, 80000) − 500
    // = 77001 → 19. GPU bound 22 < CPU bound 65.
    assert_eq!(plan.gpu_bound, Some(22), "{}", plan.to_text());
    assert_eq!(plan.workers, 22);
    assert_eq!(
        plan.gpus.iter().map(|g| g.assigned).collect::<Vec<_>>(),
        vec![3, 19]
    );
    assert_eq!(plan.placement[0].gpu.as_ref().unwrap().uuid, sim.uuid_of(1));
}

#[test]
fn eight_gpus() {
    let sim = SimGpus::same(8, SimGpu::a100_40gb().free_mb(40_000));
    let s = Sim::new(&sim);
    let p = s.open();
    assert_eq!(p.count().unwrap(), 8);
    check_gpus(&p, &sim);
    let uuids: std::collections::HashSet<String> =
        p.gpus().unwrap().into_iter().map(|g| g.uuid).collect();
    assert_eq!(uuids.len(), 8, "distinct UUIDs");
}

#[test]
fn free_memory_changes_while_open() {
    let mut sim = SimGpus::new(vec![SimGpu::rtx_4090().free_mb(20_000)]);
    let s = Sim::new(&sim);
    let p = s.open();
    assert_eq!(p.free_bytes(0).unwrap(), 20_000 * MB);
    sim.gpus[0].free_mb = 1_000;
    sim.gpus[0].processes.push((77, Some(19_000)));
    sim.write(&s.file);
    assert_eq!(p.free_bytes(0).unwrap(), 1_000 * MB);
    assert_eq!(p.process_used_bytes(0, 77).unwrap(), Some(19_000 * MB));
}

#[test]
fn no_gpu_is_a_note() {
    let s = Sim::new(&SimGpus::new(vec![]));
    let (res, p) = probe(Some(&s.lib)).expect("NVML loads, no GPU is not an error");
    assert!(p.is_some());
    assert!(res.gpus.is_empty());
    assert_eq!(res.gpu_note.as_deref(), Some("NVML sees no GPU"));
}

#[test]
fn a_lost_gpu_is_left_out_and_named() {
    let sim = SimGpus::new(vec![SimGpu::a100_40gb().lost(), SimGpu::a100_40gb()]);
    let s = Sim::new(&sim);
    let (res, _p) = probe(Some(&s.lib)).unwrap();
    assert_eq!(res.gpus.len(), 1);
    assert_eq!(res.gpus[0].index, 1);
    let note = res.gpu_note.unwrap();
    assert!(note.contains("GPU 0 left out"), "{note}");
}

#[test]
fn explicit_library_that_cannot_initialise_is_an_error() {
    let mut sim = SimGpus::new(vec![SimGpu::t4()]);
    sim.init_error = Some(9); // NVML_ERROR_DRIVER_NOT_LOADED
    let s = Sim::new(&sim);
    let e = probe(Some(&s.lib)).expect_err("must fail").to_string();
    assert!(e.contains("libnvml_mock.so"), "{e}");
    assert!(e.contains("driver is not loaded"), "{e}");

    // Missing file: init fails too, never a panic.
    std::env::set_var(nvml_sim::ENV_FILE, s.file.with_extension("missing"));
    assert!(matches!(
        NvmlProbe::open(Some(&s.lib)),
        Err(ProbeError::Load { .. })
    ));
}
