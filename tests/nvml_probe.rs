//! The real NVML code path (`nvml-wrapper` → `resources::NvmlProbe`) against the NVML
//! stand-in `tests/nvml-mock`, on 0, 1, 2 and 8 simulated GPUs, and the plan made from it.

mod common;
use common::nvml_sim;

use std::path::Path;

use nvml_sim::{SimGpu, SimGpus};
use vramfork::master::plan::{plan, Demand, Policy};
use vramfork::master::resources::{probe, GpuProbe, NvmlProbe, ProbeError, Resources, MB};
use vramfork::metadata::AppMetadata;

/// The mock in this process.
type Sim = nvml_sim::InProcess;

/// `resources::NvmlProbe` over the mock.
trait Open {
    fn open(&self) -> NvmlProbe;
}

impl Open for Sim {
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
    assert_eq!(p.driver_version().as_deref(), Some("580.65.06"));
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
    let plan = plan(&res, &Demand::declared(&meta), &Policy::default()).unwrap();
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

/// Memory info v2: `reserved` is read and kept apart from `used`; the driver's CUDA
/// version is read.
#[test]
fn reserved_memory_and_the_drivers_cuda_version() {
    let sim = SimGpus::new(vec![SimGpu::h100_80gb().free_mb(80_000).reserved_mb(600)])
        .cuda_driver_version(12080);
    let s = Sim::new(&sim);
    let (res, p) = probe(Some(&s.lib)).unwrap();
    let g = &res.gpus[0];
    assert_eq!(g.reserved_bytes, 600 * MB);
    assert_eq!(
        g.total_bytes,
        g.free_bytes + g.used_bytes + g.reserved_bytes
    );
    assert_eq!(res.cuda_driver_version, Some(12080));
    assert_eq!(p.unwrap().cuda_driver_version(), Some(12080));
}

/// Compute modes are read per GPU; a GPU that does not support the query counts as
/// `default`, one that has fallen off the bus is left out.
#[test]
fn compute_modes_and_their_errors() {
    use nvml_sim::{nvml_return, SimComputeMode};
    use vramfork::master::resources::ComputeMode;
    let sim = SimGpus::new(vec![
        SimGpu::a100_40gb().compute_mode(SimComputeMode::ExclusiveProcess),
        SimGpu::a100_40gb().compute_mode(SimComputeMode::Prohibited),
        SimGpu::t4().error("nvmlDeviceGetComputeMode", nvml_return::NOT_SUPPORTED),
        SimGpu::t4().error("nvmlDeviceGetComputeMode", nvml_return::GPU_IS_LOST),
    ]);
    let s = Sim::new(&sim);
    let (res, _p) = probe(Some(&s.lib)).unwrap();
    let modes: Vec<(u32, ComputeMode)> =
        res.gpus.iter().map(|g| (g.index, g.compute_mode)).collect();
    assert_eq!(
        modes,
        vec![
            (0, ComputeMode::ExclusiveProcess),
            (1, ComputeMode::Prohibited),
            (2, ComputeMode::Default)
        ]
    );
    let note = res.gpu_note.unwrap();
    assert!(
        note.contains("GPU 3 left out") && note.contains("nvmlDeviceGetComputeMode"),
        "{note}"
    );
}

/// A GPU in MIG mode is listed as its instances (after the whole GPUs), each with its own
/// UUID and memory; one in MIG mode without instances is left out with a note.
#[test]
fn mig_instances_are_devices() {
    use nvml_sim::{SimMig, SimMigInstance};
    use vramfork::master::resources::MigInstance;
    let sim = SimGpus::new(vec![
        SimGpu::a100_40gb().mig(
            SimMig::enabled()
                .empty_slot()
                .instance(SimMigInstance::a100_3g_20gb("MIG-aaaa", 1).process(4242, 700))
                .instance(SimMigInstance::a100_1g_5gb("MIG-bbbb", 2)),
        ),
        SimGpu::t4(),
        SimGpu::a100_40gb().mig(SimMig::enabled()),
        SimGpu::t4().mig(SimMig::disabled()),
    ]);
    let s = Sim::new(&sim);
    let (res, p) = probe(Some(&s.lib)).unwrap();
    let p = p.unwrap();
    let got: Vec<(u32, String, u64, Option<MigInstance>)> = res
        .gpus
        .iter()
        .map(|g| (g.index, g.uuid.clone(), g.total_bytes / MB, g.mig))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, sim.uuid_of(1), 15_360, None),
            (3, sim.uuid_of(3), 15_360, None),
            (
                4,
                "MIG-aaaa".into(),
                19_968,
                Some(MigInstance { parent: 0, slot: 1 })
            ),
            (
                5,
                "MIG-bbbb".into(),
                4_864,
                Some(MigInstance { parent: 0, slot: 2 })
            ),
        ]
    );
    assert_eq!(res.gpus[2].label(), "GPU 0 MIG 1");
    assert_eq!(p.process_used_bytes(4, 4242).unwrap(), Some(700 * MB));
    assert_eq!(p.process_used_bytes(5, 4242).unwrap(), None);
    let note = res.gpu_note.unwrap();
    assert!(
        note.contains("GPU 2 is in MIG mode but has no MIG instance"),
        "{note}"
    );
}

