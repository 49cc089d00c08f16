//! The template process (`vf-template`): loads libtorch and the model on the CPU once, warms
//! it with `--warmup-passes` forward passes (`runner/warmup.rs`, one intra-op thread), stays
//! single-threaded, and forks ready-to-serve workers on the master's request
//! ([`TemplateRequest`]). It never touches CUDA and never starts a thread (checked after the
//! warm-up), so a `fork()` of it is safe; each worker starts its own threads (and, on a GPU,
//! its own CUDA context) after the fork.
//!
//! Double fork: the template forks a short-lived child that forks the worker and exits, so
//! the worker is re-parented to the master (a child subreaper) and stays the master's own
//! child for `waitpid` and signals. The worker then sets `PR_SET_PDEATHSIG`.
//!
//! The fork itself (copying the page tables of a process holding libtorch) takes
//! milliseconds, so the template keeps one **spare** (`vf-spare`) forked ahead: adopted by
//! the master and waiting for its configuration. A request hands the spare over and is
//! answered at once; the next spare is forked after the answer. A spare whose template goes
//! away exits.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use vramfork::master::worker_config::{TemplateRequest, WorkerConfig};
use vramfork::metadata::AppMetadata;
use vramfork::protocol::{worker_exit, BootTimes, ControlMsg, TemplateReply, CONTROL_FD};

use crate::model::Model;
use crate::process;
use crate::runner::Warmed;

mod fds;
mod fork;

use fds::{place, receive, send_with_fds, Attached};
use fork::{double_fork, leave};

/// How the template's part of a process ends.
pub enum Ended {
    /// The template ended (the master closed its channel, or it could not start): its exit
    /// status.
    Exit(i32),
    /// This is a process forked from the template and assigned a worker's seat: every frame
    /// of the template's loop has been left, and the caller boots it as that worker.
    Worker(Child),
}

/// A forked process's assignment and the model the template loaded, which it now owns alone.
pub struct Child {
    assignment: Assignment,
    module: Model,
}

/// What the master sent for a worker: its configuration and descriptors.
struct Assignment {
    cfg: Box<WorkerConfig>,
    fds: Attached,
}

/// Runs the template until the master closes its channel ([`Ended::Exit`]); in a process
/// forked from it, returns that process's assignment instead ([`Ended::Worker`]).
pub fn run(process_ms: f64) -> Ended {
    let (cfg, metadata) = match crate::config::from_env() {
        Ok(c) => c,
        Err(e) => {
            vramfork::logging::say(&format!("app-worker (template): {e}"));
            return Ended::Exit(worker_exit::CONFIG);
        }
    };
    // No writer thread: the template must stay single-threaded to fork.
    vramfork::logging::init_single_threaded(cfg.log.json);
    process::set_process_name("vf-template");
    // One intra-op thread while loading and warming up; each worker sets its own count
    // after the fork. With libtorch's default (one per core), loading a real model
    // (ResNet-50, BERT) starts its thread pool, and a process with threads must not fork.
    process::set_interop_thread();
    process::set_intra_threads(1);
    let (module, model_ms, warmed) = match load(&cfg, &metadata) {
        Ok(loaded) => loaded,
        Err(code) => return Ended::Exit(code),
    };
    // SAFETY: fd 4 is the template's inherited control socket; nothing else owns it.
    let mut control = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
    let ready = ControlMsg::Ready {
        pid: std::process::id(),
        boot_ms: BootTimes {
            process_ms,
            model_ms,
            warmup_ms: warmed.ms,
        },
        device: String::new(),
        memory: warmed.memory,
    };
    if control.write_all(ready.to_line().as_bytes()).is_err() {
        return Ended::Exit(worker_exit::OK);
    }
    tracing::debug!(model_ms, "template ready");
    match answer(control) {
        Answered::Exit(code) => Ended::Exit(code),
        Answered::Assigned(assignment) => Ended::Worker(Child { assignment, module }),
    }
}

