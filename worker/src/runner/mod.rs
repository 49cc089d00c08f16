//! The model on one dedicated thread. The `CModule` is loaded there and never leaves it;
//! requests arrive over a bounded channel, each with a oneshot reply; one forward pass at a
//! time, under `no_grad`, with every error (and any panic) turned into a [`RunError`].
//!
//! A queued job can be withdrawn until the model thread takes it ([`Ticket::withdraw`]):
//! one atomic decides, so a withdrawn job never runs and a started one is never withdrawn —
//! which is what lets the HTTP side tell a client "this request never ran, retry it".

pub mod batch;
mod batcher;
mod load;
mod ops;
mod tensors;
pub mod v2out;
mod warmup;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tch::{CModule, Device, IValue};
use tokio::sync::{mpsc, oneshot, watch};

pub use batch::Batching;
pub use batcher::BatchCounts;
pub use load::{configure_executor, load_cpu, LoadError};
pub use ops::load_all as load_op_libraries;
pub use tensors::kind_of;
pub use warmup::{boot_refusal, warm_up};

use crate::cuda;
use crate::input::{Arg, Inputs};

/// How many requests may wait for the model thread.
const QUEUE: usize = 64;

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
    /// Any other CUDA error: the context is unusable and the worker must exit.
    #[error("CUDA error while running the model: {0}")]
    CudaFatal(String),
    /// The model thread is gone (it panicked out, or the worker is stopping).
    #[error("the model thread is not running")]
    Gone,
}

/// How the outputs are written.
#[derive(Debug, Clone, Default)]
pub enum Encoding {
    /// `POST /`: the outputs as one JSON value (see `tensors.rs`).
    #[default]
    Json,
    /// The Open Inference Protocol: named output tensors (see `v2out.rs`).
    V2(v2out::Wanted),
}

/// A successful forward pass.
#[derive(Debug)]
pub struct RunOutput {
    /// The outputs as JSON text (for v2: the array of output objects).
    pub outputs: Vec<u8>,
    /// v2 outputs asked for as binary data, one after the other; `None` when none was.
    pub binary: Option<Vec<u8>>,
    /// The CUDA allocator's reserved bytes after the pass (None on CPU).
    pub gpu_reserved: Option<u64>,
    /// The input's move to the device, the forward pass and the outputs' copy into JSON.
    pub forward: std::time::Duration,
}

/// A job's claim: who gets it first, the model thread or a withdrawal.
const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const WITHDRAWN: u8 = 2;

struct Job {
    /// The request's id (`X-Request-Id`), for the model thread's log lines.
    id: Arc<str>,
    input: Inputs,
    encoding: Encoding,
    claim: Arc<AtomicU8>,
    /// When its (latest) pass started: set when it is taken, and again when it runs alone
    /// after its batch failed, so that `--request-timeout` counts its own pass.
    started: watch::Sender<Option<Instant>>,
    reply: oneshot::Sender<Result<RunOutput, RunError>>,
}

/// A job the model thread has claimed: it runs.
struct Taken {
    id: Arc<str>,
    input: Inputs,
    encoding: Encoding,
    /// Its rows, when it is part of a batch.
    rows: usize,
    started: watch::Sender<Option<Instant>>,
    reply: oneshot::Sender<Result<RunOutput, RunError>>,
}

impl Taken {
    /// Its own pass starts now (a re-run after a failed batch).
    fn restart(&self) {
        self.started.send_replace(Some(Instant::now()));
    }

    /// Runs it on a pass of its own and answers it.
    fn run_alone(self, module: &CModule, device: Device) {
        let _span = tracing::info_span!("request", request_id = %self.id).entered();
        let result = guarded(|| forward(module, device, &self.input, &self.encoding));
        self.answer(result);
    }

    /// Sends its outcome, freeing its input first, so that what the request used is gone by
    /// the time its answer is out (and a trim after it can give the memory back).
    fn answer(self, result: Result<RunOutput, RunError>) {
        let Taken { input, reply, .. } = self;
        drop(input);
        let _ = reply.send(result);
    }
}

impl Job {
    /// Whether it may still run: not withdrawn, and its client still waits.
    fn live(&self) -> bool {
        self.claim.load(Ordering::SeqCst) == QUEUED && !self.reply.is_closed()
    }