/// Drivers 535.43–535.86 filled the process list in another layout than their header's:
/// a figure larger than the GPU is the sign, and then no figure from the list is trusted.
#[test]
fn an_implausible_process_list_is_not_trusted() {
    let sim = SimGpus::new(vec![SimGpu::t4().process(10, 500).process(11, 4_000_000)]);
    let s = Sim::new(&sim);
    let p = s.open();
    assert_eq!(p.process_used_bytes(0, 10).unwrap(), None);
    let fine = SimGpus::new(vec![SimGpu::t4().process(10, 500)]);
    fine.write(&s.file);
    assert_eq!(p.process_used_bytes(0, 10).unwrap(), Some(500 * MB));
}

/// Nvml-wrapper sizes a process list exactly (a count call, then a fill
/// call), so an MPS client starting between the two makes the fill `INSUFFICIENT_SIZE`. The
/// probe asks again rather than reading that as "NVML does not list the pid".
#[test]
fn a_process_list_that_grows_between_count_and_fill_is_read_again() {
    let sim = SimGpus::new(vec![SimGpu::h100_80gb()
        .mps(4_242, 300)
        .mps_process(77, 1_500)
        .lists_grow(2)]);
    let s = Sim::new(&sim);
    let p = s.open();
    assert_eq!(p.process_used_bytes(0, 77).unwrap(), Some(1_500 * MB));
    assert_eq!(p.process_used_bytes(0, 4_242).unwrap(), Some(300 * MB));
}

/// In a container's pid namespace NVML lists host pids, and one may equal
/// a worker's: the probe then reads no per-process figure as ours (the callers take the
/// device's free memory, as for a pid NVML does not list), so a foreign process's 30 GB is
/// never a worker's footprint, hwFetch figure or metric. In the host's namespace the same
/// list is read.
#[test]
fn outside_the_hosts_pid_namespace_no_process_figure_is_ours() {
    let sim = SimGpus::new(vec![SimGpu::h100_80gb().process(7, 30_000)]);
    let s = Sim::new(&sim);
    let p = s.open().with_pids_ours(false);
    assert_eq!(p.process_used_bytes(0, 7).unwrap(), None);
    let p = p.with_pids_ours(true);
    assert_eq!(p.process_used_bytes(0, 7).unwrap(), Some(30_000 * MB));
}

/// Each GPU's CUDA compute capability as NVML tells it (`nvmlDeviceGetCudaComputeCapability`),
/// a MIG instance's that of its GPU; unknown (`None`) where the call fails, the GPU still
/// listed.
#[test]
fn compute_capabilities_are_read_and_a_failure_leaves_them_unknown() {
    use nvml_sim::{nvml_return, SimMig, SimMigInstance};
    let sim = SimGpus::new(vec![
        SimGpu::h100_80gb(),
        SimGpu::t4(),
        SimGpu::rtx_4090().error(
            "nvmlDeviceGetCudaComputeCapability",
            nvml_return::NOT_SUPPORTED,
        ),
        SimGpu::a100_40gb()
            .mig(SimMig::enabled().instance(SimMigInstance::a100_3g_20gb("MIG-cccc", 1))),
    ]);
    let s = Sim::new(&sim);
    let (res, _p) = probe(Some(&s.lib)).unwrap();
    let got: Vec<(u32, Option<String>)> = res
        .gpus
        .iter()
        .map(|g| (g.index, g.compute_capability.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, Some("9.0".into())),
            (1, Some("7.5".into())),
            (2, None),
            (4, Some("8.0".into())),
        ]
    );
}
