//! What a model request can end in besides outputs ([`RunError`]), and how a libtorch
//! message is sorted into one: GPU memory exhausted (507, the worker retires), a CUDA error
//! that leaves the context unusable (the worker exits), any other CUDA error (that request's
//! error: the worker serves on, once a check of the device says it can), or the model's own
//! error; with the one line of the message a user can act on.

use crate::cuda::is_out_of_memory;

/// What a model request can end in, besides outputs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// The model itself raised (TorchScript `raise`, a shape error inside the model…).
    #[error("the model failed: {0}")]
    Model(String),
    #[error("{0}")]
    Unsupported(String),
    /// The request asked for something the model's answer does not have (an output name).
    #[error("{0}")]
    Request(String),
    #[error("CUDA out of memory while running the model: {0}")]
    OutOfMemory(String),
    /// A sticky CUDA error: the context is unusable and the worker must exit.
    #[error("CUDA error while running the model: {0}")]
    CudaFatal(String),
    /// A CUDA error that leaves the context usable (a kernel refusing this input's sizes, a
    /// library not supporting its type): this request's error; the worker serves on.
    #[error(
        "CUDA error while running the model on this request's input (the worker serves on): {0}"
    )]
    Cuda(String),
    /// The model thread is gone (it panicked out, or the worker is stopping).
    #[error("the model thread is not running")]
    Gone,
    /// The client's deadline passed before the pass could start: it never ran.
    #[error("the request's deadline passed before it could run")]
    Expired,
}

/// The CUDA errors after which the process's context cannot be used again — "sticky"
/// errors, which the CUDA Runtime API's `cudaError_t` documents as leaving the process in an
/// inconsistent state that must be terminated: `cudaErrorIllegalAddress`, `cudaErrorAssert`,
/// `cudaErrorLaunchFailure`, `cudaErrorMisalignedAddress`, `cudaErrorIllegalInstruction`,
/// `cudaErrorHardwareStackError`, `cudaErrorInvalidPc`, `cudaErrorInvalidAddressSpace`,
/// `cudaErrorECCUncorrectable`, `cudaErrorLaunchTimeout` — as `libcudart.so.13` words them
/// (the driver API's `cuGetErrorString` uses the same words); and an unknown error, which
/// cannot be told safe.
const STICKY_MARKS: &[&str] = &[
    "an illegal memory access was encountered",
    "device-side assert triggered",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction was encountered",
    "hardware stack error",
    "invalid program counter",
    "operation not supported on global/shared address space",
    "uncorrectable ECC error encountered",
    "the launch timed out and was terminated",
    "CUDA error: unknown error",
    "CUDA driver error: unknown error",
];

/// Every other CUDA failure: this request's (a kernel launch refused for this input's
/// sizes, "invalid configuration argument"; `CUBLAS_STATUS_NOT_SUPPORTED`/`INVALID_VALUE`;
/// `CUDNN_STATUS_NOT_SUPPORTED`/`BAD_PARAM`…). The model thread checks the device after one
/// (`runner::pass`) and treats it as sticky if the check fails.
const CUDA_MARKS: &[&str] = &[
    "CUDA error",
    "CUDA driver error",
    "CUBLAS_STATUS",
    "cuDNN error",
    "CUDNN_STATUS",
    "CUFFT_",
    "cuFFT error",
    "CUSOLVER_STATUS",
];

/// Sorts a libtorch error into GPU memory exhausted, a sticky CUDA error, another CUDA
/// error, or a model error.
pub fn classify(msg: &str) -> RunError {
    let line = useful_line(msg);
    if is_out_of_memory(msg) {
        RunError::OutOfMemory(line)
    } else if STICKY_MARKS.iter().any(|m| msg.contains(m)) {
        RunError::CudaFatal(line)
    } else if CUDA_MARKS.iter().any(|m| msg.contains(m)) {
        RunError::Cuda(line)
    } else {
        RunError::Model(line)
    }
}