    /// Claims the job for the model (telling its ticket it started); `None` when it was
    /// withdrawn or its client is gone: it never runs.
    fn take(self) -> Option<Taken> {
        let taken = self
            .claim
            .compare_exchange(QUEUED, STARTED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if !taken || self.reply.is_closed() {
            return None;
        }
        self.started.send_replace(Some(Instant::now()));
        Some(Taken {
            id: self.id,
            input: self.input,
            encoding: self.encoding,
            rows: 0,
            started: self.started,
            reply: self.reply,
        })
    }
}

/// A submitted job, as the HTTP side holds it.
pub struct Ticket {
    claim: Arc<AtomicU8>,
    started: watch::Receiver<Option<Instant>>,
    reply: oneshot::Receiver<Result<RunOutput, RunError>>,
}

impl Ticket {
    /// Resolves once the model thread has taken the job (forever if it never does).
    pub async fn started(&mut self) {
        if self.started.wait_for(Option::is_some).await.is_err() {
            // Dropped unstarted (withdrawn, or the model thread is gone): never.
            std::future::pending::<()>().await;
        }
    }

    /// The job's outcome, or `None` when its pass ran past `limit`. The limit counts from
    /// the start of the job's latest pass: a request run again alone after its batch failed
    /// gets the whole limit for its own pass.
    pub async fn result_within(
        &mut self,
        limit: std::time::Duration,
    ) -> Option<Result<RunOutput, RunError>> {
        let mut watching = true;
        loop {
            let since = (*self.started.borrow()).unwrap_or_else(Instant::now);
            tokio::select! {
                r = &mut self.reply => {
                    return Some(r.map_err(|_| RunError::Gone).and_then(|r| r));
                }
                _ = tokio::time::sleep_until((since + limit).into()) => {
                    let latest = (*self.started.borrow()).unwrap_or(since);
                    if latest + limit <= Instant::now() {
                        return None;
                    }
                }
                changed = self.started.changed(), if watching => {
                    // A new pass began (look again), or the model thread let go of the job
                    // (its answer is on the way, or it is gone: the reply says which).
                    watching = changed.is_ok();
                }
            }
        }
    }

    /// Takes the job back if the model has not started it: `true` means it never runs.
    pub fn withdraw(&self) -> bool {
        self.claim
            .compare_exchange(QUEUED, WITHDRAWN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// What the loaded model looks like, for the rest of the worker.
#[derive(Debug, Clone, Copy)]
pub struct ModelInfo {
    /// The CUDA device index, when the model runs on a GPU.
    pub cuda: Option<usize>,
    pub model_ms: f64,
    /// The warm-up pass an exec'd worker ran on the declared inputs (0: none).
    pub warmup_ms: f64,
}

/// The profiling pass's outcome: its duration in ms, or the model's error.
pub type Profiled = Option<Result<f64, String>>;

/// A profiling pass to run on the model's device right after loading (`--profile-memory`).
pub struct Profile {
    pub specs: Vec<vramfork::metadata::TensorSpec>,
    pub shapes: Vec<Vec<i64>>,
}

/// The handle the HTTP side holds: cheap to clone.
#[derive(Clone)]
pub struct Runner {
    tx: mpsc::Sender<Job>,
    /// With batching on: forward passes by rows.
    batches: BatchCounts,
}

impl Runner {
    /// Starts the model thread and loads the model there; returns once it is loaded. A
    /// `preloaded` module (the template's, on the CPU) is used as is when the model runs on
    /// the CPU; on a GPU the model is loaded from the file onto the device. With
    /// `batching`, queued requests that can be stacked share forward passes (`batcher.rs`).
    pub fn start(
        path: &str,
        wanted: vramfork::protocol::Device,
        cap_bytes: Option<u64>,
        preloaded: Option<CModule>,
        batching: Option<Batching>,
        profile: Option<Profile>,
        warm: Option<Vec<vramfork::metadata::TensorSpec>>,
    ) -> Result<(Runner, ModelInfo, Profiled), LoadError> {
        let queue = batching.map_or(QUEUE, |b| QUEUE.max(2 * b.max_rows));
        let (tx, rx) = mpsc::channel::<Job>(queue);
        let batches = BatchCounts::default();
        let counts = batches.clone();
        let (loaded_tx, loaded_rx) = std::sync::mpsc::channel();
        let path = path.to_string();
        let spawned = std::thread::Builder::new()
            .name("vf-model".into())
            .spawn(move || {
                load::configure_executor();
                // A module the template loaded was warmed there already.
                let warm = warm.filter(|_| preloaded.is_none() && profile.is_none());
                let loaded = load::pick_device(wanted, &path).and_then(|d| match (d, preloaded) {
                    (Device::Cpu, Some(module)) => Ok(load::Loaded {
                        module,
                        device: d,
                        model_ms: 0.0,
                    }),
                    (d, _) => load::load(&path, d, cap_bytes),
                });
                match loaded {
                    Ok(l) => {
                        let warmup_ms = match warm
                            .as_deref()
                            .map(|specs| (specs, warm_up(&l.module, Some(specs), None, l.device)))
                        {
                            None | Some((_, Ok(None))) => 0.0,
                            Some((_, Ok(Some(ms)))) => ms,
                            Some((specs, Err(e))) => match boot_refusal(&path, specs, &e) {
                                Some(refused) => {
                                    let _ = loaded_tx.send(Err(refused));
                                    return;
                                }
                                None => {
                                    tracing::warn!(
                                        "the warm-up pass on the declared input shape failed ({e}); starting cold"
                                    );
                                    0.0
                                }
                            },
                        };
                        let info = ModelInfo {
                            cuda: match l.device {
                                Device::Cuda(i) => Some(i),
                                _ => None,
                            },
                            model_ms: l.model_ms,
                            warmup_ms,
                        };
                        let profiled = profile.map(|p| {
                            warm_up(&l.module, Some(&p.specs), Some(&p.shapes), l.device)
                                .and_then(|ms| ms.ok_or_else(|| "no input to run".to_string()))
                        });
                        let _ = loaded_tx.send(Ok((info, profiled)));
                        match batching {
                            Some(b) => batcher::serve(l.module, l.device, rx, b, counts),
                            None => serve(l.module, l.device, rx),
                        }
                    }
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e));
                    }
                }
            });
        if let Err(e) = spawned {
            return Err(LoadError::Model {
                path: String::new(),
                reason: format!("cannot start the model thread: {e}"),
            });
        }
        match loaded_rx.recv() {
            Ok(Ok((info, profiled))) => Ok((Runner { tx, batches }, info, profiled)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LoadError::Model {
                path: String::new(),
                reason: "the model thread died while loading (a panic in libtorch?)".into(),
            }),
        }
    }

