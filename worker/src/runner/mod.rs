//! The model on one dedicated thread. The model ([`Model`]) is loaded there and never leaves it;
//! requests arrive over a bounded channel, each with a oneshot reply; one forward pass at a
//! time, under `no_grad`, with every error (and any panic) turned into a [`RunError`].
//!
//! A queued job can be withdrawn until the model thread takes it ([`Claim::withdraw`]):
//! one atomic decides, so a withdrawn job never runs and a started one is never withdrawn —
//! which is what lets the HTTP side tell a client "this request never ran, retry it".
//!
//! The model thread wakes the HTTP side once per request, with the answer: that a pass
//! started is written where the HTTP side reads it when one of its timers fires
//! ([`Claim::started_at`]), not sent to it (a wake-up less per request, which small models
//! pay for in full).
//!
//! Queued jobs are served by lane (`lanes.rs`): the highest lane first, the oldest first
//! within a lane, a job past its age limit as if high. A request of several passes submits
//! one job per pass, so it yields to higher lanes between its passes.

pub mod batch;
mod batcher;
mod claim;
mod failure;
mod info;
mod inline;
mod job;
mod lanes;
mod ops;
pub mod parts;
pub mod pass_tokens;
mod shared_pass;
mod tensors;
pub mod v2out;
mod warmup;

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use tch::{Device, IValue};
use tokio::sync::{mpsc, oneshot};
use vramfork::lanes::{Lane, LANES};

pub use batch::Batching;
pub use batcher::BatchCounts;
use claim::Queued;
pub use claim::{Claim, Ticket};
pub use failure::{useful_line, RunError};
pub use info::ModelInfo;
pub use inline::Inline;
pub use ops::load_all as load_op_libraries;
pub use shared_pass::SharedPass;
pub use v2out::{OutTensor, Wanted};
pub use warmup::{warm, Warmed, Warmup};

use crate::args::{Arg, Inputs};
use crate::cuda;
use crate::model::{self, Declared, Failure, LoadError, Model};
use failure::{classify, cuda_first};
use job::{Job, Taken};
use lanes::Place;

/// How many requests may wait for the model thread.
const QUEUE: usize = 64;

/// What the model thread makes of the outputs.
#[derive(Debug, Clone, Default)]
pub enum Encoding {
    /// `POST /`'s JSON, written straight from the tensors' memory (see `tensors.rs`): its
    /// one writer, on the model thread.
    #[default]
    Json,
    /// Typed output tensors (see `v2out.rs`), which the door writes in its own format.
    Tensors(v2out::Wanted),
}

/// The outputs of a pass, as the request's [`Encoding`] asked.
#[derive(Debug)]
pub enum Outputs {
    /// `POST /`'s JSON text.
    Json(Vec<u8>),
    /// The outputs asked for, in the request's order.
    Tensors(Vec<OutTensor>),
}

impl Outputs {
    /// The JSON text of [`Encoding::Json`].
    pub fn json(self) -> Result<Vec<u8>, RunError> {
        match self {
            Outputs::Json(j) => Ok(j),
            Outputs::Tensors(_) => Err(RunError::Unsupported(
                "the outputs came as tensors where JSON was asked for".into(),
            )),
        }
    }

    /// The tensors of [`Encoding::Tensors`].
    pub fn tensors(self) -> Result<Vec<OutTensor>, RunError> {
        match self {
            Outputs::Tensors(t) => Ok(t),
            Outputs::Json(_) => Err(RunError::Unsupported(
                "the outputs came as JSON where tensors were asked for".into(),
            )),
        }
    }
}

/// A successful forward pass.
#[derive(Debug)]
pub struct RunOutput {
    pub outputs: Outputs,
    /// The CUDA allocator's reserved bytes after the pass (None on CPU).
    pub gpu_reserved: Option<u64>,
    /// The input's move to the device, the forward pass and the outputs' copy into JSON.
    pub forward: std::time::Duration,
    /// Requests in the pass it ran in (1: alone).
    pub batch: u32,
    /// Run on the event loop's thread, not the model thread (`inline.rs`).
    pub inline: bool,
    /// Its documents' pre-processing (set by the pipeline; `None`: it had none).
    pub preprocess: Option<std::time::Duration>,
    /// The pass it shared with other requests (`None`: it ran alone).
    pub pass: Option<Arc<SharedPass>>,
}

/// The profiling pass's outcome: its duration in ms, or the model's error.
pub type Profiled = Option<Result<f64, String>>;

/// A profiling pass to run on the model's device right after loading (`--profile-memory`).
pub struct Profile {
    pub specs: Vec<vramfork::metadata::TensorSpec>,
    pub shapes: Vec<Vec<i64>>,
}

