//! Why a model did not load ([`LoadError`]: its message names the file and the reason, its
//! exit status), and libtorch's messages cut to the line that says why.

use vramfork::protocol::worker_exit;

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

/// Whether weights of `weights` bytes leave too little of a `cap`-byte allocator cap.
pub fn too_big(weights: u64, cap: u64) -> bool {
    weights as f64 > cap as f64 * WEIGHTS_SHARE_LIMIT
}

/// libtorch messages carry a C++ backtrace after the first line; keep the useful part. A
/// first line that only introduces the message ("Internal torch error:") is joined with the
/// line after it, where libtorch puts what went wrong ("Unknown builtin op: …").
pub fn first_line(msg: &str) -> String {
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
