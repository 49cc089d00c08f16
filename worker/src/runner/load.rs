//! Loading the model: picking the device (`auto` = CUDA when libtorch sees a GPU, and for a
//! `torch.export` archive the device it was exported on; a worker the plan placed on a GPU is
//! told `cuda`, never `auto`), the allocator cap on CUDA (before the weights arrive, so they
//! count against it), the load itself (TorchScript: `CModule::load_on_device` and eval mode;
//! a `.pt2`: the Native Runtime, after its signature is read and checked against the
//! metadata), and a check that the weights left room under the cap. Every failure is one
//! [`LoadError`] whose message names the file and the reason.

use std::path::Path;
use std::time::Instant;

use tch::{CModule, Device};
use vramfork::metadata::TensorSpec;
use vramfork::protocol::Device as Wanted;

use super::model::{is_exported, Model};
use crate::{cuda, exported};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load model {path}: {reason}")]
    Model { path: String, reason: String },
    #[error(
        "cannot load model {path}: this worker must run on a GPU, but libtorch sees no CUDA device (libtorch's own reason, if any, is on stderr above: 'CUDA initialization: …')"
    )]
    NoCuda { path: String },
    /// The metadata's declared inputs cannot be passed to the model's `forward` (found by
    /// the warm-up pass: libtorch checks the arguments against the schema before running).
    #[error(
        "model {path}: the metadata declares the inputs [{declared}], which its forward() does not take: {reason}. Declare every argument of forward() (after self) in the metadata's `inputs`, in order"
    )]
    Signature {
        path: String,
        declared: String,
        reason: String,
    },
    /// A warm-up pass on the declared inputs failed (not for lack of GPU memory): the
    /// metadata's shapes or dtypes are not what the model takes, and every such request
    /// would fail.
    #[error(
        "model {path}: the warm-up pass on the declared input shapes ({shapes}) failed: {reason}. The metadata's declared inputs must be what the model takes: check each shape's order (a model traced on [1, 3, 224, 224] takes channels first, NCHW: declare [-1, 3, 224, 224], not [-1, 224, 224, 3]) and its dtype, or give `warmup_inputs` a shape it takes; --warmup-passes 0 skips this check"
    )]
    Warmup {
        path: String,
        shapes: String,
        reason: String,
    },
    /// The GPU context failed during the warm-up: a sticky CUDA error, or the device
    /// failing when the pass was waited for.
    #[error("model {path}: {reason}")]
    CudaFatal { path: String, reason: String },
    /// The caching allocator's cap could not be set: running uncapped would break the plan.
    #[error("cannot cap the CUDA allocator at {cap_mb} MB for model {path}: {reason}")]
    Cap {
        path: String,
        cap_mb: u64,
        reason: String,
    },
    /// The weights alone leave too little of the cap for a forward pass, or did not fit
    /// under it at all (`weights_mb` unknown: loading them ran out of memory).
    #[error(
        "model {path}: its weights {} this worker's allocator cap of {cap_mb} MB; every request would get 507. Raise est_gpu_mem_typ (fewer workers per GPU) or --gpu-memory-utilization",
        match weights_mb {
            Some(w) if w >= cap_mb => format!("take {w} MB on the GPU, at least"),
            Some(w) => format!("take {w} MB on the GPU, nearly all of"),
            None => "ran out of memory while loading under".to_string(),
        }
    )]
    TooBig {
        path: String,
        weights_mb: Option<u64>,
        cap_mb: u64,
    },
}

impl LoadError {
    /// The worker's exit status for it: no CUDA at all (the machine cannot serve on its
    /// GPUs as planned), or a load that failed and may be retried (a cap not set because the
    /// GPU was busy or full is such a failure, fatal to this worker only).
    pub fn exit_code(&self) -> i32 {
        use vramfork::protocol::worker_exit;
        match self {
            LoadError::NoCuda { .. } => worker_exit::NO_CUDA,
            LoadError::CudaFatal { .. } => worker_exit::CUDA_FATAL,
            LoadError::Cap { .. }
            | LoadError::Model { .. }
            | LoadError::TooBig { .. }
            | LoadError::Signature { .. }
            | LoadError::Warmup { .. } => worker_exit::MODEL_LOAD,
        }
    }
}