/// What [`Runner::start`] needs: the model, where it runs, and how.
pub struct Setup {
    pub path: String,
    pub wanted: vramfork::protocol::Device,
    /// The CUDA allocator's cap in bytes.
    pub cap_bytes: Option<u64>,
    /// The template's model (on the CPU), when forked from it.
    pub preloaded: Option<Model>,
    /// What the metadata says the model takes (checked at load where the format says).
    pub declared: Declared,
    pub batching: Option<Batching>,
    pub profile: Option<Profile>,
    pub warm: Option<Warmup>,
    /// Torch intra-op threads for the passes (`--torch-threads`), set on the model thread.
    pub threads: usize,
    /// `--inline-passes auto`: small CPU passes may run on the event loop (`inline.rs`).
    pub inline: bool,
}

/// The handle the HTTP side holds: cheap to clone.
#[derive(Clone)]
pub struct Runner {
    tx: mpsc::Sender<Job>,
    /// With batching on: forward passes by rows.
    batches: BatchCounts,
    /// Jobs submitted that the model thread has not taken yet.
    queued: Queued,
    /// Small CPU passes run on the caller's thread (`inline.rs`); `None`: never.
    inline: Option<Arc<Inline>>,
}

impl Runner {
    /// Starts the model thread and loads the model there; returns once it is loaded. A
    /// `preloaded` module (the template's, on the CPU) is used as is when the model runs on
    /// the CPU; on a GPU the model is loaded from the file onto the device. With
    /// `batching`, queued requests that can be stacked share forward passes (`batcher.rs`).
    pub fn start(setup: Setup) -> Result<(Runner, ModelInfo, Profiled), LoadError> {
        let Setup {
            path,
            wanted,
            cap_bytes,
            preloaded,
            declared,
            batching,
            profile,
            warm,
            threads,
            inline,
        } = setup;
        let queue = batching.map_or(QUEUE, |b| QUEUE.max(2 * b.max_rows));
        let (tx, rx) = mpsc::channel::<Job>(queue);
        let batches = BatchCounts::default();
        let counts = batches.clone();
        let (loaded_tx, loaded_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("vf-model".into())
            .spawn(move || {
                // Before anything runs here: libtorch's intra-op setting is this thread's own
                // (see `crate::process::set_intra_threads`).
                crate::process::set_intra_threads(threads);
                model::configure_executor();
                // A module the template loaded was warmed there already.
                let warm = warm.filter(|_| preloaded.is_none() && profile.is_none());
                let loaded = model::pick_device(wanted, &path).and_then(|d| match (d, preloaded) {
                    (Device::Cpu, Some(module)) => Ok(model::Loaded {
                        module,
                        device: d,
                        model_ms: 0.0,
                    }),
                    (d, _) => model::load(&path, d, cap_bytes, &declared),
                });
                match loaded {
                    Ok(l) => {
                        let warmed =
                            match warmup::warm(&l.module, warm.as_ref(), &path, l.device, false) {
                                Ok(w) => w,
                                Err(refused) => {
                                    let _ = loaded_tx.send(Err(refused));
                                    return;
                                }
                            };
                        let info = ModelInfo::of(l.device, l.model_ms, &warmed);
                        let profiled = profile
                            .map(|p| warmup::warm_up(&l.module, &p.specs, &p.shapes, l.device));
                        match batching {
                            Some(b) => {
                                let _ = loaded_tx.send(Ok((info, profiled, None)));
                                batcher::serve(l.module, l.device, rx, b, counts)
                            }
                            None => {
                                let model = Inline::new(l.module, l.device, threads, inline);
                                let _ = loaded_tx.send(Ok((info, profiled, Some(model.clone()))));
                                serve(model, l.device, rx)
                            }
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
            Ok(Ok((info, profiled, inline))) => {
                let queued = Queued::default();
                let inline = inline.filter(|i| i.enabled());
                Ok((
                    Runner {
                        tx,
                        batches,
                        queued,
                        inline,
                    },
                    info,
                    profiled,
                ))
            }
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

    /// Requests submitted that the model thread has not started yet (waiting behind a
    /// pass, or for a queue slot): what `/metrics` counts as this worker's model queue.
    pub fn queued(&self) -> u32 {
        self.queued.get()
    }

    /// [`Runner::queued`] by lane, highest first ([`LANES`]).
    pub fn queued_lanes(&self) -> [u32; LANES.len()] {
        self.queued.lanes()
    }

    /// Queues one forward pass in `lane` (waiting for a queue slot when many are queued),
    /// served as if high once it waited `age_limit`; past `deadline` it will not start.
    pub async fn submit(
        &self,
        id: Arc<str>,
        input: Inputs,
        encoding: Encoding,
        deadline: Option<Instant>,
        (lane, age_limit): (Lane, std::time::Duration),
    ) -> Result<Ticket, RunError> {
        let (reply, reply_rx) = oneshot::channel();
        let claim = Arc::new(Claim::queued(&self.queued, lane));
        self.tx
            .send(Job {
                id,
                input,
                encoding,
                deadline,
                place: Place::now(lane, age_limit),
                claim: claim.clone(),
                reply,
            })
            .await
            .map_err(|_| RunError::Gone)?;
        Ok(Ticket {
            claim,
            reply: reply_rx,
        })
    }
}

/// The model thread's loop: one job at a time until every sender is gone, the first by
/// lane of those queued (`lanes.rs`).
fn serve(model: Arc<Inline>, device: Device, mut rx: mpsc::Receiver<Job>) {
    let mut queue: VecDeque<Job> = VecDeque::new();
    while lanes::refill(&mut rx, &mut queue, QUEUE, |job| job) {
        let next = lanes::first(&queue, |j| j.place, Instant::now());
        let Some(job) = next.and_then(|i| queue.remove(i)) else {
            continue;
        };
        let Some(taken) = job.take() else {
            // Withdrawn while it waited (or its client is gone): it never runs.
            continue;
        };
        let mut policy = model.hold();
        if !model.enabled() {
            taken.run_alone(model.module(), device);
            continue;
        }
        let size = inline::size(&taken.input);
        let cpu = inline::thread_cpu();
        taken.run_alone(model.module(), device);
        policy.record(size, inline::thread_cpu().saturating_sub(cpu), false);
    }
}

/// The input's move to the device and the forward pass, under `no_grad`.
fn pass(module: &Model, device: Device, args: &[Arg]) -> Result<IValue, RunError> {
    pass_tokens::note(args);
    let args = args
        .iter()
        .map(|a| tensors::to_ivalue(a, device))
        .collect::<Result<Vec<IValue>, _>>()
        .map_err(|e| classify(&e.to_string()))?;
    let out = tch::no_grad(|| module.forward(&args)).map_err(|e| match e {
        // The request's tensors are not what the program takes: the request's fault (400).
        Failure::Input(m) => RunError::Request(m),
        Failure::Torch(m) => classify(&m),
        Failure::Device {
            message,
            out_of_memory,
        } => failure::package_on_cuda(&message, out_of_memory),
    });
    // Kernels run asynchronously: an error of this pass's (a device-side assert, an illegal
    // address) is known only once the device has finished; wait here so that it is this
    // pass's error, and the worker's last, not the next request's.
    // A CUDA error that should leave the context usable (this input's: an unsupported size
    // or type) is checked the same way: if the device then fails, it was not.
    let out = match (out, device) {
        (Ok(v), Device::Cuda(_)) => device_check().map(|()| v),
        (Err(e @ RunError::Cuda(_)), Device::Cuda(_)) => device_check().and(Err(e)),
        (out, _) => out,
    };
    if matches!(out, Err(RunError::OutOfMemory(_))) {
        // Hand the cached blocks back so the answer (and other processes) can proceed.
        let _ = cuda::empty_cache();
    }
    out
}

/// Waits for the device's work; a failure there leaves the context unusable
/// ([`RunError::CudaFatal`]), unless it is running out of memory.
fn device_check() -> Result<(), RunError> {
    match cuda::synchronize() {
        Ok(()) | Err(cuda::CudaError::NoCuda) => Ok(()),
        Err(cuda::CudaError::C10(msg)) => Err(match classify(&msg) {
            RunError::Model(line) | RunError::Cuda(line) => RunError::CudaFatal(line),
            e => e,
        }),
    }
}

/// The outputs written as the request asked. Copying a CUDA output to the CPU is where a
/// CUDA error can still surface: it is reported as one (the worker must go), not as an
/// output the server cannot write.
fn encode(out: &IValue, encoding: &Encoding) -> Result<Outputs, RunError> {
    write_outputs(out, encoding).map_err(cuda_first)
}

fn write_outputs(out: &IValue, encoding: &Encoding) -> Result<Outputs, RunError> {
    match encoding {
        Encoding::Json => {
            let mut json = Vec::new();
            tensors::write_json(out, &mut json).map_err(RunError::Unsupported)?;
            Ok(Outputs::Json(json))
        }
        Encoding::Tensors(wanted) => v2out::tensors(out, wanted).map(Outputs::Tensors),
    }
}

/// The CUDA allocator's reserved bytes now (None on the CPU).
fn reserved(device: Device) -> Option<u64> {
    match device {
        Device::Cuda(i) => cuda::memory_stats(i).ok().map(|s| s.reserved),
        _ => None,
    }
}

fn forward(
    module: &Model,
    device: Device,
    input: &Inputs,
    encoding: &Encoding,
) -> Result<RunOutput, RunError> {
    let start = Instant::now();
    let out = parts::pass(module, device, &input.args)?;
    let outputs = encode(&out, encoding)?;
    drop(out);
    let gpu_reserved = reserved(device);
    // On CUDA the pass is only known to be over once its outputs are copied out.
    let forward = start.elapsed();
    tracing::debug!(ms = forward.as_secs_f64() * 1e3, "forward");
    Ok(RunOutput {
        outputs,
        gpu_reserved,
        forward,
        batch: 1,
        inline: false,
        preprocess: None,
        pass: None,
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
