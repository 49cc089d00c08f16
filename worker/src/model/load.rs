//! Loading the model: picking the device (`auto` = CUDA when libtorch sees a GPU, and for a
//! `torch.export` archive the device it was exported on; a worker the plan placed on a GPU is
//! told `cuda`, never `auto`), the allocator cap on CUDA (before the weights arrive, so they
//! count against it), the load itself (TorchScript: `CModule::load_on_device` and eval mode;
//! a `.pt2`: the Native Runtime, after its signature is read and checked against the
//! metadata), and a check that the weights left room under the cap. Every failure is one
//! [`LoadError`] whose message names the file and the reason.

use std::path::Path;
use std::time::Instant;

use tch::Device;
use vramfork::protocol::Device as Wanted;

use super::declared::Declared;
use super::load_error::{too_big, LoadError};
use super::{is_exported, package, program, torchscript, Format, Model};
use crate::{cuda, exported};

pub struct Loaded {
    pub module: Model,
    pub device: Device,
    pub model_ms: f64,
}

pub fn pick_device(wanted: Wanted, path: &str) -> Result<Device, LoadError> {
    let cuda = cuda::is_available();
    if matches!(wanted, Wanted::Auto) && is_exported(path) {
        // A program runs where it was exported (an unreadable one fails its load below).
        let on_gpu = exported::open(path).is_ok_and(|(_, s, _)| s.device == "cuda");
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
    let room = package::device_room(device);
    let module = match Format::of(path) {
        Format::TorchScript if declared.detector => {
            Model::Detector(torchscript::load(path, device, cap_bytes)?)
        }
        Format::TorchScript => Model::TorchScript(torchscript::load(path, device, cap_bytes)?),
        Format::Program => program::load(path, device, declared)?,
        Format::Package => package::load(path, device, declared).map_err(fail)?,
    };
    let model_ms = start.elapsed().as_secs_f64() * 1e3;
    if let (Device::Cuda(i), Some(cap)) = (device, cap_bytes) {
        let cap = match &module {
            Model::Aoti(p) => package::cap(path, i, cap, room, p.weights_in_allocator())?,
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
