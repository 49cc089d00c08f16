//! The NVML stand-in (`tests/nvml-mock`) driven directly through `nvml-wrapper`, one test per
//! behaviour it simulates: memory info v1/v2 with reserved memory, free memory following
//! processes, a PID namespace offset, the CUDA driver version, compute modes, MIG, injected
//! errors and the process record layouts.

mod common;
use common::nvml_sim;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nvml_sim::{nvml_return, SimComputeMode, SimGpu, SimGpus, SimMig, SimMigInstance};
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{cuda_driver_version_major, cuda_driver_version_minor, Device, Nvml};

const MB: u64 = 1 << 20;

/// The mock in this process.
type Sim = nvml_sim::InProcess;

/// nvml-wrapper over the mock.
trait Load {
    fn nvml(&self) -> Nvml;
}

impl Load for Sim {
    fn nvml(&self) -> Nvml {
        Nvml::builder()
            .lib_path(self.lib.as_os_str())
            .init()
            .unwrap_or_else(|e| panic!("init mock NVML {}: {e}", self.lib.display()))
    }
}

/// A `sleep` placed on a device the way the master places a worker
/// (`CUDA_VISIBLE_DEVICES` = the device's UUID); killed when dropped.
struct Placed(Child);

impl Placed {
    fn on(uuid: &str) -> Placed {
        let child = Command::new("sleep")
            .arg("30")
            .env("CUDA_VISIBLE_DEVICES", uuid)
            .spawn()
            .expect("spawn sleep");
        let placed = Placed(child);
        // Until it has exec'd, /proc/<pid>/environ is still ours.
        let want = format!("CUDA_VISIBLE_DEVICES={uuid}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let env = std::fs::read(format!("/proc/{}/environ", placed.pid())).unwrap_or_default();
            if env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
                return placed;
            }
            assert!(Instant::now() < deadline, "sleep never showed {want}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A UUID no other test process on this machine uses.
fn unique_uuid(prefix: &str, tag: &str) -> String {
    format!("{prefix}-nvmlmock-{}-{tag}", std::process::id())
}

/// `nvmlDeviceGetMemoryInfo` (v1), which `nvml-wrapper` 0.12 no longer calls: (total, free,
/// used).
fn memory_v1(nvml: &Nvml, device: &Device) -> (u64, u64, u64) {
    let f = nvml
        .lib()
        .nvmlDeviceGetMemoryInfo
        .as_ref()
        .expect("nvmlDeviceGetMemoryInfo");
    // SAFETY: the handle comes from this NVML; `m` is a zeroed `nvmlMemory_t` NVML fills.
    unsafe {
        let mut m = std::mem::zeroed();
        assert_eq!(f(device.handle(), &mut m), 0, "nvmlDeviceGetMemoryInfo");
        (m.total, m.free, m.used)
    }
}

/// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` (not wrapped by
/// `nvml-wrapper`): the `nvmlReturn_t` or the id.
fn instance_ids(nvml: &Nvml, device: &Device) -> Result<(u32, u32), u32> {
    let lib = nvml.lib();
    let gi = lib.nvmlDeviceGetGpuInstanceId.as_ref().expect("symbol");
    let ci = lib.nvmlDeviceGetComputeInstanceId.as_ref().expect("symbol");
    let (mut g, mut c) = (0, 0);
    // SAFETY: the handle comes from this NVML; both outputs are writable `c_uint`s.
    let (rg, rc) = unsafe { (gi(device.handle(), &mut g), ci(device.handle(), &mut c)) };
    match (rg, rc) {
        (0, 0) => Ok((g, c)),
        (0, e) | (e, _) => Err(e),
    }
}

fn used(p: &nvml_wrapper::struct_wrappers::device::ProcessInfo) -> Option<u64> {
    match p.used_gpu_memory {
        UsedGpuMemory::Used(b) => Some(b),
        UsedGpuMemory::Unavailable => None,
    }
}

#[test]
fn memory_v2_reports_reserved_and_v1_counts_it_as_used() {
    let sim = SimGpus::new(vec![
        SimGpu::a100_40gb().reserved_mb(512).free_mb(30_000),
        SimGpu::t4(),
        SimGpu::h100_80gb().reserved_mb(600),
    ]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();

    let d = nvml.device_by_index(0).unwrap();
    let m = d.memory_info().unwrap();
    assert_eq!(m.total, 40_960 * MB);
    assert_eq!(m.reserved, 512 * MB);
    assert_eq!(m.free, 30_000 * MB);
    assert_eq!(m.used, (40_960 - 512 - 30_000) * MB);
    assert_eq!(
        m.total,
        m.free + m.used + m.reserved,
        "v2: total = free + used + reserved"
    );
    let (total, free, used) = memory_v1(&nvml, &d);
    assert_eq!((total, free), (40_960 * MB, 30_000 * MB));
    assert_eq!(used, total - free, "v1 counts the reserved memory as used");

    // No reserve (the default): as before.
    let d = nvml.device_by_index(1).unwrap();
    let m = d.memory_info().unwrap();
    assert_eq!(
        (m.total, m.reserved, m.free, m.used),
        (15_360 * MB, 0, 15_360 * MB, 0)
    );
    assert_eq!(memory_v1(&nvml, &d), (15_360 * MB, 15_360 * MB, 0));

    // An idle GPU with a reserve: free is what is left after it.
    let d = nvml.device_by_index(2).unwrap();
    let m = d.memory_info().unwrap();
    assert_eq!(m.free, (81_559 - 600) * MB);
    assert_eq!(m.used, 0);
    assert_eq!(m.reserved, 600 * MB);
    assert_eq!(
        memory_v1(&nvml, &d),
        (81_559 * MB, (81_559 - 600) * MB, 600 * MB)
    );
}

#[test]
fn free_memory_follows_processes() {
    let uuid = unique_uuid("GPU", "follow");
    let mut sim = SimGpus::new(vec![
        SimGpu::a100_40gb()
            .uuid(&uuid)
            .reserved_mb(500)
            .used_mb(1_000)
            .free_follows_processes()
            .process(123, 2_000)
            .process_unavailable(456)
            .workers_use(3_000),
        // Not opted in: free stays as scripted whatever the processes use.
        SimGpu::t4().free_mb(15_000).process(9, 5_000),
    ]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    let d = nvml.device_by_index(0).unwrap();

    let m = d.memory_info().unwrap();
    assert_eq!(
        m.used,
        (1_000 + 2_000) * MB,
        "base + scripted; n/a counts 0"
    );
    assert_eq!(m.free, (40_960 - 500 - 1_000 - 2_000) * MB);
    assert_eq!(m.total, m.free + m.used + m.reserved);

    // A worker placed on the GPU is discovered and its 3000 MB leave free memory.
    let worker = Placed::on(&uuid);
    let m = d.memory_info().unwrap();
    assert_eq!(m.used, (1_000 + 2_000 + 3_000) * MB);
    assert_eq!(m.free, (40_960 - 500 - 6_000) * MB);
    let (_, free_v1, used_v1) = memory_v1(&nvml, &d);
    assert_eq!(free_v1, m.free);
    assert_eq!(used_v1, (500 + 6_000) * MB);
    let procs = d.running_compute_processes().unwrap();
    assert!(procs
        .iter()
        .any(|p| p.pid == worker.pid() && used(p) == Some(3_000 * MB)));

    // More than fits: free saturates at 0.
    sim.gpus[0].processes.push((777, Some(40_000)));
    sim.write(&s.file);
    let m = d.memory_info().unwrap();
    assert_eq!(m.free, 0);
    assert_eq!(m.used, (1_000 + 2_000 + 3_000 + 40_000) * MB);

    // The worker exits: its memory comes back.
    drop(worker);
    sim.gpus[0].processes.pop();
    sim.write(&s.file);
    let m = d.memory_info().unwrap();
    assert_eq!(m.free, (40_960 - 500 - 3_000) * MB);

    let t4 = nvml.device_by_index(1).unwrap().memory_info().unwrap();
    assert_eq!(t4.free, 15_000 * MB);
    assert_eq!(t4.used, 360 * MB);
}

#[test]
fn pid_namespace_offset_shifts_discovered_processes() {
    let uuid0 = unique_uuid("GPU", "pidns-0");
    let uuid1 = unique_uuid("GPU", "pidns-1");
    let sim = SimGpus::new(vec![
        SimGpu::a100_40gb()
            .uuid(&uuid0)
            .workers_use(700)
            .process(42, 100),
        SimGpu::a100_40gb()
            .uuid(&uuid1)
            .workers_use(800)
            .pid_namespace_offset(7),
    ])
    .pid_namespace_offset(100_000);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    let w0 = Placed::on(&uuid0);
    let w1 = Placed::on(&uuid1);

    let procs = nvml
        .device_by_index(0)
        .unwrap()
        .running_compute_processes()
        .unwrap();
    let pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
    assert_eq!(
        pids,
        vec![42, w0.pid() + 100_000],
        "scripted pids as given, discovered ones shifted by the top-level offset"
    );
    assert_eq!(used(&procs[1]), Some(700 * MB));
    assert!(
        !pids.contains(&w0.pid()),
        "the worker's own pid is never found"
    );

    let procs = nvml
        .device_by_index(1)
        .unwrap()
        .running_compute_processes()
        .unwrap();
    assert_eq!(
        procs.iter().map(|p| p.pid).collect::<Vec<_>>(),
        vec![w1.pid() + 7],
        "the GPU's own offset wins"
    );
    assert_eq!(used(&procs[0]), Some(800 * MB));
}

#[test]
fn cuda_driver_version_and_nvml_version() {
    let s = Sim::new(
        &SimGpus::new(vec![SimGpu::t4()])
            .driver("550.54.15")
            .cuda_driver_version(12_040),
    );
    let nvml = s.nvml();
    let v = nvml.sys_cuda_driver_version().unwrap();
    assert_eq!(v, 12_040);
    assert_eq!(cuda_driver_version_major(v), 12);
    assert_eq!(cuda_driver_version_minor(v), 4);
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.550.54.15");
    // The v1 symbol answers the same.
    let f = nvml
        .lib()
        .nvmlSystemGetCudaDriverVersion
        .as_ref()
        .expect("symbol");
    let mut v1 = 0;
    // SAFETY: `v1` is a writable c_int.
    assert_eq!(unsafe { f(&mut v1) }, 0);
    assert_eq!(v1, 12_040);
    drop(nvml);
    drop(s);

    // Default: CUDA 13.0.
    let s = Sim::new(&SimGpus::new(vec![]).driver("580.82.07"));
    let nvml = s.nvml();
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 13_000);
    assert_eq!(nvml.sys_nvml_version().unwrap(), "13.580.82.07");
}

#[test]
fn compute_mode_per_gpu() {
    let sim = SimGpus::new(vec![
        SimGpu::t4(),
        SimGpu::t4().compute_mode(SimComputeMode::ExclusiveThread),
        SimGpu::t4().compute_mode(SimComputeMode::Prohibited),
        SimGpu::t4().compute_mode(SimComputeMode::ExclusiveProcess),
        SimGpu::t4().compute_mode(SimComputeMode::Default),
    ]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    let modes: Vec<ComputeMode> = (0..5)
        .map(|i| nvml.device_by_index(i).unwrap().compute_mode().unwrap())
        .collect();
    assert_eq!(
        modes,
        vec![
            ComputeMode::Default,
            ComputeMode::ExclusiveThread,
            ComputeMode::Prohibited,
            ComputeMode::ExclusiveProcess,
            ComputeMode::Default,
        ]
    );
}

#[test]
fn mig_enabled_gpu_exposes_its_instances() {
    let parent_uuid = "GPU-5d3d0f6a-0000-4000-8000-00000000a100";
    let mig0 = "MIG-11111111-2222-5333-8444-555555555555";
    let mig2 = "MIG-66666666-7777-5888-9999-aaaaaaaaaaaa";
    let worker_uuid = unique_uuid("MIG", "worker");
    let sim = SimGpus::new(vec![
        SimGpu::a100_40gb()
            .uuid(parent_uuid)
            .free_mb(20_000)
            .compute_mode(SimComputeMode::Default)
            .mig(
                SimMig::enabled()
                    .instance(
                        SimMigInstance::a100_1g_5gb(mig0, 7)
                            .reserved_mb(100)
                            .free_mb(4_000)
                            .process(4242, 300)
                            .compute_mode(SimComputeMode::Prohibited),
                    )
                    .empty_slot()
                    .instance(SimMigInstance::a100_3g_20gb(mig2, 2).process(5151, 1_000))
                    .instance(
                        SimMigInstance::a100_1g_5gb(&worker_uuid, 9)
                            .free_follows_processes()
                            .workers_use(1_200),
                    ),
            ),
        SimGpu::t4(),
    ]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    let worker = Placed::on(&worker_uuid);

    // MIG devices are not listed among the GPUs.
    assert_eq!(nvml.device_count().unwrap(), 2);
    let gpu = nvml.device_by_index(0).unwrap();
    assert_eq!(gpu.uuid().unwrap(), parent_uuid);
    assert!(!gpu.mig_is_mig_device_handle().unwrap());
    let mode = gpu.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(gpu.mig_device_count().unwrap(), 7);

    let m0 = gpu.mig_device_by_index(0).unwrap();
    assert_eq!(m0.uuid().unwrap(), mig0);
    assert_eq!(m0.name().unwrap(), "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
    assert!(m0.mig_is_mig_device_handle().unwrap());
    // SAFETY: only compared, never used as a handle.
    assert_ne!(unsafe { m0.handle() }, unsafe { gpu.handle() });
    let mem = m0.memory_info().unwrap();
    assert_eq!(
        (mem.total, mem.reserved, mem.free, mem.used),
        (4_864 * MB, 100 * MB, 4_000 * MB, (4_864 - 100 - 4_000) * MB)
    );
    assert_eq!(memory_v1(&nvml, &m0), (4_864 * MB, 4_000 * MB, 864 * MB));
    assert_eq!(m0.compute_mode().unwrap(), ComputeMode::Prohibited);
    assert_eq!(instance_ids(&nvml, &m0), Ok((7, 0)));
    let procs = m0.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, 4242);
    assert_eq!(used(&procs[0]), Some(300 * MB));
    assert_eq!(procs[0].gpu_instance_id, Some(7));
    assert_eq!(procs[0].compute_instance_id, Some(0));
    assert_eq!(m0.mig_parent_device().unwrap().uuid().unwrap(), parent_uuid);

    // An empty slot below the maximum is NOT_FOUND; past it, an invalid argument.
    assert!(matches!(
        gpu.mig_device_by_index(1),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        gpu.mig_device_by_index(6),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        gpu.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));

    let m2 = gpu.mig_device_by_index(2).unwrap();
    assert_eq!(m2.uuid().unwrap(), mig2);
    assert_eq!(m2.memory_info().unwrap().total, 19_968 * MB);
    assert_eq!(
        m2.compute_mode().unwrap(),
        ComputeMode::Default,
        "the GPU's"
    );
    assert_eq!(instance_ids(&nvml, &m2), Ok((2, 0)));

    // A worker placed on an instance by its MIG UUID, and that instance's free memory.
    let m3 = gpu.mig_device_by_index(3).unwrap();
    let procs = m3.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, worker.pid());
    assert_eq!(procs[0].gpu_instance_id, Some(9));
    assert_eq!(m3.memory_info().unwrap().free, (4_864 - 1_200) * MB);

    // The parent: the whole GPU's memory, every instance's processes.
    let mem = gpu.memory_info().unwrap();
    assert_eq!((mem.total, mem.free), (40_960 * MB, 20_000 * MB));
    let procs = gpu.running_compute_processes().unwrap();
    let seen: Vec<(u32, Option<u32>)> = procs.iter().map(|p| (p.pid, p.gpu_instance_id)).collect();
    assert_eq!(
        seen,
        vec![(4242, Some(7)), (5151, Some(2)), (worker.pid(), Some(9))]
    );
    assert_eq!(instance_ids(&nvml, &gpu), Err(nvml_return::NOT_SUPPORTED));
    assert!(matches!(
        gpu.mig_parent_device(),
        Err(NvmlError::InvalidArg)
    ));

    // A MIG device has no MIG devices and no MIG mode of its own.
    assert_eq!(m0.mig_device_count().unwrap(), 0);
    assert!(matches!(m0.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        m0.mig_device_by_index(0),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn mig_capable_disabled_and_incapable_gpus() {
    let sim = SimGpus::new(vec![
        SimGpu::a100_40gb().mig_capable(),
        SimGpu::h100_80gb().mig(
            SimMig::disabled()
                .pending(true)
                .instance(SimMigInstance::a100_1g_5gb("MIG-not-yet", 1)),
        ),
        SimGpu::rtx_4090(),
    ]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    assert_eq!(nvml.device_count().unwrap(), 3);

    let capable = nvml.device_by_index(0).unwrap();
    let mode = capable.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (0, 0));
    assert_eq!(
        capable.mig_device_count().unwrap(),
        0,
        "zero while disabled"
    );
    assert!(matches!(
        capable.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));

    let pending = nvml.device_by_index(1).unwrap();
    let mode = pending.mig_mode().unwrap();
    assert_eq!(
        (mode.current, mode.pending),
        (0, 1),
        "enabled after a reset"
    );
    assert_eq!(pending.mig_device_count().unwrap(), 0);
    assert!(matches!(
        pending.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(pending.memory_info().unwrap().total, 81_559 * MB);

    let geforce = nvml.device_by_index(2).unwrap();
    assert!(matches!(geforce.mig_mode(), Err(NvmlError::NotSupported)));
    assert_eq!(geforce.mig_device_count().unwrap(), 0);
    assert!(!geforce.mig_is_mig_device_handle().unwrap());
    assert!(matches!(
        geforce.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
}

/// `nvmlDeviceGetGpuInstanceId` of a MIG device (nvml-wrapper 0.12 has no method for it).
fn gpu_instance_id(nvml: &Nvml, dev: &Device) -> u32 {
    let mut id = u32::MAX;
    // SAFETY: a live handle from this NVML, and `id` is a writable u32.
    let rc = unsafe { nvml.lib().nvmlDeviceGetGpuInstanceId(dev.handle(), &mut id) };
    assert_eq!(rc, 0, "nvmlDeviceGetGpuInstanceId");
    id
}

/// Two compute instances of one GPU instance (a 3g.20gb GPU instance split into
/// two compute instances) are two MIG devices, each reporting the GPU instance's memory,
/// which falls with the processes of either.
#[test]
fn compute_instances_of_one_gpu_instance_share_its_memory() {
    let sim = SimGpus::new(vec![SimGpu::a100_40gb().mig(
        SimMig::enabled()
            .instance(
                SimMigInstance::new(
                    "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb",
                    "MIG-ci-0",
                    19_968,
                    2,
                    0,
                )
                .free_follows_processes()
                .process(51, 3_000),
            )
            .instance(
                SimMigInstance::new(
                    "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb",
                    "MIG-ci-1",
                    19_968,
                    2,
                    1,
                )
                .free_follows_processes()
                .process(52, 1_000),
            )
            .instance(SimMigInstance::a100_1g_5gb("MIG-gi-9", 9)),
    )]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    let gpu = nvml.device_by_index(0).unwrap();
    let (a, b, c) = (
        gpu.mig_device_by_index(0).unwrap(),
        gpu.mig_device_by_index(1).unwrap(),
        gpu.mig_device_by_index(2).unwrap(),
    );
    assert_eq!(gpu_instance_id(&nvml, &a), 2);
    assert_eq!(gpu_instance_id(&nvml, &b), 2);
    assert_eq!(gpu_instance_id(&nvml, &c), 9);
    for d in [&a, &b] {
        let m = d.memory_info().unwrap();
        assert_eq!(m.total, 19_968 * MB, "the GPU instance's memory, once");
        assert_eq!(m.used, 4_000 * MB, "both compute instances' processes");
        assert_eq!(m.free, 15_968 * MB);
    }
    // Each lists its own processes, with their instance IDs.
    let pa = a.running_compute_processes().unwrap();
    assert_eq!(pa.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![51]);
    assert_eq!(
        (pa[0].gpu_instance_id, pa[0].compute_instance_id),
        (Some(2), Some(0))
    );
    let pb = b.running_compute_processes().unwrap();
    assert_eq!(
        (pb[0].pid, pb[0].gpu_instance_id, pb[0].compute_instance_id),
        (52, Some(2), Some(1))
    );
    // Another GPU instance has its own memory.
    assert_eq!(c.memory_info().unwrap().total, 4_864 * MB);
}

/// Under MPS the compute list shows the MPS server and the MPS list its clients
/// (host pids, as any list); a GPU without MPS answers an empty MPS list.
#[test]
fn under_mps_the_clients_are_in_the_mps_list() {
    let uuid = unique_uuid("GPU", "mps");
    let sim = SimGpus::new(vec![
        SimGpu::h100_80gb()
            .uuid(&uuid)
            .compute_mode(SimComputeMode::ExclusiveProcess)
            .mps(4_242, 300)
            .mps_process(77, 900)
            .workers_use(1_500)
            .pid_namespace_offset(50_000)
            .free_follows_processes(),
        SimGpu::a100_40gb().workers_use(1_000),
    ]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    let w = Placed::on(&uuid);
    let gpu = nvml.device_by_index(0).unwrap();
    assert_eq!(gpu.compute_mode().unwrap(), ComputeMode::ExclusiveProcess);
    let compute = gpu.running_compute_processes().unwrap();
    assert_eq!(
        compute.iter().map(|p| p.pid).collect::<Vec<_>>(),
        vec![4_242]
    );
    assert_eq!(used(&compute[0]), Some(300 * MB));
    let clients = gpu.mps_running_compute_processes().unwrap();
    assert_eq!(
        clients.iter().map(|p| (p.pid, used(p))).collect::<Vec<_>>(),
        vec![(77, Some(900 * MB)), (w.pid() + 50_000, Some(1_500 * MB))]
    );
    // Free memory follows the server and its clients.
    assert_eq!(gpu.memory_info().unwrap().used, (300 + 900 + 1_500) * MB);
    let plain = nvml.device_by_index(1).unwrap();
    assert!(plain.mps_running_compute_processes().unwrap().is_empty());
}

#[test]
fn mig_parent_aggregates_need_privileges() {
    let sim = SimGpus::new(vec![SimGpu::a100_40gb().mig(
        SimMig::enabled()
            .unprivileged()
            .instance(SimMigInstance::a100_1g_5gb("MIG-unpriv-0", 1).process(31, 200)),
    )]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    let gpu = nvml.device_by_index(0).unwrap();
    assert!(matches!(gpu.memory_info(), Err(NvmlError::NoPermission)));
    assert!(matches!(
        gpu.running_compute_processes(),
        Err(NvmlError::NoPermission)
    ));
    // Per instance it works.
    let m = gpu.mig_device_by_index(0).unwrap();
    assert_eq!(m.memory_info().unwrap().total, 4_864 * MB);
    assert_eq!(m.running_compute_processes().unwrap()[0].pid, 31);
}

#[test]
fn injected_errors_come_back_as_nvml_errors() {
    let sim = SimGpus::new(vec![
        SimGpu::a100_40gb().mig(
            SimMig::enabled().instance(
                SimMigInstance::a100_1g_5gb("MIG-err-0", 1)
                    .error("nvmlDeviceGetUUID", nvml_return::NO_PERMISSION),
            ),
        ),
        SimGpu::t4().error("nvmlDeviceGetMemoryInfo_v2", nvml_return::GPU_IS_LOST),
        SimGpu::t4().error("nvmlDeviceGetHandleByIndex_v2", nvml_return::NOT_FOUND),
    ])
    .error("nvmlDeviceGetComputeMode", nvml_return::NOT_SUPPORTED)
    .error(
        "nvmlSystemGetCudaDriverVersion_v2",
        nvml_return::FUNCTION_NOT_FOUND,
    );
    let s = Sim::new(&sim);
    let nvml = s.nvml();

    // Top level: every device, and the system calls.
    let gpu0 = nvml.device_by_index(0).unwrap();
    let gpu1 = nvml.device_by_index(1).unwrap();
    let mig = gpu0.mig_device_by_index(0).unwrap();
    for d in [&gpu0, &gpu1, &mig] {
        assert!(matches!(d.compute_mode(), Err(NvmlError::NotSupported)));
    }
    assert!(matches!(
        nvml.sys_cuda_driver_version(),
        Err(NvmlError::FunctionNotFound)
    ));
    assert_eq!(nvml.sys_driver_version().unwrap(), "580.65.06");

    // Per GPU: only that GPU, only that function (v1 still answers).
    assert!(matches!(gpu1.memory_info(), Err(NvmlError::GpuLost)));
    assert_eq!(memory_v1(&nvml, &gpu1).0, 15_360 * MB);
    assert_eq!(gpu0.memory_info().unwrap().total, 40_960 * MB);
    assert!(matches!(nvml.device_by_index(2), Err(NvmlError::NotFound)));

    // Per MIG instance: not its parent.
    assert!(matches!(mig.uuid(), Err(NvmlError::NoPermission)));
    assert!(gpu0.uuid().is_ok());
    assert_eq!(mig.memory_info().unwrap().total, 4_864 * MB);

    // The error strings NVML gives.
    let f = nvml.lib().nvmlErrorString.as_ref().expect("symbol");
    for (code, text) in [
        (nvml_return::NOT_SUPPORTED, "Not Supported"),
        (nvml_return::NO_PERMISSION, "Insufficient Permissions"),
        (nvml_return::NOT_FOUND, "Not Found"),
        (nvml_return::GPU_IS_LOST, "GPU is lost"),
    ] {
        // SAFETY: nvmlErrorString returns a static NUL-terminated string.
        let got = unsafe { std::ffi::CStr::from_ptr(f(code)) };
        assert_eq!(got.to_str().unwrap(), text);
    }
}

#[test]
fn process_records_keep_nvml_layouts() {
    let sim = SimGpus::new(vec![SimGpu::a100_40gb()
        .process(11, 100)
        .process_unavailable(12)
        .process(13, 300)]);
    let s = Sim::new(&sim);
    let nvml = s.nvml();
    let d = nvml.device_by_index(0).unwrap();

    // v3 (`nvmlProcessInfo_t`), through nvml-wrapper: no MIG, so no instance IDs.
    let procs = d.running_compute_processes().unwrap();
    assert_eq!(
        procs.iter().map(|p| (p.pid, used(p))).collect::<Vec<_>>(),
        vec![(11, Some(100 * MB)), (12, None), (13, Some(300 * MB))]
    );
    assert!(procs
        .iter()
        .all(|p| p.gpu_instance_id.is_none() && p.compute_instance_id.is_none()));
    assert_eq!(d.running_compute_processes_count().unwrap(), 3);

    // The legacy symbols (`nvml-wrapper` binds them only with its `legacy-functions`
    // feature), with nvml.h's layouts: v1 = {pid, usedGpuMemory}, v2 = `nvmlProcessInfo_t`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct InfoV1 {
        pid: u32,
        used: u64,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct InfoV2 {
        pid: u32,
        used: u64,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    }
    assert_eq!(std::mem::size_of::<InfoV1>(), 16);
    assert_eq!(std::mem::size_of::<InfoV2>(), 24);
    type Query<T> = unsafe extern "C" fn(*mut std::ffi::c_void, *mut u32, *mut T) -> u32;
    let path = std::ffi::CString::new(s.lib.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the library nvml-wrapper already loaded (same path, so the same instance).
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!lib.is_null());
    let sym = |name: &std::ffi::CStr| {
        // SAFETY: `lib` is a live dlopen handle.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        assert!(!p.is_null(), "{name:?}");
        p
    };
    // SAFETY: the mock exports these with exactly these C signatures.
    let v1: Query<InfoV1> =
        unsafe { std::mem::transmute(sym(c"nvmlDeviceGetComputeRunningProcesses")) };
    // SAFETY: as above.
    let v2: Query<InfoV2> =
        unsafe { std::mem::transmute(sym(c"nvmlDeviceGetComputeRunningProcesses_v2")) };
    // SAFETY: a handle from this NVML.
    let handle = unsafe { d.handle() }.cast::<std::ffi::c_void>();

    // The two-call protocol: a null buffer asks for the count.
    let mut count = 0;
    // SAFETY: `count` is writable; a null buffer is allowed.
    let r = unsafe { v1(handle, &mut count, std::ptr::null_mut()) };
    assert_eq!((r, count), (nvml_return::INSUFFICIENT_SIZE, 3));
    let mut small = [InfoV1 { pid: 0, used: 0 }; 2];
    count = 2;
    // SAFETY: `small` holds `count` records.
    let r = unsafe { v1(handle, &mut count, small.as_mut_ptr()) };
    assert_eq!(
        (r, count),
        (nvml_return::INSUFFICIENT_SIZE, 3),
        "too small a buffer"
    );

    let mut buf = [InfoV1 { pid: 0, used: 0 }; 4];
    count = 4;
    // SAFETY: `buf` holds `count` records.
    let r = unsafe { v1(handle, &mut count, buf.as_mut_ptr()) };
    assert_eq!((r, count), (0, 3));
    let got: Vec<(u32, u64)> = buf[..3].iter().map(|p| (p.pid, p.used)).collect();
    assert_eq!(got, vec![(11, 100 * MB), (12, u64::MAX), (13, 300 * MB)]);

    let blank = InfoV2 {
        pid: 0,
        used: 0,
        gpu_instance_id: 0,
        compute_instance_id: 0,
    };
    let mut buf = [blank; 4];
    count = 4;
    // SAFETY: `buf` holds `count` records.
    let r = unsafe { v2(handle, &mut count, buf.as_mut_ptr()) };
    assert_eq!((r, count), (0, 3));
    assert_eq!((buf[2].pid, buf[2].used), (13, 300 * MB));
    assert!(buf[..3]
        .iter()
        .all(|p| p.gpu_instance_id == u32::MAX && p.compute_instance_id == u32::MAX));
    assert_eq!(buf[3].pid, 0, "nothing written past the count");
    // SAFETY: balances the dlopen above; nvml-wrapper still holds its own reference.
    unsafe { libc::dlclose(lib) };
}