/// What a failed pass of an AOTInductor package on CUDA is. The runner's text says nothing
/// of the cause (`run_func_( container_handle_, … ) API call failed at …`: the package's
/// CUDA error went to stderr), so the class comes from outside it: out of memory when the
/// caching allocator counted a failed allocation during the pass (`out_of_memory`, from its
/// `num_ooms`), else a CUDA error, which the model thread then checks the device after
/// (`runner::pass`: a device that fails to synchronize makes it fatal). A text that does say
/// (a sticky error's words) is believed.
pub fn package_on_cuda(msg: &str, out_of_memory: bool) -> RunError {
    let line = format!(
        "{} (inside the AOTInductor package; its own message, with the CUDA error, is on the worker's standard error)",
        useful_line(msg)
    );
    if out_of_memory || is_out_of_memory(msg) {
        RunError::OutOfMemory(line)
    } else if STICKY_MARKS.iter().any(|m| msg.contains(m)) {
        RunError::CudaFatal(line)
    } else {
        RunError::Cuda(line)
    }
}

/// The lines c10's CUDA check appends to every CUDA error's own line (torch 2.11,
/// `c10/cuda/CUDAException.cpp` and `CUDAMiscFunctions.cpp`: `get_cuda_error_help`,
/// `get_cuda_check_suffix`, `c10_retrieve_device_side_assertion_info`; their texts as
/// `strings libc10_cuda.so` shows them): advice about the error, never the error. The
/// TorchScript interpreter writes such a message after its `RuntimeError: `, so its last
/// line is one of these.
const CUDA_ADVICE: &[&str] = &[
    "Search for `cuda",
    "CUDA kernel errors might be asynchronously reported",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions",
    "Device-side assertion tracking was not enabled by user",
    "Device-side assertions were explicitly omitted for this error check",
];

