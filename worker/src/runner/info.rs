//! What the model thread tells the rest of the worker of the model it loaded and warmed.

use tch::Device;

/// What the loaded model looks like, for the rest of the worker.
#[derive(Debug, Clone, Copy)]
pub struct ModelInfo {
    /// The CUDA device index, when the model runs on a GPU.
    pub cuda: Option<usize>,
    pub model_ms: f64,
    /// The warm-up an exec'd worker ran (0: none).
    pub warmup_ms: f64,
    /// Its forward passes.
    pub warmup_passes: u32,
    /// Torch's intra-op threads as the model thread itself reads them
    /// (`at::get_num_threads`: OpenMP's setting for that thread).
    pub intra_threads: i32,
}

impl ModelInfo {
    /// What the model thread tells of the model it loaded and warmed (on that thread: the
    /// intra-op count is its own).
    pub(super) fn of(device: Device, model_ms: f64, warmed: &super::Warmed) -> ModelInfo {
        ModelInfo {
            cuda: match device {
                Device::Cuda(i) => Some(i),
                _ => None,
            },
            model_ms,
            warmup_ms: warmed.ms,
            warmup_passes: warmed.passes,
            intra_threads: tch::get_num_threads(),
        }
    }
}