/// Weights past this share of the cap leave too little for any forward pass.
const WEIGHTS_SHARE_LIMIT: f64 = 0.95;

/// What the metadata says `forward` takes (a document input as the tensors it becomes:
/// [`super::declared`]), checked at load where the format records what it takes (a
/// `torch.export` program's signature).
#[derive(Debug, Clone, Default)]
pub struct Declared {
    pub inputs: Option<Vec<TensorSpec>>,
    pub max_batch_size: u32,
    /// The plan put the worker on a GPU (a simulated one too): a compiled package must be
    /// compiled for CUDA, and for the GPU's compute capability when the master told it.
    pub plan_gpu: bool,
    pub capability: Option<String>,
}

impl Declared {
    pub fn of(metadata: &vramfork::metadata::AppMetadata, max_batch_size: u32) -> Declared {
        Declared {
            inputs: metadata
                .inputs
                .as_deref()
                .map(super::declared::as_forward_takes),
            max_batch_size,
            plan_gpu: false,
            capability: None,
        }
    }

    /// With the GPU the plan put the worker on, if any.
    pub fn placed(self, gpu: Option<&vramfork::protocol::GpuAssignment>) -> Declared {
        Declared {
            plan_gpu: gpu.is_some(),
            capability: gpu.and_then(|g| g.compute_capability.clone()),
            ..self
        }
    }
}

pub struct Loaded {
    pub module: Model,
    pub device: Device,
    pub model_ms: f64,
}

/// TorchScript's profiling executor spends the first forward passes profiling and
/// re-optimising (measured on the MLP fixture, CPU: first forward 31–64 ms with it, 2.5–7 ms
/// without; steady state ~0.4 ms either way). With recycling, first passes are a large share
/// of all passes, so the worker uses the simple executor.
pub fn configure_executor() {
    tch::jit::set_profiling_mode(false);
}

pub fn pick_device(wanted: Wanted, path: &str) -> Result<Device, LoadError> {
    let cuda = cuda::is_available();
    if matches!(wanted, Wanted::Auto) && is_exported(path) {
        // A program runs where it was exported (an unreadable one fails its load below).
        let on_gpu = exported::open(path).is_ok_and(|(_, s)| s.device == "cuda");
        return Ok(if on_gpu && cuda {
            Device::Cuda(0)
        } else {
            Device::Cpu
        });
    }
    match wanted {
        Wanted::Cpu => Ok(Device::Cpu),
        Wanted::Auto if cuda => Ok(Device::Cuda(0)),
        Wanted::Auto => Ok(Device::Cpu),
        Wanted::Cuda if cuda => Ok(Device::Cuda(0)),
        Wanted::Cuda => Err(LoadError::NoCuda { path: path.into() }),
    }
}

/// Loads the model on the CPU on the calling thread, for the template process.
/// What the metadata declares is checked as [`load`] checks it.
pub fn load_cpu(
    path: &str,
    metadata: &vramfork::metadata::AppMetadata,
    max_batch_size: u32,
) -> Result<Model, LoadError> {
    let declared = Declared::of(metadata, max_batch_size);
    load(path, Device::Cpu, None, &declared).map(|l| l.module)
}

