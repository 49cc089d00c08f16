//! The model the worker serves, whatever its format: a TorchScript module (`tch::CModule`,
//! a `.pt` of `torch.jit.trace`/`script`), a `torch.export` program (a `.pt2` of
//! `torch.export.save`, run by libtorch's Native Runtime: `crate::exported`), or an
//! AOTInductor package (a `.pt2` of `torch._inductor.aoti_compile_and_package`). Everything
//! downstream — warm-up, batching, inline passes, `POST /`, v2, gRPC — runs passes through
//! [`Model::forward`], so every format gets the same caps, batching and refusals.
//!
//! One file per format, each with its loading; [`load`] picks the device, caps the allocator
//! and dispatches on [`Format`]:
//!
//! | file | owns |
//! |---|---|
//! | `load.rs` | loading whatever the format: the device, the allocator cap, the weights checked against it |
//! | `load_error.rs` | why a load failed ([`LoadError`]), libtorch's message on one line |
//! | `torchscript.rs` | a TorchScript module, loaded in eval mode under the simple executor |
//! | `program.rs` | a `torch.export` program, checked against the metadata and loaded with the Native Runtime |
//! | `package.rs` | an AOTInductor package, checked, unpacked and loaded; its weights outside the allocator's cap |
//! | `detector.rs` | `object_detector`'s scripted torchvision detector: a list of images in, each image's detections out as padded rows |
//! | `declared.rs` | what the metadata declares `forward` takes ([`Declared`]: a document input as its tensors) |

mod declared;
pub mod detector;
mod load;
mod load_error;
mod package;
mod program;
mod torchscript;

use std::fmt;

use tch::{CModule, IValue};

use crate::exported::{Package, PassError, Program};

pub use declared::Declared;
pub use load::{load, load_cpu, pick_device, Loaded};
pub use load_error::LoadError;
pub use torchscript::configure_executor;

pub enum Model {
    TorchScript(CModule),
    /// A TorchScript detector served for `object_detector` (`detector.rs`).
    Detector(CModule),
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

/// The formats served, each in its own file with its loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A TorchScript module (`torchscript.rs`).
    TorchScript,
    /// A `torch.export` program run by the Native Runtime (`program.rs`).
    Program,
    /// An AOTInductor package (`package.rs`).
    Package,
}

impl Format {
    /// The format of the file at `path`: a `.pt2` is an AOTInductor package when its records
    /// say so, else a program (an unreadable one fails the program's load, naming why).
    pub fn of(path: &str) -> Format {
        if !is_exported(path) {
            return Format::TorchScript;
        }
        match crate::exported::archive::kind(path) {
            Ok(crate::exported::archive::Kind::Aoti) => Format::Package,
            _ => Format::Program,
        }
    }
}

/// The model's format as v2 metadata names it (`platform`, on REST and gRPC): `torch_aoti`
/// for an AOTInductor package (Triton's platform for them, so that clients written for
/// Triton's `torch_aoti` models recognise it), `pytorch_export` for a `torch.export` program
/// run by the Native Runtime (no other server serves these, so there is no name to follow),
/// and for TorchScript `pytorch_libtorch`, Triton's name for TorchScript models (its
/// PyTorch backend's `platform`).
pub fn platform(path: &str) -> &'static str {
    match Format::of(path) {
        Format::TorchScript => "pytorch_libtorch",
        Format::Program => "pytorch_export",
        Format::Package => "torch_aoti",
    }
}

impl Model {
    /// One forward pass on `args` (the caller holds `no_grad`).
    pub fn forward(&self, args: &[IValue]) -> Result<IValue, Failure> {
        match self {
            Model::TorchScript(m) => m
                .forward_is(args)
                .map_err(|e| Failure::Torch(e.to_string())),
            Model::Detector(m) => detector::forward(m, args),
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