/// Loads the model on the CPU and warms it up on this thread alone (the load's ms, the warm-up
/// with its memory peak); fails with the exit status if it cannot load or leaves a thread.
fn load(cfg: &WorkerConfig, metadata: &AppMetadata) -> Result<(Model, f64, Warmed), i32> {
    crate::model::configure_executor();
    let start = Instant::now();
    if let Err(e) = crate::runner::load_op_libraries(&metadata.op_libraries, &cfg.model_path) {
        vramfork::logging::say(&format!("app-worker (template): {e}"));
        return Err(worker_exit::MODEL_LOAD);
    }
    let module = match crate::model::load_cpu(&cfg.model_path, metadata, cfg.batch.max_batch_size) {
        Ok(m) => m,
        Err(e) => {
            vramfork::logging::say(&format!("app-worker (template): {e}"));
            return Err(worker_exit::MODEL_LOAD);
        }
    };
    let model_ms = start.elapsed().as_secs_f64() * 1e3;
    crate::model_archive::loaded(&cfg.model_path);
    // The warm-up passes run on this thread alone (one intra-op thread, set above).
    let plan =
        crate::runner::Warmup::plan(metadata, cfg.batch.warmup_passes, cfg.batch.max_batch_size);
    let warmed = match crate::runner::warm(
        &module,
        plan.as_ref(),
        &cfg.model_path,
        tch::Device::Cpu,
        true,
    ) {
        Ok(w) => w,
        Err(refused) => {
            vramfork::logging::say(&format!("app-worker (template): {refused}"));
            return Err(worker_exit::MODEL_LOAD);
        }
    };
    process::collapse_anonymous_memory();
    let threads = process::thread_count();
    if threads != Some(1) {
        tracing::warn!(
            ?threads,
            "the template has more than one thread after loading the model; forking it is unsafe, so workers will be started by exec"
        );
        return Err(worker_exit::TEMPLATE_UNFIT);
    }
    Ok((module, model_ms, warmed))
}

/// How [`answer`] ends: the template's exit status, or, in a forked process, its assignment.
enum Answered {
    Exit(i32),
    Assigned(Assignment),
}

/// A fork's two sides: the template goes on with `T`; the forked process leaves the
/// template's loop with its assignment (or the status to exit with when it has none).
enum Fork<T> {
    Template(T),
    Forked(Result<Assignment, i32>),
}

/// Answers the master's requests (a worker forked, from the spare kept ahead when there is
/// one) until it closes the channel; the exit status. In a forked process it returns at once
/// with what that process is to become.
fn answer(control: UnixStream) -> Answered {
    // A forked process closed the template's channel (fd 4) as it began (`leave`): the
    // handle must not close the number again, which may hold a received descriptor by then.
    let forked = |control: UnixStream, became: Result<Assignment, i32>| {
        let _ = control.into_raw_fd();
        match became {
            Ok(assignment) => Answered::Assigned(assignment),
            Err(code) => Answered::Exit(code),
        }
    };
    let mut control = control;
    let mut spare = match fork_spare() {
        Fork::Template(spare) => spare,
        Fork::Forked(became) => return forked(control, became),
    };
    let mut pending = Vec::new();
    loop {
        let (line, fds) = match receive(&control, &mut pending) {
            Ok(Some(x)) => x,
            Ok(None) => return Answered::Exit(worker_exit::OK),
            Err(e) => {
                tracing::warn!("template: control channel failed: {e}");
                return Answered::Exit(worker_exit::OK);
            }
        };
        let reply = match (
            serde_json::from_str::<TemplateRequest>(&line),
            fds.is_empty(),
        ) {
            (Ok(req), false) => {
                let handed = spare.take().map(|sp| sp.hand_over(&req.config, &fds));
                let pid = match handed {
                    Some(Ok(pid)) => Ok(Fork::Template(pid)),
                    Some(Err(e)) => {
                        tracing::warn!("template: the spare worker is gone ({e}); forking one");
                        fork_worker(req.config, fds)
                    }
                    None => fork_worker(req.config, fds),
                };
                match pid {
                    Ok(Fork::Template(pid)) => TemplateReply::Spawned { pid },
                    Ok(Fork::Forked(became)) => return forked(control, became),
                    Err(e) => TemplateReply::Failed {
                        error: e.to_string(),
                    },
                }
            }
            (Err(e), _) => TemplateReply::Failed {
                error: format!("bad request: {e}"),
            },
            (Ok(_), true) => TemplateReply::Failed {
                error: "request without a control socket attached".into(),
            },
        };
        let mut text = serde_json::to_string(&reply).expect("replies serialize");
        text.push('\n');
        if control.write_all(text.as_bytes()).is_err() {
            return Answered::Exit(worker_exit::OK);
        }
        // The next spare is forked after the answer, off the path of this request.
        if spare.is_none() {
            spare = match fork_spare() {
                Fork::Template(spare) => spare,
                Fork::Forked(became) => return forked(control, became),
            };
        }
    }
}