/// Loads the model on `device`; on CUDA, first caps the caching allocator at `cap_bytes`.
pub fn load(
    path: &str,
    device: Device,
    cap_bytes: Option<u64>,
    declared: &Declared,
) -> Result<Loaded, LoadError> {
    let fail = |reason: String| LoadError::Model {
        path: path.into(),
        reason,
    };
    if !Path::new(path).is_file() {
        return Err(fail(if Path::new(path).exists() {
            "not a regular file".into()
        } else {
            "no such file".into()
        }));
    }
    let start = Instant::now();
    if let (Device::Cuda(i), Some(cap)) = (device, cap_bytes) {
        let set = cuda::cap_allocator(i, cap).map_err(|e| LoadError::Cap {
            path: path.into(),
            cap_mb: cap >> 20,
            reason: e.to_string(),
        })?;
        tracing::info!(
            cap_mb = cap >> 20,
            fraction = set.fraction,
            allowed_mb = set.allowed >> 20,
            total_global_mb = set.total >> 20,
            "CUDA allocator capped at {} MB, read back ({} of totalGlobalMem {} MB)",
            set.allowed >> 20,
            set.fraction,
            set.total >> 20
        );
    }
    let room = device_room(device);
    let module = if is_exported(path) {
        load_exported(path, device, declared)?
    } else {
        Model::TorchScript(load_torchscript(path, device, cap_bytes)?)
    };
    let model_ms = start.elapsed().as_secs_f64() * 1e3;
    if let (Device::Cuda(i), Some(cap)) = (device, cap_bytes) {
        let cap = match &module {
            Model::Aoti(p) => package_cap(path, i, cap, room, p.weights_in_allocator())?,
            _ => cap,
        };
        let weights = cuda::memory_stats(i).map(|s| s.allocated).unwrap_or(0);
        if too_big(weights, cap) {
            return Err(LoadError::TooBig {
                path: path.into(),
                weights_mb: Some(weights >> 20),
                cap_mb: cap >> 20,
            });
        }
    }
    Ok(Loaded {
        module,
        device,
        model_ms,
    })
}

/// The device's free memory and the caching allocator's reserved bytes now (`None` on the
/// CPU, or when either cannot be read).
fn device_room(device: Device) -> Option<(u64, u64)> {
    let Device::Cuda(i) = device else {
        return None;
    };
    let free = cuda::free_memory(i).ok()?;
    let reserved = cuda::memory_stats(i).ok()?.reserved;
    Some((free, reserved))
}

/// What a package's weights allocated outside the caching allocator leave of its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutsideCap {
    /// Nothing (to speak of) outside: the cap stands.
    Within,
    /// The cap, lowered by what was allocated outside it, so that both together stay
    /// within what the plan gave the worker.
    Lower { cap: u64 },
    /// What was allocated outside leaves too little of the cap for any pass.
    TooBig,
}

/// Below this, what the device lost across a load is noise (the context's own growth).
const OUTSIDE_NOISE: u64 = 4 << 20;

/// A package's weights against the allocator's `cap`: `raw` is what the device lost across
/// the load beyond what the caching allocator reserved. A package compiled with its weights
/// in the allocator (`in_allocator`) is checked by the allocator's own count instead.
fn outside_cap(cap: u64, raw: u64, in_allocator: bool) -> OutsideCap {
    if in_allocator || raw < OUTSIDE_NOISE {
        OutsideCap::Within
    } else if too_big(raw, cap) {
        OutsideCap::TooBig
    } else {
        OutsideCap::Lower { cap: cap - raw }
    }
}

/// After a package's load on CUDA device `i`: by default torch 2.11 `cudaMalloc`s a
/// package's weights (`RAII_gpuMalloc` in `aoti_runtime/model_base.h`), outside the caching
/// allocator and its cap, so the cap that bounds everything else is lowered by them (or the
/// worker refused as too big); `room` is the device's free memory and the allocator's
/// reservation before the load. Returns the cap in force.
fn package_cap(
    path: &str,
    i: usize,
    cap: u64,
    room: Option<(u64, u64)>,
    in_allocator: bool,
) -> Result<u64, LoadError> {
    let Some(((free, reserved), (free_after, reserved_after))) =
        room.zip(device_room(Device::Cuda(i)))
    else {
        return Ok(cap);
    };
    let raw = free
        .saturating_sub(free_after)
        .saturating_sub(reserved_after.saturating_sub(reserved));
    let hint = "compile the package with AOT_INDUCTOR_WEIGHT_USE_CACHING_ALLOCATOR=1 (aot_inductor.weight_use_caching_allocator) to keep its weights under the cap";
    match outside_cap(cap, raw, in_allocator) {
        OutsideCap::Within => Ok(cap),
        OutsideCap::TooBig => {
            tracing::warn!(
                outside_mb = raw >> 20,
                cap_mb = cap >> 20,
                "the package's weights took {} MB outside the CUDA allocator: {hint}",
                raw >> 20
            );
            Err(LoadError::TooBig {
                path: path.into(),
                weights_mb: Some(raw >> 20),
                cap_mb: cap >> 20,
            })
        }
        OutsideCap::Lower { cap: lowered } => {
            let set = cuda::cap_allocator(i, lowered).map_err(|e| LoadError::Cap {
                path: path.into(),
                cap_mb: lowered >> 20,
                reason: e.to_string(),
            })?;
            tracing::warn!(
                event = "package_weights_outside_cap",
                outside_mb = raw >> 20,
                cap_mb = cap >> 20,
                lowered_mb = set.allowed >> 20,
                "the package's weights took {} MB outside the CUDA allocator; its cap is lowered from {} MB to {} MB so that both stay within the plan: {hint}",
                raw >> 20,
                cap >> 20,
                set.allowed >> 20
            );
            Ok(lowered)
        }
    }
}

