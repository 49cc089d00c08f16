//! The template's warm-up: one forward pass on an input the metadata's declared `inputs`
//! allow (`-1` dimensions as 1; zeros, or one empty string for a `BYTES` input), run on the
//! template's one thread before it forks workers. What a model's first passes cost — the
//! TorchScript executor building its plan, the allocator growing its heaps, oneDNN choosing
//! and generating kernels — is then paid once, in memory every forked worker inherits,
//! instead of by the first request of every worker (which with `--max-requests 1` is every
//! request).

use std::time::Instant;

use tch::{CModule, Device, IValue, Tensor};
use vramfork::metadata::{Datatype, TensorSpec};

use super::load::LoadError;
use super::useful_line;
use crate::args::kind_of;

/// Whether a failed pass's message is libtorch refusing the arguments themselves (the
/// check of `FunctionSchema::checkAndNormalizeInputs`, `ATen/core/function_schema_inl.h`
/// in torch 2.11, made before the model runs): a missing argument, too many, or one of the
/// wrong type.
pub fn signature_mismatch(msg: &str) -> bool {
    // tch puts "Internal torch error: " before libtorch's text.
    msg.contains("forward() is missing value for argument '")
        || (msg.contains("argument(s) for operator 'forward'") && msg.contains("but received"))
        || (msg.contains("forward() Expected a value of type '") && msg.contains("for argument '"))
}

/// What a failed warm-up means: the declared inputs do not fit `forward()`, or the pass
/// left the CUDA context unusable (a boot failure either way: every request would fail),
/// or `None` (the worker starts cold).
pub fn boot_refusal(path: &str, specs: &[TensorSpec], msg: &str) -> Option<LoadError> {
    if matches!(super::classify(msg), super::RunError::CudaFatal(_)) {
        return Some(LoadError::Model {
            path: path.to_string(),
            reason: format!("the warm-up pass on the declared inputs hit a CUDA error: {msg}"),
        });
    }
    signature_mismatch(msg).then(|| LoadError::Signature {
        path: path.to_string(),
        declared: specs
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        reason: msg.to_string(),
    })
}

/// Runs the warm-up pass on `device`, with `shapes` (one per declared input; `None`: the
/// declared shapes with `-1` as 1); `Ok(None)` when the metadata declares no input shape to
/// make one from, `Ok(Some(ms))` when it ran, `Err` with the model's message when the pass
/// failed.
pub fn warm_up(
    module: &CModule,
    inputs: Option<&[TensorSpec]>,
    shapes: Option<&[Vec<i64>]>,
    device: Device,
) -> Result<Option<f64>, String> {
    let Some(specs) = inputs else {
        return Ok(None);
    };
    let mut args = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let shape: Vec<i64> = match (shapes.and_then(|s| s.get(i)), &spec.shape) {
            (Some(s), _) => s.clone(),
            (None, Some(declared)) => declared
                .iter()
                .map(|d| if *d < 0 { 1 } else { *d })
                .collect(),
            (None, None) => return Ok(None),
        };
        args.push(match spec.datatype {
            Datatype::Tensor(dtype) => {
                IValue::Tensor(Tensor::zeros(&shape, (kind_of(dtype), device)))
            }
            Datatype::Bytes => {
                let n: i64 = shape.iter().product();
                IValue::StringList(vec![String::new(); n.max(0) as usize])
            }
        });
    }
    let start = Instant::now();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tch::no_grad(|| {
            module.forward_is(&args).map(|out| {
                if let Device::Cuda(i) = device {
                    // The pass is over (and its peak reached) once the GPU has finished it.
                    tch::Cuda::synchronize(i as i64);
                }
                drop(out);
            })
        })
    }));
    match run {
        Ok(Ok(())) => Ok(Some(start.elapsed().as_secs_f64() * 1e3)),
        Ok(Err(e)) => Err(useful_line(&e.to_string())),
        Err(_) => Err("the model panicked".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libtorch 2.11's argument checks (`ATen/core/function_schema_inl.h`), as tch shows
    /// them; a model's own error, or another operator's schema check, is not a mismatch.
    #[test]
    fn only_forwards_own_argument_checks_are_mismatches() {
        for yes in [
            "Internal torch error: forward() is missing value for argument 'scale'. Declaration: forward(__torch__.Pair self, Tensor features, Tensor scale) -> ((Tensor, Tensor))",
            "Internal torch error: Expected at most 2 argument(s) for operator 'forward', but received 3 argument(s). Declaration: forward(__torch__.M self, Tensor x) -> (Tensor)",
            "Internal torch error: forward() Expected a value of type 'Tensor' for argument 'x' but instead found type 'List[str]'.",
        ] {
            assert!(signature_mismatch(yes), "{yes}");
        }
        for no in [
            "Internal torch error: The following operation failed in the TorchScript interpreter. builtins.ValueError: negative",
            "Internal torch error: linear() Expected a value of type 'Tensor' for argument 'weight' but instead found type 'int'.",
            "Internal torch error: mat1 and mat2 shapes cannot be multiplied (1x5 and 4x8)",
        ] {
            assert!(!signature_mismatch(no), "{no}");
        }
    }
}
