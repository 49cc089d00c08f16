//! Whether a libtorch error says a GPU allocation failed: the one reading of that text, for
//! the model's load (a cap too small for its weights) and for every pass (507, retire).

/// How libtorch 2.11 says a GPU allocation failed, on every allocator path (read from its
/// libraries: `strings libc10_cuda.so`, `libtorch_cuda.so`, `libcudnn_graph.so.9`,
/// `libcudart.so.13`): the native caching allocator and expandable segments ("CUDA out of
/// memory. Tried to allocate …"), `backend:cudaMallocAsync` ("Allocation on device 0 would
/// exceed allowed memory. (out of memory)"), a raw cudaMalloc through `C10_CUDA_CHECK`
/// ("CUDA error: out of memory") or the driver API ("CUDA driver error: out of memory"),
/// cuBLAS handle creation ("CUBLAS_STATUS_ALLOC_FAILED"), cuFFT plans ("CUFFT_ALLOC_FAILED"),
/// cuSOLVER ("CUSOLVER_STATUS_ALLOC_FAILED") and cuDNN 9's device allocation
/// ("CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"; its *host* allocation failure is
/// not GPU memory, and is a request error). tch hands over only the text
/// (`c10::OutOfMemoryError`'s class never reaches it), so the text decides.
const OOM_MARKS: &[&str] = &[
    "CUDA out of memory",
    "would exceed allowed memory",
    "CUDA error: out of memory",
    "CUDA driver error: out of memory",
    "cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "DEVICE_ALLOCATION_FAILED",
    "OutOfMemoryError",
];

/// Whether a libtorch message says a GPU allocation failed ([`OOM_MARKS`]). cuBLAS's
/// handle creation failing with `CUBLAS_STATUS_NOT_INITIALIZED` counts too: cuBLAS
/// documents that status for `cublasCreate` as "usually caused by the lack of a prior
/// cudaMalloc()" or a failed resource allocation, and under a full GPU it is how the
/// first matmul of a fresh context fails (libtorch raises it from `createCublasHandle`).
pub fn is_out_of_memory(msg: &str) -> bool {
    OOM_MARKS.iter().any(|m| msg.contains(m))
        || (msg.contains("CUBLAS_STATUS_NOT_INITIALIZED") && msg.contains("cublasCreate"))
}
