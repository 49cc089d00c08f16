//! A TorchScript module (`tch::CModule`, a `.pt` of `torch.jit.trace`/`script`): loaded with
//! `CModule::load_on_device`, in eval mode, under the simple executor.

use tch::{CModule, Device};

use super::load_error::{first_line, LoadError};

/// TorchScript's profiling executor spends the first forward passes profiling and
/// re-optimising (measured on the MLP fixture, CPU: first forward 31–64 ms with it, 2.5–7 ms
/// without; steady state ~0.4 ms either way). With recycling, first passes are a large share
/// of all passes, so the worker uses the simple executor.
pub fn configure_executor() {
    tch::jit::set_profiling_mode(false);
}

/// A TorchScript file, in eval mode.
pub fn load(path: &str, device: Device, cap_bytes: Option<u64>) -> Result<CModule, LoadError> {
    let fail = |reason: String| LoadError::Model {
        path: path.into(),
        reason,
    };
    let mut module = CModule::load_on_device(path, device).map_err(|e| {
        let msg = e.to_string();
        match (device, cap_bytes) {
            // Under a cap, running out of memory while loading means the weights do not fit.
            (Device::Cuda(_), Some(cap)) if crate::cuda::is_out_of_memory(&msg) => {
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