fn fork_spare() -> Fork<Option<Spare>> {
    match Spare::fork() {
        Ok(Fork::Template(spare)) => Fork::Template(Some(spare)),
        Ok(Fork::Forked(became)) => Fork::Forked(became),
        Err(e) => {
            tracing::warn!("template: cannot fork a spare worker: {e}");
            Fork::Template(None)
        }
    }
}

/// A worker forked ahead of demand: re-parented to the master, single-threaded, waiting on
/// `sock` for its configuration and control socket. Handing one over takes microseconds,
/// where forking the template (its page tables) takes milliseconds.
struct Spare {
    pid: u32,
    sock: UnixStream,
}

impl Spare {
    /// Forks the next spare; in the spare, waits for its assignment.
    fn fork() -> std::io::Result<Fork<Spare>> {
        let (ours, theirs) = UnixStream::pair()?;
        let master = std::os::unix::process::parent_id() as libc::pid_t;
        Ok(match double_fork()? {
            Some(pid) => {
                drop(theirs);
                Fork::Template(Spare { pid, sock: ours })
            }
            None => {
                drop(ours);
                Fork::Forked(become_spare(theirs, master))
            }
        })
    }

    /// Gives the spare its configuration and descriptors (control socket, material);
    /// returns its pid.
    fn hand_over(self, cfg: &WorkerConfig, fds: &[OwnedFd]) -> std::io::Result<u32> {
        let mut line = serde_json::to_vec(cfg).expect("configs serialize");
        line.push(b'\n');
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        send_with_fds(self.sock.as_raw_fd(), &line, &raw)?;
        Ok(self.pid)
    }
}

/// Forks a worker now (no spare at hand): the template gets its pid, the worker its
/// assignment.
fn fork_worker(cfg: WorkerConfig, fds: Attached) -> std::io::Result<Fork<u32>> {
    let master = std::os::unix::process::parent_id() as libc::pid_t;
    Ok(match double_fork()? {
        // The template's copies of the descriptors close here; the worker keeps its own.
        Some(pid) => Fork::Template(pid),
        None => Fork::Forked(leave(master).map(|()| Assignment {
            cfg: Box::new(cfg),
            fds,
        })),
    })
}

/// The spare's life: adopted by the master, it waits for its assignment (or for the
/// template to go away: then it has none, and exits).
fn become_spare(sock: UnixStream, master: i32) -> Result<Assignment, i32> {
    leave(master)?;
    process::set_process_name("vf-spare");
    let mut pending = Vec::new();
    let (line, fds) = match receive(&sock, &mut pending) {
        Ok(Some((line, fds))) if !fds.is_empty() => (line, fds),
        // The template went away (or sent nothing usable): nothing to become.
        _ => return Err(worker_exit::OK),
    };
    drop(sock);
    match serde_json::from_str::<WorkerConfig>(&line) {
        Ok(cfg) => Ok(Assignment {
            cfg: Box::new(cfg),
            fds,
        }),
        Err(e) => {
            vramfork::logging::say(&format!("app-worker (spare): bad assignment: {e}"));
            Err(worker_exit::CONFIG)
        }
    }
}

impl Child {
    /// The forked process becomes its worker: the first of its descriptors as the control
    /// channel (fd 4) and the second, when the configuration says so, as the key and TLS
    /// material (fd 7), CUDA pointed at this worker's GPU, the metadata read. What it boots
    /// with, or the status to exit with.
    pub fn into_worker(self) -> Result<(WorkerConfig, AppMetadata, Model), i32> {
        let Child {
            assignment: Assignment { cfg, fds },
            module,
        } = self;
        place(fds, cfg.secrets)?;
        // Still single-threaded: safe to change the environment; CUDA (lazy) sees its GPU
        // alone.
        for (k, v) in vramfork::protocol::gpu_env(cfg.gpu.as_ref()) {
            std::env::set_var(k, v);
        }
        match AppMetadata::parse(std::path::Path::new(&cfg.metadata_path), &cfg.metadata_json) {
            Ok(metadata) => Ok((*cfg, metadata, module)),
            Err(e) => {
                vramfork::logging::say(&format!("app-worker: {e}"));
                Err(worker_exit::CONFIG)
            }
        }
    }
}
