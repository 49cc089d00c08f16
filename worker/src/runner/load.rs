//! Loading the TorchScript model: picking the device (`auto` = CUDA when libtorch sees a
//! GPU), `CModule::load_on_device`, eval mode, and the allocator cap on CUDA. Every failure
//! is one [`LoadError`] whose message names the file and the reason.

use std::path::Path;
use std::time::Instant;

use tch::{CModule, Device};
use vramfork::protocol::Device as Wanted;

use crate::cuda;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load model {path}: {reason}")]
    Model { path: String, reason: String },
    #[error(
        "cannot load model {path}: device `cuda` was asked for, but libtorch sees no CUDA device"
    )]
    NoCuda { path: String },
}

pub struct Loaded {
    pub module: CModule,
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
    match wanted {
        Wanted::Cpu => Ok(Device::Cpu),
        Wanted::Auto if cuda => Ok(Device::Cuda(0)),
        Wanted::Auto => Ok(Device::Cpu),
        Wanted::Cuda if cuda => Ok(Device::Cuda(0)),
        Wanted::Cuda => Err(LoadError::NoCuda { path: path.into() }),
    }
}

/// Loads the model on the CPU on the calling thread, for the template process.
pub fn load_cpu(path: &str) -> Result<CModule, LoadError> {
    load(path, Device::Cpu, None).map(|l| l.module)
}

/// Loads the model on `device`; on CUDA, caps the caching allocator at `memory_fraction`.
pub fn load(path: &str, device: Device, memory_fraction: Option<f64>) -> Result<Loaded, LoadError> {
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
    let mut module =
        CModule::load_on_device(path, device).map_err(|e| fail(first_line(&e.to_string())))?;

    module
        .f_set_eval()
        .map_err(|e| fail(first_line(&e.to_string())))?;
    let model_ms = start.elapsed().as_secs_f64() * 1e3;
    if let (Device::Cuda(i), Some(f)) = (device, memory_fraction) {
        if let Err(e) = cuda::set_memory_fraction(i, f) {
            tracing::warn!("could not cap the CUDA allocator at {f} of the GPU: {e}");
        }
    }
    Ok(Loaded {
        module,
        device,
        model_ms,
    })
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
    if let Some(i) = line.find("PytorchStreamReader failed") {
        // "… failed reading zip archive: failed finding central directory. This is an
        // internal miniz error. If you are seeing this error, …": keep the first sentence.
        let detail = &line[i..];
        let detail = detail.split(". ").next().unwrap_or(detail);
        format!(
            "not a TorchScript archive ({detail}); export the model with torch.jit.trace or torch.jit.script and save it with .save(path) (a state_dict, a pickled model or a torch.export file is not TorchScript)"
        )
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            first_line("Internal torch error:\nUnknown builtin op: torchvision::nms.\nCould not find any similar ops to torchvision::nms. This op may not exist or may not be currently supported in TorchScript.\n:\n  File \"code/__torch__.py\", line 8"),
            "Internal torch error: Unknown builtin op: torchvision::nms."
        );
    }
}