/// A TorchScript file, in eval mode.
fn load_torchscript(
    path: &str,
    device: Device,
    cap_bytes: Option<u64>,
) -> Result<CModule, LoadError> {
    let fail = |reason: String| LoadError::Model {
        path: path.into(),
        reason,
    };
    let mut module = CModule::load_on_device(path, device).map_err(|e| {
        let msg = e.to_string();
        match (device, cap_bytes) {
            // Under a cap, running out of memory while loading means the weights do not fit.
            (Device::Cuda(_), Some(cap)) if crate::runner::is_out_of_memory(&msg) => {
                LoadError::TooBig {
                    path: path.into(),
                    weights_mb: None,
                    cap_mb: cap >> 20,
                }
            }
            _ => fail(first_line(&msg)),
        }
    })?;

    module
        .f_set_eval()
        .map_err(|e| fail(first_line(&e.to_string())))?;
    Ok(module)
}

/// A `torch.export` archive: its signature read and checked against the metadata, then its
/// program loaded with the Native Runtime, on the device it was exported on.
fn load_exported(path: &str, device: Device, declared: &Declared) -> Result<Model, LoadError> {
    let fail = |reason: String| LoadError::Model {
        path: path.into(),
        reason,
    };
    if let Ok(exported::archive::Kind::Aoti) = exported::archive::kind(path) {
        return load_aoti(path, device, declared).map_err(fail);
    }
    let (name, signature) = exported::open(path).map_err(|e| fail(exported_line(&e)))?;
    let on_gpu = signature.device == "cuda";
    if let (Device::Cuda(_), Some(i @ 1..)) = (device, signature.device_index) {
        // torch::nativert::ModelRunner applies an empty Placement (no device map) and
        // ModelRunnerHandle takes no device: weights and graph stay where they were saved.
        return Err(fail(format!(
            "it was exported on cuda:{i}, and the Native Runtime runs it on the device it was exported on (ModelRunnerHandle takes no device), while a worker sees its own GPU as cuda:0: export it with the model and example inputs on cuda:0"
        )));
    }
    match (device, on_gpu) {
        (Device::Cuda(_), false) => return Err(fail(
            "it was exported on the CPU (its inputs and weights are CPU tensors), but this worker runs on a GPU: export the model and its example inputs on the GPU to serve it there, or serve it with --device cpu".into(),
        )),
        (Device::Cpu, true) => return Err(fail(
            "it was exported on a GPU (its inputs and weights are CUDA tensors), but this worker runs on the CPU: export it on the CPU to serve it there".into(),
        )),
        _ => {}
    }
    signature
        .check_declared(declared.inputs.as_deref(), declared.max_batch_size)
        .map_err(fail)?;
    exported::Program::load(path, &name, signature)
        .map(Model::Exported)
        .map_err(|e| fail(exported_line(&e)))
}

/// An AOTInductor package: checked (device, CPU, threads, inputs against the metadata),
/// then unpacked and loaded; a short batch is padded to its minimum rows only with batching.
fn load_aoti(path: &str, device: Device, declared: &Declared) -> Result<Model, String> {
    let names: Vec<String> = declared
        .inputs
        .iter()
        .flatten()
        .map(|s| s.name.clone())
        .collect();
    let at = exported::Placement {
        gpu: declared.plan_gpu || device.is_cuda(),
        capability: declared.capability.clone(),
        cuda: device.is_cuda(),
    };
    let checked = exported::aoti::check(path, &at, &names)?;
    checked
        .signature()
        .check_declared(declared.inputs.as_deref(), declared.max_batch_size)?;
    let pad = declared.max_batch_size > 0;
    let root = exported::aoti::unpack_root();
    let on = match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_string(),
    };
    exported::Package::load(checked, &on, pad, &root).map(Model::Aoti)
}

