//! The warm-up: `--warmup-passes` forward passes (2 by default) on zeros (one empty string
//! per element of a `BYTES` input) at the shapes the worker will run — the metadata's
//! `warmup_inputs`, else the declared `inputs` with `-1` dimensions as 1, and with batching
//! a full batch of `max_batch_size` rows first — run by the template on its one thread
//! before it forks workers, and by every worker that loads the model itself (exec'd: GPU
//! workers, development mode) before it is ready. What a model's first passes cost — the
//! TorchScript executor building (and, profiling, optimizing) its plan, CUDA loading its
//! kernels lazily, the allocator growing its heaps, oneDNN choosing and generating kernels —
//! is then paid before the first request instead of by it (which with `--max-requests 1` is
//! every request). The first pass also checks the declared inputs against `forward()`
//! ([`boot_refusal`]), and per text input one more pass runs a document of `max_length`
//! tokens and one its token budget's worst shape (`max_batch_tokens`: as many documents of
//! `max_length` tokens as one pass may hold; [`check_budgets`]), unless the passes before
//! ran it: the footprint the template measures
//! (and `--profile-memory`, which runs the same shape) then bounds every pass a client can
//! cause, and a `max_length` beyond what the model takes (its position embeddings) ends the
//! boot naming the field, instead of failing the first long text with a 500. An image
//! input's passes already run at its declared `size`.

use std::time::Instant;

use tch::{Device, IValue, Tensor};

use crate::model::{Failure, Model};
use vramfork::documents::{Document, Feed, Padding, TextSpec};
use vramfork::metadata::batch_tokens::TokenBudget;
use vramfork::metadata::{with_rows, AppMetadata, Datatype, TensorSpec};

use super::useful_line;
use crate::args::kind_of;
use crate::model::LoadError;

/// The warm-up a process runs after loading the model.
#[derive(Debug, Clone)]
pub struct Warmup {
    pub specs: Vec<TensorSpec>,
    /// One set of input shapes per shape the worker will run at
    /// ([`AppMetadata::warmup_shapes`]); each pass runs at every set, in order.
    pub shapes: Vec<Vec<Vec<i64>>>,
    pub passes: u32,
    /// The token budget of each text input, by input index.
    pub budgets: Vec<(usize, TokenBudget)>,
}

impl Warmup {
    /// `passes` (`--warmup-passes`) at the shapes the metadata gives; `None` when there is
    /// nothing to run: no pass wanted, or an input with no shape to build one from.
    pub fn plan(metadata: &AppMetadata, passes: u32, max_batch_size: u32) -> Option<Warmup> {
        if passes == 0 {
            return None;
        }
        Some(Warmup {
            specs: metadata.inputs.clone()?,
            shapes: metadata.warmup_shapes(max_batch_size)?,
            passes,
            budgets: metadata.token_budgets(max_batch_size),
        })
    }
}

/// A warm-up that ran: its total time, how many forward passes it made, and the process's
/// host memory after them with their peak (`crate::memory::PassPeak`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Warmed {
    pub ms: f64,
    pub passes: u32,
    pub memory: Option<vramfork::protocol::ReadyMemory>,
}