    /// With batching on: forward passes so far, by rows.
    pub fn batches(&self) -> BTreeMap<u32, u64> {
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Queues one forward pass (waiting for a queue slot when many are queued).
    pub async fn submit(
        &self,
        id: Arc<str>,
        input: Inputs,
        encoding: Encoding,
    ) -> Result<Ticket, RunError> {
        let (reply, reply_rx) = oneshot::channel();
        let (started, started_rx) = watch::channel(None);
        let claim = Arc::new(AtomicU8::new(QUEUED));
        self.tx
            .send(Job {
                id,
                input,
                encoding,
                claim: claim.clone(),
                started,
                reply,
            })
            .await
            .map_err(|_| RunError::Gone)?;
        Ok(Ticket {
            claim,
            started: started_rx,
            reply: reply_rx,
        })
    }
}

/// The model thread's loop: one job at a time until every sender is gone.
fn serve(module: CModule, device: Device, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.blocking_recv() {
        let Some(taken) = job.take() else {
            // Withdrawn while it waited (or its client is gone): it never runs.
            continue;
        };
        taken.run_alone(&module, device);
    }
}

/// The input's move to the device and the forward pass, under `no_grad`.
fn pass(module: &CModule, device: Device, args: &[Arg]) -> Result<IValue, RunError> {
    let args = args
        .iter()
        .map(|a| tensors::to_ivalue(a, device))
        .collect::<Result<Vec<IValue>, _>>()
        .map_err(|e| classify(&e.to_string()))?;
    let out = tch::no_grad(|| module.forward_is(&args)).map_err(|e| classify(&e.to_string()));
    // Kernels run asynchronously: an error of this pass's (a device-side assert, an illegal
    // address) is known only once the device has finished; wait here so that it is this
    // pass's error, and the worker's last, not the next request's.
    let out = match (out, device) {
        (Ok(v), Device::Cuda(_)) => match cuda::synchronize() {
            Ok(()) | Err(cuda::CudaError::NoCuda) => Ok(v),
            Err(cuda::CudaError::C10(msg)) => Err(match classify(&msg) {
                RunError::Model(line) => RunError::CudaFatal(line),
                e => e,
            }),
        },
        (out, _) => out,
    };
    if matches!(out, Err(RunError::OutOfMemory(_))) {
        // Hand the cached blocks back so the answer (and other processes) can proceed.
        let _ = cuda::empty_cache();
    }
    out
}

/// Outputs as JSON text, and v2's binary data if any was asked for.
type Written = (Vec<u8>, Option<Vec<u8>>);

/// The outputs written as the request asked. Copying a CUDA output to the CPU is where a
/// CUDA error can still surface: it is reported as one (the worker must go), not as an
/// output the server cannot write.
fn encode(out: &IValue, encoding: &Encoding) -> Result<Written, RunError> {
    write_outputs(out, encoding).map_err(cuda_first)
}

/// An error whose text is a CUDA failure becomes that failure, whatever step reported it.
fn cuda_first(e: RunError) -> RunError {
    match &e {
        RunError::Unsupported(m) | RunError::Request(m) | RunError::Model(m) => match classify(m) {
            cuda @ (RunError::OutOfMemory(_) | RunError::CudaFatal(_)) => cuda,
            _ => e,
        },
        _ => e,
    }
}

fn write_outputs(out: &IValue, encoding: &Encoding) -> Result<Written, RunError> {
    let mut outputs = Vec::new();
    let binary = match encoding {
        Encoding::Json => {
            tensors::write_json(out, &mut outputs).map_err(RunError::Unsupported)?;
            None
        }
        Encoding::V2(wanted) => {
            let mut tail = Vec::new();
            v2out::write(out, wanted, &mut outputs, &mut tail)?.then_some(tail)
        }
    };
    Ok((outputs, binary))
}

/// The CUDA allocator's reserved bytes now (None on the CPU).
fn reserved(device: Device) -> Option<u64> {
    match device {
        Device::Cuda(i) => cuda::memory_stats(i).ok().map(|s| s.reserved),
        _ => None,
    }
}

fn forward(
    module: &CModule,
    device: Device,
    input: &Inputs,
    encoding: &Encoding,
) -> Result<RunOutput, RunError> {
    let start = Instant::now();
    let out = pass(module, device, &input.args)?;
    let (outputs, binary) = encode(&out, encoding)?;
    drop(out);
    let gpu_reserved = reserved(device);
    // On CUDA the pass is only known to be over once its outputs are copied out.
    let forward = start.elapsed();
    tracing::debug!(ms = forward.as_secs_f64() * 1e3, "forward");
    Ok(RunOutput {
        outputs,
        binary,
        gpu_reserved,
        forward,
    })
}

/// Runs `f`, turning a panic into the model's error.
fn guarded<T>(f: impl FnOnce() -> Result<T, RunError>) -> Result<T, RunError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(RunError::Model(panic_message(&p))))
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    let msg = p
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| p.downcast_ref::<&str>().copied())
        .unwrap_or("a panic");
    format!("the model panicked: {}", useful_line(msg))
}