/// The archive reader's or the Native Runtime's message, on one line, with the way out for
/// a file that is no archive at all.
fn exported_line(msg: &str) -> String {
    let line = first_line(msg);
    if line.contains("PytorchStreamReader failed") || line.contains("not a TorchScript archive") {
        let detail = msg.lines().next().unwrap_or(msg);
        let detail = detail.split(". ").next().unwrap_or(detail);
        return format!(
            "not a torch.export archive ({detail}); save the model with torch.export.save(torch.export.export(model, example_inputs), path)"
        );
    }
    line
}

/// Whether weights of `weights` bytes leave too little of a `cap`-byte allocator cap.
fn too_big(weights: u64, cap: u64) -> bool {
    weights as f64 > cap as f64 * WEIGHTS_SHARE_LIMIT
}

/// libtorch messages carry a C++ backtrace after the first line; keep the useful part. A
/// first line that only introduces the message ("Internal torch error:") is joined with the
/// line after it, where libtorch puts what went wrong ("Unknown builtin op: …").
fn first_line(msg: &str) -> String {
    let mut lines = msg.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("unknown error");
    let line = match lines.next() {
        Some(next) if first.ends_with(':') => format!("{first} {next}"),
        _ => first.to_string(),
    };
    let core_op = ["Unknown builtin op: aten::", "Unknown builtin op: prim::"]
        .iter()
        .any(|p| line.contains(p));
    if line.contains("Unknown builtin op:") && core_op {
        return format!(
            "{line} The model uses an operator of a newer libtorch than this one (torch 2.11): export it with torch 2.11"
        );
    }
    if line.contains("Unknown builtin op:") {
        // A custom operator (torchvision::nms, …) whose library is not in the process.
        return format!(
            "{line} The model calls an operator libtorch does not define: list the shared library that registers it in the metadata's op_libraries (for torchvision's operators: torchvision/_C.so from the torchvision wheel matching torch, after libpython3.X.so.1.0)"
        );
    }
    if let Some(i) = line.find("PytorchStreamReader failed") {
        // "… failed reading zip archive: failed finding central directory. This is an
        // internal miniz error. If you are seeing this error, …": keep the first sentence.
        let detail = &line[i..];
        let detail = detail.split(". ").next().unwrap_or(detail);
        format!(
            "not a TorchScript archive ({detail}); export the model with torch.jit.trace or torch.jit.script and save it with .save(path) (a state_dict or a pickled model is not TorchScript; a torch.export.save archive is served when its name ends in .pt2)"
        )
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_filling_the_cap_are_refused_with_the_way_out() {
        let mb = 1u64 << 20;
        assert!(!too_big(900 * mb, 1000 * mb));
        assert!(too_big(960 * mb, 1000 * mb));
        assert!(too_big(2000 * mb, 1000 * mb));
        let e = LoadError::TooBig {
            path: "m.pt".into(),
            weights_mb: Some(2000),
            cap_mb: 1000,
        };
        let msg = e.to_string();
        assert!(
            msg.contains(
                "weights take 2000 MB on the GPU, at least this worker's allocator cap of 1000 MB"
            ),
            "{msg}"
        );
        assert!(msg.contains("Raise est_gpu_mem_typ"), "{msg}");
        assert_eq!(e.exit_code(), vramfork::protocol::worker_exit::MODEL_LOAD);
        let cap = LoadError::Cap {
            path: "m.pt".into(),
            cap_mb: 1000,
            reason: "CUDA allocator: Allocator not initialized".into(),
        };
        assert_eq!(cap.exit_code(), vramfork::protocol::worker_exit::MODEL_LOAD);
        let unknown = LoadError::TooBig {
            path: "m.pt".into(),
            weights_mb: None,
            cap_mb: 1000,
        };
        assert!(unknown
            .to_string()
            .contains("its weights ran out of memory while loading under this worker's allocator cap of 1000 MB"));
        assert_eq!(
            LoadError::NoCuda {
                path: "m.pt".into()
            }
            .exit_code(),
            vramfork::protocol::worker_exit::NO_CUDA
        );
    }

    /// A package's weights allocated outside the caching allocator lower its cap by as
    /// much, or refuse the worker when they leave too little; compiled into the allocator,
    /// or nothing outside, the cap stands.
    #[test]
    fn a_packages_weights_outside_the_allocator_lower_its_cap() {
        let mb = 1u64 << 20;
        assert_eq!(
            outside_cap(4000 * mb, 1000 * mb, false),
            OutsideCap::Lower { cap: 3000 * mb }
        );
        assert_eq!(outside_cap(4000 * mb, 3900 * mb, false), OutsideCap::TooBig);
        assert_eq!(outside_cap(4000 * mb, 5000 * mb, false), OutsideCap::TooBig);
        assert_eq!(outside_cap(4000 * mb, 1000 * mb, true), OutsideCap::Within);
        assert_eq!(outside_cap(4000 * mb, mb, false), OutsideCap::Within);
    }

    /// Docs/options.md says what the code does with a cap that cannot be
    /// set (a failed load, exit 3), not exit 7 or 5.
    #[test]
    fn the_exit_status_docs_put_a_cap_not_set_under_3() {
        let cap = LoadError::Cap {
            path: "m.pt".into(),
            cap_mb: 1000,
            reason: "x".into(),
        };
        assert_eq!(cap.exit_code(), 3);
        let doc = include_str!("../../../docs/options.md");
        let row = |status: &str| {
            doc.lines()
                .find(|l| l.starts_with(&format!("| {status} |")))
                .unwrap_or_else(|| panic!("docs/options.md has no row for exit status {status}"))
        };
        assert!(
            row("3").contains("allocator cap could not be set"),
            "{}",
            row("3")
        );
        assert!(!row("5").contains("cap"), "{}", row("5"));
        assert!(
            doc.contains("A worker whose CUDA allocator cap cannot be set (the GPU busy or full as it starts) exits 3"),
            "docs/options.md says what a worker does with a cap it cannot set"
        );
    }

    /// A `.pt2` runs where it was exported: a CPU export on a worker placed on a GPU is
    /// refused before anything touches CUDA, naming the way out.
    #[test]
    fn a_program_exported_on_the_cpu_is_refused_on_a_gpu_worker() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/mlp.pt2");
        let declared = Declared::default();
        let Err(e) = load(path, Device::Cuda(0), None, &declared) else {
            panic!("a CPU export loaded for a GPU worker");
        };
        let msg = e.to_string();
        assert!(
            msg.contains("it was exported on the CPU")
                && msg.contains("or serve it with --device cpu"),
            "{msg}"
        );
        assert_eq!(e.exit_code(), vramfork::protocol::worker_exit::MODEL_LOAD);
        assert!(load(path, Device::Cpu, None, &declared).is_ok());
    }

    #[test]
    fn load_errors_are_one_short_line() {
        let e = first_line("Internal torch error: PytorchStreamReader failed reading zip archive: failed finding central directory. This is an internal miniz error. If you are seeing this error, …\nException raised from x");
        assert!(
            e.starts_with("not a TorchScript archive (PytorchStreamReader failed reading zip archive: failed finding central directory); export the model with torch.jit.trace or torch.jit.script"),
            "{e}"
        );
        assert_eq!(first_line("\n  boom\nframe #0"), "boom");
        // libtorch 2.11's message for a model calling an operator whose library is not
        // loaded: the cause is on the second line.
        let op = first_line("Internal torch error:\nUnknown builtin op: torchvision::nms.\nCould not find any similar ops to torchvision::nms. This op may not exist or may not be currently supported in TorchScript.\n:\n  File \"code/__torch__.py\", line 8");
        assert!(
            op.starts_with("Internal torch error: Unknown builtin op: torchvision::nms. The model calls an operator libtorch does not define: list the shared library that registers it in the metadata's op_libraries"),
            "{op}"
        );
    }
}
