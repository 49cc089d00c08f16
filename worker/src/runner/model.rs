//! The model the worker serves, whatever its format: a TorchScript module (`tch::CModule`,
//! a `.pt` of `torch.jit.trace`/`script`), a `torch.export` program (a `.pt2` of
//! `torch.export.save`, run by libtorch's Native Runtime: `crate::exported`), or an
//! AOTInductor package (a `.pt2` of `torch._inductor.aoti_compile_and_package`). Everything
//! downstream — warm-up, batching, inline passes, `POST /`, v2, gRPC — runs passes through
//! [`Model::forward`], so every format gets the same caps, batching and refusals.

use std::fmt;

use tch::{CModule, Device, IValue};

use crate::exported::{Package, PassError, Program};

pub enum Model {
    TorchScript(CModule),
    Exported(Program),
    Aoti(Package),
}

/// Why a pass failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// libtorch raised (the model's own error, a CUDA error…): its message.
    Torch(String),
    /// The request's tensors are not what the program takes (its bounds, dtype, rank): the
    /// request's fault, found before the pass.
    Input(String),
    /// An AOTInductor package failed on CUDA: the runner's text, and whether the caching
    /// allocator counted a failed allocation during the pass ([`PassError::Device`]).
    Device {
        message: String,
        out_of_memory: bool,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Torch(m) | Failure::Input(m) => f.write_str(m),
            Failure::Device { message, .. } => f.write_str(message),
        }
    }
}

/// Whether `path` names a `torch.export` archive (`.pt2`) rather than TorchScript.
pub fn is_exported(path: &str) -> bool {
    std::path::Path::new(path)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("pt2"))
}

/// The model's format as v2 metadata names it (`platform`, on REST and gRPC): `torch_aoti`
/// for an AOTInductor package (Triton's platform for them, so that clients written for
/// Triton's `torch_aoti` models recognise it), `pytorch_export` for a `torch.export` program
/// run by the Native Runtime (no other server serves these, so there is no name to follow),
/// and for TorchScript `pytorch_libtorch`, Triton's name for TorchScript models (its
/// PyTorch backend's `platform`).
pub fn platform(path: &str) -> &'static str {
    if !is_exported(path) {
        return "pytorch_libtorch";
    }
    match crate::exported::archive::kind(path) {
        Ok(crate::exported::archive::Kind::Aoti) => "torch_aoti",
        _ => "pytorch_export",
    }
}

impl Model {
    /// One forward pass on `args` (the caller holds `no_grad`).
    pub fn forward(&self, args: &[IValue]) -> Result<IValue, Failure> {
        match self {
            Model::TorchScript(m) => m
                .forward_is(args)
                .map_err(|e| Failure::Torch(e.to_string())),
            Model::Exported(p) => p.run(&tensors(args)?).map_err(failure),
            Model::Aoti(p) => p.run(&tensors(args)?).map_err(failure),
        }
    }
}

/// A pass's arguments as the tensors a `.pt2` takes.
fn tensors(args: &[IValue]) -> Result<Vec<tch::Tensor>, Failure> {
    args.iter()
        .map(|a| match a {
            IValue::Tensor(t) => Ok(t.shallow_clone()),
            _ => Err(Failure::Input(
                "a torch.export program takes tensors only (text inputs are for TorchScript models)".into(),
            )),
        })
        .collect()
}

fn failure(e: PassError) -> Failure {
    match e {
        PassError::Input(m) => Failure::Input(m),
        PassError::Runtime(m) => Failure::Torch(m),
        PassError::Device {
            message,
            out_of_memory,
        } => Failure::Device {
            message,
            out_of_memory,
        },
    }
}

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