/// The line of a libtorch message a user can act on: for a TorchScript exception the last
/// line (`builtins.ValueError: …`, `RuntimeError: CUDA error: …`), else the first; never
/// the C++ backtrace nor c10's advice lines after a CUDA error ([`CUDA_ADVICE`]).
pub fn useful_line(msg: &str) -> String {
    let lines: Vec<&str> = msg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !CUDA_ADVICE.iter().any(|a| l.starts_with(a)))
        .collect();
    let line = if msg.contains("The following operation failed in the TorchScript interpreter") {
        lines.last().copied()
    } else {
        lines
            .iter()
            .copied()
            .find(|l| !l.starts_with("Exception raised from"))
    }
    .unwrap_or("unknown error");
    let mut line = line.to_string();
    if line.len() > 500 {
        let mut cut = 500;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

/// An error whose text is a CUDA failure becomes that failure, whatever step reported it.
pub fn cuda_first(e: RunError) -> RunError {
    match &e {
        RunError::Unsupported(m) | RunError::Request(m) | RunError::Model(m) => match classify(m) {
            cuda @ (RunError::OutOfMemory(_) | RunError::CudaFatal(_) | RunError::Cuda(_)) => cuda,
            _ => e,
        },
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchscript_exceptions_keep_their_last_line() {
        let msg = "The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript ...\n  raise ValueError(\"x\")\n\nbuiltins.ValueError: negative input sum\n";
        assert_eq!(
            classify(msg),
            RunError::Model("builtins.ValueError: negative input sum".into())
        );
    }

    #[test]
    fn cuda_errors_are_told_apart() {
        let oom = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79 GiB total)\nException raised from malloc at ...";
        assert!(
            matches!(classify(oom), RunError::OutOfMemory(m) if m.starts_with("CUDA out of memory. Tried"))
        );
        let fatal = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported";
        assert!(matches!(classify(fatal), RunError::CudaFatal(_)));
        let shape = "mat1 and mat2 shapes cannot be multiplied (1x5 and 4x8)\nException raised from meta at x.cpp:1";
        assert_eq!(
            classify(shape),
            RunError::Model("mat1 and mat2 shapes cannot be multiplied (1x5 and 4x8)".into())
        );
    }

    /// The texts libtorch 2.11 (cu130) produces, assembled from the literals in its
    /// libraries (`strings libc10_cuda.so`, `libtorch_cuda.so`, `libcudart.so.13`), each
    /// followed by the backtrace tch passes on.
    #[test]
    fn every_pytorch_2_11_oom_text_is_an_oom() {
        let suffix = "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n\nException raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:44 (most recent call first):\nframe #0: ...";
        let ooms = [
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free. Of the allocated memory 76.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)\nException raised from malloc at /pytorch/c10/cuda/CUDACachingAllocator.cpp:1458".to_string(),
            "CUDA out of memory. Tried to allocate more than 1EB memory.\nException raised from malloc".to_string(),
            "Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 70.00 GiB\nRequested               : 16.00 GiB\nDevice limit            : 79.19 GiB\nFree (according to CUDA): 8.00 GiB\nPyTorch limit (set by user-supplied memory fraction)\n                        : 75.00 GiB\nException raised from mallocAsync".to_string(),
            format!("CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.{suffix}"),
            "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\nException raised from createCublasHandle".to_string(),
            "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED\nException raised from run_conv_plan".to_string(),
        ];
        for m in &ooms {
            assert!(matches!(classify(m), RunError::OutOfMemory(_)), "{m}");
        }
        // The useful line is the first one, never the backtrace.
        assert_eq!(
            classify(&ooms[2]),
            RunError::OutOfMemory(
                "Allocation on device 0 would exceed allowed memory. (out of memory)".into()
            )
        );
        for kind in [
            "device-side assert triggered\nSearch for `cudaErrorAssert'",
            "an illegal memory access was encountered\nSearch for `cudaErrorIllegalAddress'",
            "unspecified launch failure\nSearch for `cudaErrorLaunchFailure'",
            "misaligned address\nSearch for `cudaErrorMisalignedAddress'",
        ] {
            let m = format!("CUDA error: {kind} in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.{suffix}");
            assert!(matches!(classify(&m), RunError::CudaFatal(_)), "{m}");
        }
        for kind in [
            "an illegal instruction was encountered\nSearch for `cudaErrorIllegalInstruction'",
            "uncorrectable ECC error encountered\nSearch for `cudaErrorECCUncorrectable'",
            "unknown error\nSearch for `cudaErrorUnknown'",
        ] {
            let m = format!("CUDA error: {kind} in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.{suffix}");
            assert!(matches!(classify(&m), RunError::CudaFatal(_)), "{m}");
        }
        for fatal in [
            "CUDA driver error: an illegal memory access was encountered",
            "CUDA driver error: unknown error",
        ] {
            assert!(matches!(classify(fatal), RunError::CudaFatal(_)), "{fatal}");
        }
        // More allocation failures are GPU memory (507)…
        for oom in [
            "CUDA driver error: out of memory".to_string(),
            // CuBLAS failing to create its handle on a full GPU.
            "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`\nException raised from createCublasHandle".to_string(),
            "cuFFT error: CUFFT_ALLOC_FAILED\nException raised from CUFFT_CHECK".to_string(),
            "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`"
                .to_string(),
        ] {
            assert!(matches!(classify(&oom), RunError::OutOfMemory(_)), "{oom}");
        }
        // …and a CUDA error that leaves the context usable is that request's error; the
        // model thread checks the device before believing it (`runner::pass`).
        for request in [
            format!("CUDA error: invalid configuration argument\nSearch for `cudaErrorInvalidConfiguration' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.{suffix}"),
            "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`".into(),
            "CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling `cublasSgemm( handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`".into(),
            "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`".into(),
            "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED_SHAPE".into(),
            "cuDNN error: CUDNN_STATUS_BAD_PARAM".into(),
            "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED".into(),
            // cuDNN failing to allocate *host* memory is not GPU memory (not a 507).
            "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED".into(),
            "cuFFT error: CUFFT_INVALID_SIZE".into(),
        ] {
            assert!(matches!(classify(&request), RunError::Cuda(_)), "{request}");
        }
    }

    /// A CUDA error met while copying outputs back (where an asynchronous one surfaces)
    /// is that CUDA error, not an output the server cannot write.
    #[test]
    fn a_cuda_error_while_writing_outputs_is_fatal() {
        let copy = "cannot read the model's output tensor: Internal torch error: CUDA error: device-side assert triggered\nSearch for `cudaErrorAssert'";
        assert!(matches!(
            cuda_first(RunError::Unsupported(copy.into())),
            RunError::CudaFatal(_)
        ));
        let oom = "cannot read output y: CUDA out of memory. Tried to allocate 20.00 MiB.";
        assert!(matches!(
            cuda_first(RunError::Request(oom.into())),
            RunError::OutOfMemory(_)
        ));
        let plain = RunError::Unsupported("output 0 has dtype ComplexFloat".into());
        assert_eq!(cuda_first(plain.clone()), plain);
    }

    /// A CUDA error raised inside a TorchScript model reaches tch as the
    /// interpreter's text around c10's multi-line CUDA message (torch 2.11's
    /// `InterpreterStateImpl::handleError` writes `RuntimeError: ` and the message without
    /// its backtrace); its useful line is the error, not the `TORCH_USE_CUDA_DSA` hint.
    #[test]
    fn a_cuda_error_inside_a_torchscript_model_is_named_not_the_dsa_hint() {
        let c10 = |what: &str, name: &str| {
            format!("CUDA error: {what}\nSearch for `{name}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
        };
        let interp = |inner: &str| {
            format!("The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript, serialized code (most recent call last):\n  File \"code/__torch__.py\", line 8, in forward\n    x: Tensor) -> Tensor:\n    _0 = torch.index_select(x, 0, self.idx)\n         ~~~~~~~~~~~~~~~~~~ <--- HERE\n    return _0\nRuntimeError: {inner}")
        };
        let fatal = interp(&c10(
            "an illegal memory access was encountered",
            "cudaErrorIllegalAddress",
        ));
        assert_eq!(
            classify(&fatal),
            RunError::CudaFatal(
                "RuntimeError: CUDA error: an illegal memory access was encountered".into()
            )
        );
        let request = interp(&c10(
            "invalid configuration argument",
            "cudaErrorInvalidConfiguration",
        ));
        assert_eq!(
            classify(&request),
            RunError::Cuda("RuntimeError: CUDA error: invalid configuration argument".into())
        );
        let oom = interp(&c10("out of memory", "cudaErrorMemoryAllocation"));
        assert_eq!(
            classify(&oom),
            RunError::OutOfMemory("RuntimeError: CUDA error: out of memory".into())
        );
        // Outside the interpreter (a pass of libtorch's own, the warm-up's synchronize) the
        // first line was already the error.
        let plain = format!("{}Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:44 (most recent call first):", c10("misaligned address", "cudaErrorMisalignedAddress"));
        assert_eq!(useful_line(&plain), "CUDA error: misaligned address");
        for m in [&fatal, &request, &oom, &plain] {
            assert!(!useful_line(m).contains("TORCH_USE_CUDA_DSA"), "{m}");
        }
    }

    /// What torch 2.11's runner throws when a package's pass fails
    /// (`AOTI_RUNTIME_ERROR_CODE_CHECK` in `model_container_runner.cpp`), whatever the CUDA
    /// error was: out of memory when the allocator counted a failed allocation during the
    /// pass (a 507, the cache emptied, the worker retired), else a CUDA error (the device is
    /// checked), never the model's own error (a 500 with no device check).
    #[test]
    fn a_package_failing_on_cuda_is_a_cuda_error_and_oom_by_the_allocators_count() {
        let runner = "run_func_( container_handle_, input_handles.data(), input_handles.size(), output_handles.data(), output_handles.size(), reinterpret_cast<AOTInductorStreamHandle>(stream_handle), proxy_executor_handle_) API call failed at /pytorch/torch/csrc/inductor/aoti_runner/model_container_runner.cpp, line 144";
        let oom = package_on_cuda(runner, true);
        assert!(
            matches!(&oom, RunError::OutOfMemory(m) if m.contains("API call failed") && m.contains("on the worker's standard error")),
            "{oom:?}"
        );
        let other = package_on_cuda(runner, false);
        assert!(
            matches!(&other, RunError::Cuda(m) if m.contains("inside the AOTInductor package")),
            "{other:?}"
        );
        let sticky = "CUDA error: an illegal memory access was encountered";
        assert!(matches!(
            package_on_cuda(sticky, false),
            RunError::CudaFatal(_)
        ));
        // The same text classified as any libtorch message is the model's own error.
        assert!(matches!(classify(runner), RunError::Model(_)));
    }

    #[test]
    fn long_messages_are_trimmed() {
        let long = "x".repeat(2000);
        assert!(useful_line(&long).chars().count() <= 501);
    }
}