/// Runs the warm-up on `device`: `Ok` with what ran (nothing without a plan); `Err` when a
/// pass failed, which ends the boot ([`boot_refusal`]) unless the GPU was out of memory
/// (a warning: the worker, or from the `template` every worker, starts cold, and such
/// requests get 507).
pub fn warm(
    module: &Model,
    plan: Option<&Warmup>,
    path: &str,
    device: Device,
    template: bool,
) -> Result<Warmed, LoadError> {
    let Some(plan) = plan else {
        return Ok(Warmed::default());
    };
    let start = Instant::now();
    // The template's warm-up tells the master what a forked worker's passes will take
    // (only there: resetting the peak would change an exec'd worker's hwFetch figure).
    let peak = template.then(crate::memory::PassPeak::start);
    let mut pass_ms = Vec::new();
    for _ in 0..plan.passes {
        for shapes in &plan.shapes {
            match pass(module, &plan.specs, shapes, device, Long::None) {
                Ok(ms) => pass_ms.push(ms),
                Err(e) => {
                    if let Some(refused) = boot_refusal(path, &plan.specs, shapes, &e) {
                        return Err(refused);
                    }
                    let (who, cold) = match template {
                        true => ("template: ", "workers start cold"),
                        false => ("", "starting cold"),
                    };
                    tracing::warn!(
                        "{who}the warm-up pass on the declared input shape ran out of GPU memory ({e}; shapes {shapes:?}); {cold}, and requests that large will get 507"
                    );
                    return Ok(Warmed::default());
                }
            }
        }
    }
    let checked = check_budgets(module, plan, path, device)?;
    let warmed = Warmed {
        ms: start.elapsed().as_secs_f64() * 1e3,
        passes: plan.passes * plan.shapes.len() as u32 + checked,
        memory: peak.and_then(crate::memory::PassPeak::finish),
    };
    tracing::debug!(
        ms = warmed.ms,
        passes = warmed.passes,
        ?pass_ms,
        shapes = ?plan.shapes,
        template,
        "warm-up done"
    );
    Ok(warmed)
}

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

/// Why a warm-up pass failed: the pass itself raised, the device reported an error when
/// the pass was waited for (`cudaDeviceSynchronize`), or GPU memory ran out where the text
/// does not say so (inside an AOTInductor package: told by the allocator's count).
#[derive(Debug, Clone, PartialEq)]
pub enum Failed {
    Pass(String),
    Device(String),
    OutOfMemory(String),
}

impl Failed {
    fn message(&self) -> &str {
        match self {
            Failed::Pass(m) | Failed::Device(m) | Failed::OutOfMemory(m) => m,
        }
    }

    /// GPU memory ran out: by its class, or by its text.
    fn out_of_memory(&self) -> bool {
        matches!(self, Failed::OutOfMemory(_))
            || matches!(
                super::classify(self.message()),
                super::RunError::OutOfMemory(_)
            )
    }