/// How libtorch 2.11 says a GPU allocation failed, on every allocator path (read from its
/// libraries: `strings libc10_cuda.so`, `libtorch_cuda.so`, `libcudnn_graph.so.9`):
/// the native caching allocator and expandable segments ("CUDA out of memory. Tried to
/// allocate …"), `backend:cudaMallocAsync` ("Allocation on device 0 would exceed allowed
/// memory. (out of memory)"), a raw cudaMalloc through `C10_CUDA_CHECK` ("CUDA error: out
/// of memory"), cuBLAS handle creation ("CUBLAS_STATUS_ALLOC_FAILED") and cuDNN 9
/// ("CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"). tch hands over only the text
/// (`c10::OutOfMemoryError`'s class never reaches it), so the text decides.
const OOM_MARKS: &[&str] = &[
    "CUDA out of memory",
    "would exceed allowed memory",
    "CUDA error: out of memory",
    "cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "ALLOCATION_FAILED",
    "OutOfMemoryError",
];

/// Every other CUDA failure: after one, the process's CUDA context is unusable (sticky
/// errors: device-side assert, illegal address, launch failure…).
const CUDA_MARKS: &[&str] = &[
    "CUDA error",
    "CUDA driver error",
    "CUBLAS_STATUS",
    "cuDNN error",
    "CUDNN_STATUS",
    "device-side assert",
    "illegal memory access",
];

/// Whether a libtorch message says a GPU allocation failed ([`OOM_MARKS`]).
pub fn is_out_of_memory(msg: &str) -> bool {
    OOM_MARKS.iter().any(|m| msg.contains(m))
}

/// Sorts a libtorch error into OOM, other CUDA errors, or a model error.
pub fn classify(msg: &str) -> RunError {
    let line = useful_line(msg);
    if is_out_of_memory(msg) {
        RunError::OutOfMemory(line)
    } else if CUDA_MARKS.iter().any(|m| msg.contains(m)) {
        RunError::CudaFatal(line)
    } else {
        RunError::Model(line)
    }
}

/// The line of a libtorch message a user can act on: for a TorchScript exception the last
/// line (`builtins.ValueError: …`), else the first; never the C++ backtrace.
pub fn useful_line(msg: &str) -> String {
    let lines: Vec<&str> = msg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
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
        for fatal in [
            "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`",
            "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
            "CUDA driver error: an illegal memory access was encountered",
        ] {
            assert!(matches!(classify(fatal), RunError::CudaFatal(_)), "{fatal}");
        }
    }

    /// A CUDA error met while copying outputs back (where an asynchronous one surfaces)
    /// is that CUDA error, not an output the server cannot write (issue 24, item 5).
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

    #[test]
    fn long_messages_are_trimmed() {
        let long = "x".repeat(2000);
        assert!(useful_line(&long).chars().count() <= 501);
    }
}