    /// A pass's failure as the model reported it.
    fn of(failure: Failure) -> Failed {
        match failure {
            Failure::Device {
                message,
                out_of_memory,
            } => match super::failure::package_on_cuda(&message, out_of_memory) {
                super::RunError::OutOfMemory(line) => Failed::OutOfMemory(line),
                super::RunError::CudaFatal(line) => Failed::Device(line),
                other => Failed::Pass(match other {
                    super::RunError::Cuda(line) => line,
                    e => e.to_string(),
                }),
            },
            other => Failed::Pass(useful_line(&other.to_string())),
        }
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// What a failed warm-up pass at `shapes` means. Every failure ends the boot — a pool
/// that would answer every request of the declared shape with an error must never report
/// ready — except GPU memory running out, which may pass (a neighbour's
/// memory, a batch larger than most requests): `None`, a warning, and the worker starts
/// cold. Which refusal: the declared inputs do not fit `forward()`'s signature; the device
/// failed when the pass was waited for, or the pass hit a sticky CUDA error (the context is
/// unusable: exit `worker_exit::CUDA_FATAL`, which under MPS is every client's fault); or
/// the model failed on the declared shape (the metadata and the model disagree).
pub fn boot_refusal(
    path: &str,
    specs: &[TensorSpec],
    shapes: &[Vec<i64>],
    failed: &Failed,
) -> Option<LoadError> {
    let msg = failed.message();
    let class = super::classify(msg);
    if matches!(failed, Failed::Device(_)) || matches!(class, super::RunError::CudaFatal(_)) {
        return Some(LoadError::CudaFatal {
            path: path.to_string(),
            reason: format!("the warm-up pass on the declared inputs hit a CUDA error that leaves the GPU context unusable: {msg}"),
        });
    }
    if failed.out_of_memory() {
        return None;
    }
    if signature_mismatch(msg) {
        return Some(LoadError::Signature {
            path: path.to_string(),
            declared: specs
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            reason: msg.to_string(),
        });
    }
    let shapes = specs
        .iter()
        .zip(shapes)
        .map(|(s, shape)| format!("{} {shape:?}", s.name))
        .collect::<Vec<_>>()
        .join(", ");
    Some(LoadError::Warmup {
        path: path.to_string(),
        shapes,
        reason: msg.to_string(),
    })
}

/// Each text input's token budget's worst pass ([`TokenBudget::worst_rows`] documents of
/// `max_length` tokens, every other input at as many rows), unless a pass before ran it
/// (`"max_length"` padding at as many rows). The passes before it ran, so its failure is the
/// length's or the budget's: the boot ends naming the field. Out of GPU memory, a budget the
/// metadata gave ends the boot (`max_batch_tokens`); the default one is halved until its pass
/// runs, and lowered to that for this worker's passes (`parts.rs`); one document of
/// `max_length` tokens out of memory is a warning (such requests will get 507). Returns the
/// passes it ran.
fn check_budgets(
    module: &Model,
    plan: &Warmup,
    path: &str,
    device: Device,
) -> Result<u32, LoadError> {
    let Some(base) = plan.shapes.last() else {
        return Ok(0);
    };
    let mut passes = 0;
    for &(i, budget) in &plan.budgets {
        let Some(Document::Text(text)) = &plan.specs[i].document else {
            continue;
        };
        let worst = budget.worst_rows();
        let ran = |s: &Vec<Vec<i64>>| s.get(i).and_then(|s| s.first()).copied().unwrap_or(1);
        if text.padding == Padding::MaxLength && plan.shapes.iter().any(|s| ran(s) >= worst as i64)
        {
            continue;
        }
        // One document of `max_length` first (a failure there is the length's), then the
        // budget's worst pass.
        let (mut rows, mut alone_ran) = (1, worst == 1);
        loop {
            passes += 1;
            let shapes = with_rows(&plan.specs, base, rows as i64);
            let Err(e) = pass(module, &plan.specs, &shapes, device, Long::Input(i)) else {
                if !alone_ran {
                    (rows, alone_ran) = (worst, true);
                    continue;
                }
                if rows < worst {
                    let tokens = rows * budget.max_length;
                    tracing::warn!(
                        "the default token budget ({} tokens a pass of inputs[{i}]) ran out of GPU memory at the warm-up; this worker's passes hold {tokens} tokens ({rows} documents of {} tokens). Set `max_batch_tokens` to fix it",
                        budget.tokens,
                        budget.max_length
                    );
                    super::parts::lower(tokens);
                }
                break;
            };
            // The passes before it ran: a model failure here is the length's (below).
            match boot_refusal(path, &plan.specs, &shapes, &e) {
                Some(LoadError::Warmup { .. }) | None => {}
                Some(refused) => return Err(refused),
            }
            let (field, n) = (format!("inputs[{i}].tokenizer.max_length"), text.max_length);
            if e.out_of_memory() {
                if budget.given && alone_ran {
                    return Err(LoadError::Model {
                        path: path.to_string(),
                        reason: format!(
                            "max_batch_tokens = {}: the warm-up pass of its worst shape ({rows} documents of {n} tokens) ran out of GPU memory ({e}). Lower `max_batch_tokens` (a pass of it must fit beside the model), or remove it to let the warm-up find one that fits",
                            budget.tokens
                        ),
                    });
                }
                if alone_ran && rows > 1 {
                    rows /= 2;
                    continue;
                }
                tracing::warn!(
                    "{field} = {n}: a pass on a document of {n} tokens ran out of GPU memory ({e}); requests with documents that long will get 507"
                );
                break;
            }
            let docs = match rows {
                1 => format!("{n} tokens"),
                r => format!("{r} documents of {n} tokens"),
            };
            return Err(LoadError::Model {
                path: path.to_string(),
                reason: format!(
                    "{field} = {n}, but the model failed on {docs} (shorter documents ran): {e}. Set `{field}` to at most what the model takes (for a transformers model, its config's max_position_embeddings)"
                ),
            });
        }
    }
    Ok(passes)
}

/// Which text inputs a warm-up pass runs at `max_length` tokens (the others at
/// [`short_length`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Long {
    None,
    Input(usize),
    All,
}

/// The profiling pass: one forward pass on `device` with zeros of `shapes` (one per
/// declared input), every text input's documents `max_length` tokens long (with
/// [`with_rows`]' worst rows, its token budget's worst shape); its duration in ms, or the
/// model's message when it failed.
pub fn warm_up(
    module: &Model,
    specs: &[TensorSpec],
    shapes: &[Vec<i64>],
    device: Device,
) -> Result<f64, String> {
    pass(module, specs, shapes, device, Long::All).map_err(|e| e.to_string())
}

/// One forward pass on `device` with zeros of `shapes`, the documents of the text inputs
/// `long` says `max_length` tokens long.
fn pass(
    module: &Model,
    specs: &[TensorSpec],
    shapes: &[Vec<i64>],
    device: Device,
    long: Long,
) -> Result<f64, Failed> {
    let mut args = Vec::with_capacity(specs.len());
    for (i, (spec, shape)) in specs.iter().zip(shapes).enumerate() {
        if let Some(doc) = &spec.document {
            // What its documents become: zeros at the rows the shape gives.
            let rows = shape.first().copied().unwrap_or(1);
            let at_max = long == Long::All || long == Long::Input(i);
            for (t, kind) in document_args(doc, rows, at_max) {
                args.push(IValue::Tensor(t.to_kind(kind).to_device(device)));
            }
            continue;
        }
        args.push(match spec.datatype {
            Datatype::Tensor(dtype) => {
                IValue::Tensor(Tensor::zeros(shape, (kind_of(dtype), device)))
            }
            Datatype::Bytes => {
                let n: i64 = shape.iter().product();
                IValue::StringList(vec![String::new(); n.max(0) as usize])
            }
        });
    }
    let start = Instant::now();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tch::no_grad(|| module.forward(&args).map(drop))
    }));
    let run = match run {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Failed::of(e)),
        Err(_) => Err(Failed::Pass("the model panicked".into())),
    };
    // The pass is over (and its peak reached) once the GPU has finished it; an
    // asynchronous CUDA error of the pass comes back here, as an error the boot can act on.
    // (tch 0.24's `Cuda::synchronize` is `unsafe_torch!`, which unwraps libtorch's error
    // into a panic, `src/wrappers/device.rs` and `utils.rs`: the warm-up then ended as "the
    // model panicked", and a worker with a broken context started cold.)
    let synced = match (&run, device) {
        (_, Device::Cuda(_)) => match crate::cuda::synchronize() {
            Ok(()) | Err(crate::cuda::CudaError::NoCuda) => Ok(()),
            Err(crate::cuda::CudaError::C10(m)) => Err(Failed::Device(useful_line(&m))),
        },
        _ => Ok(()),
    };
    // A CUDA error the device reports after the pass says more than what the pass raised,
    // and whatever it says, a device that fails to synchronize is not one to serve on.
    synced.and(run)?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

/// The tokens a text input's warm-up passes run at: `max_length` with `"max_length"`
/// padding (every pass has that length), else 16 or fewer (a short document: running every
/// pass at the longest would make a boot pay the worst case many times over).
fn short_length(t: &TextSpec) -> usize {
    match t.padding {
        Padding::MaxLength => t.max_length,
        Padding::Longest => t.max_length.min(16),
    }
}

/// The tensors a document input gives `forward` for `rows` documents, as zeros (ones for an
/// attention mask): a text input's feeds at [`short_length`] tokens, or `max_length` when
/// `longest`; an image input's `[rows, 3, H, W]`.
fn document_args(doc: &Document, rows: i64, longest: bool) -> Vec<(Tensor, tch::Kind)> {
    let cpu = Device::Cpu;
    match doc {
        Document::Text(t) => {
            let len = if longest {
                t.max_length
            } else {
                short_length(t)
            } as i64;
            t.feeds
                .iter()
                .map(|f| {
                    let t = match f {
                        Feed::AttentionMask => Tensor::ones([rows, len], (tch::Kind::Int64, cpu)),
                        _ => Tensor::zeros([rows, len], (tch::Kind::Int64, cpu)),
                    };
                    (t, tch::Kind::Int64)
                })
                .collect()
        }
        Document::Image(i) => {
            let [h, w] = i.size.map(i64::from);
            vec![(
                Tensor::zeros([rows, 3, h, w], (tch::Kind::Float, cpu)),
                kind_of(i.dtype),
            )]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramfork::metadata::Dtype;

    /// What a failed warm-up pass ends in.
    #[test]
    fn every_warm_up_failure_but_gpu_memory_refuses_the_boot() {
        let specs = vec![TensorSpec {
            name: "image".into(),
            datatype: Datatype::Tensor(Dtype::Float32),
            shape: Some(vec![-1, 224, 224, 3]),
            document: None,
        }];
        let shapes = vec![vec![1, 224, 224, 3]];
        let refuse = |f: Failed| boot_refusal("m.pt", &specs, &shapes, &f);
        // The model failing on the declared shape: the metadata and the model disagree.
        let nhwc = "Given groups=1, weight of size [64, 3, 7, 7], expected input[1, 224, 224, 3] to have 3 channels, but got 224 channels instead";
        match refuse(Failed::Pass(nhwc.into())) {
            Some(e @ LoadError::Warmup { .. }) => {
                let m = e.to_string();
                assert!(
                    m.contains("image [1, 224, 224, 3]") && m.contains(nhwc),
                    "{m}"
                );
                assert_eq!(e.exit_code(), vramfork::protocol::worker_exit::MODEL_LOAD);
            }
            other => panic!("{other:?}"),
        }
        // A recoverable CUDA error at the declared shape (an operator library built
        // without kernels for this GPU) refuses it too: every such request would fail.
        let arch = "CUDA error: no kernel image is available for execution on the device";
        assert!(matches!(
            refuse(Failed::Pass(arch.into())),
            Some(LoadError::Warmup { .. })
        ));
        // Out of GPU memory starts cold: such requests get 507.
        let oom = "CUDA out of memory. Tried to allocate 2.00 GiB.";
        assert!(refuse(Failed::Pass(oom.into())).is_none());
        // A device that fails to synchronize is fatal whatever its text says, and so is a
        // sticky error raised by the pass: exit CUDA_FATAL, never MODEL_LOAD.
        for f in [
            Failed::Device("CUDA error: the MPS client has been terminated by the server".into()),
            Failed::Device("CUDA error: some text no list has".into()),
            Failed::Pass(
                "RuntimeError: CUDA error: an illegal memory access was encountered".into(),
            ),
        ] {
            match refuse(f.clone()) {
                Some(e @ LoadError::CudaFatal { .. }) => assert_eq!(
                    e.exit_code(),
                    vramfork::protocol::worker_exit::CUDA_FATAL,
                    "{f:?}"
                ),
                other => panic!("{f:?}: {other:?}"),
            }
        }
    }

    /// A package's pass failing on CUDA says only that the runner's call failed: when the
    /// allocator counted a failed allocation it is out of memory (the worker starts cold,
    /// no shape advice); otherwise the boot is refused, saying where the package's own
    /// message went.
    #[test]
    fn a_package_out_of_memory_at_warm_up_starts_cold() {
        let specs = vec![TensorSpec {
            name: "x".into(),
            datatype: Datatype::Tensor(Dtype::Float32),
            shape: Some(vec![-1, 4]),
            document: None,
        }];
        let shapes = vec![vec![2, 4]];
        let runner = "run_func_( container_handle_, input_handles.data(), input_handles.size(), output_handles.data(), output_handles.size(), reinterpret_cast<AOTInductorStreamHandle>(stream_handle), proxy_executor_handle_) API call failed at /pytorch/torch/csrc/inductor/aoti_runner/model_container_runner.cpp, line 144";
        let device = |out_of_memory| Failure::Device {
            message: runner.into(),
            out_of_memory,
        };
        let oom = Failed::of(device(true));
        assert!(
            boot_refusal("m.pt2", &specs, &shapes, &oom).is_none(),
            "{oom:?}"
        );
        match boot_refusal("m.pt2", &specs, &shapes, &Failed::of(device(false))) {
            Some(e @ LoadError::Warmup { .. }) => {
                assert!(e.to_string().contains("standard error"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

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
