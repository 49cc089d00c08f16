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

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vramfork::metadata::AppMetadata;
use vramfork::protocol::{
    worker_exit, BootTimes, ControlMsg, TemplateReply, TemplateRequest, WorkerConfig, CONTROL_FD,
    SECRETS_FD,
};

use crate::process;
use crate::runner::{Model, Warmed};

/// Runs the template until the master closes its channel; returns the exit status.
pub fn run(process_ms: f64) -> i32 {
    let (cfg, metadata) = match crate::config::from_env() {
        Ok(c) => c,
        Err(e) => {
            vramfork::logging::say(&format!("app-worker (template): {e}"));
            return worker_exit::CONFIG;
        }
    };
    // No writer thread: the template must stay single-threaded to fork.
    vramfork::logging::init_single_threaded(cfg.log_json);
    process::set_process_name("vf-template");
    // One intra-op thread while loading and warming up; each worker sets its own count
    // after the fork. With libtorch's default (one per core), loading a real model
    // (ResNet-50, BERT) starts its thread pool, and a process with threads must not fork.
    process::set_interop_thread();
    process::set_intra_threads(1);
    let (module, model_ms, warmed) = match load(&cfg, &metadata) {
        Ok(loaded) => loaded,
        Err(code) => return code,
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
        return worker_exit::OK;
    }
    tracing::debug!(model_ms, "template ready");
    answer(control, &module)
}

/// Loads the model on the CPU and warms it up on this thread alone (the load's ms, the warm-up
/// with its memory peak); fails with the exit status if it cannot load or leaves a thread.
fn load(cfg: &WorkerConfig, metadata: &AppMetadata) -> Result<(Model, f64, Warmed), i32> {
    crate::runner::configure_executor();
    let start = Instant::now();
    if let Err(e) = crate::runner::load_op_libraries(&metadata.op_libraries, &cfg.model_path) {
        vramfork::logging::say(&format!("app-worker (template): {e}"));
        return Err(worker_exit::MODEL_LOAD);
    }
    let module = match crate::runner::load_cpu(&cfg.model_path, metadata, cfg.max_batch_size) {
        Ok(m) => m,
        Err(e) => {
            vramfork::logging::say(&format!("app-worker (template): {e}"));
            return Err(worker_exit::MODEL_LOAD);
        }
    };
    let model_ms = start.elapsed().as_secs_f64() * 1e3;
    // The warm-up passes run on this thread alone (one intra-op thread, set above).
    let plan = crate::runner::Warmup::plan(metadata, cfg.warmup_passes, cfg.max_batch_size);
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

/// Answers the master's requests (a worker forked, from the spare kept ahead when there is
/// one) until it closes the channel; the exit status.
fn answer(mut control: UnixStream, module: &Model) -> i32 {
    let mut spare = fork_spare(module);
    let mut pending = Vec::new();
    loop {
        let (line, fds) = match receive(&control, &mut pending) {
            Ok(Some(x)) => x,
            Ok(None) => return worker_exit::OK,
            Err(e) => {
                tracing::warn!("template: control channel failed: {e}");
                return worker_exit::OK;
            }
        };
        let reply = match (
            serde_json::from_str::<TemplateRequest>(&line),
            fds.is_empty(),
        ) {
            (Ok(req), false) => {
                let handed = spare.take().map(|sp| sp.hand_over(&req.config, &fds));
                let pid = match handed {
                    Some(Ok(pid)) => Ok(pid),
                    Some(Err(e)) => {
                        tracing::warn!("template: the spare worker is gone ({e}); forking one");
                        fork_worker(req.config, fds, module)
                    }
                    None => fork_worker(req.config, fds, module),
                };
                match pid {
                    Ok(pid) => TemplateReply::Spawned { pid },
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
            return worker_exit::OK;
        }
        // The next spare is forked after the answer, off the path of this request.
        if spare.is_none() {
            spare = fork_spare(module);
        }
    }
}

fn fork_spare(module: &Model) -> Option<Spare> {
    Spare::fork(module)
        .map_err(|e| tracing::warn!("template: cannot fork a spare worker: {e}"))
        .ok()
}

/// The descriptors a request carries: the worker's control socket, then (when the master
/// has any) the key and TLS material for `SECRETS_FD` (`vramfork::secrets`).
type Attached = Vec<OwnedFd>;

/// Reads one request line and the descriptors attached to it.
fn receive(
    control: &UnixStream,
    pending: &mut Vec<u8>,
) -> std::io::Result<Option<(String, Attached)>> {
    let mut fds = Vec::new();
    loop {
        if let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            return Ok(Some((text, fds)));
        }
        let mut buf = vec![0u8; 64 * 1024];
        let (n, got) = recv_with_fds(control.as_raw_fd(), &mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        fds.extend(got);
        pending.extend_from_slice(&buf[..n]);
    }
}

fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Attached)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for a control message of a few descriptors (CMSG_SPACE of two ints is 24).
    let mut cmsg = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg);
    // SAFETY: msg points at `iov` (describing `buf`) and `cmsg`, both alive and writable
    // for the whole call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control buffer the kernel just filled in, within
    // msg_controllen; SCM_RIGHTS data is an array of int descriptors now owned by this
    // process, as many as fit in the message's length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for k in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    let raw = std::ptr::read_unaligned(data.add(k));
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, fds))
}

/// A worker forked ahead of demand: re-parented to the master, single-threaded, waiting on
/// `sock` for its configuration and control socket. Handing one over takes microseconds,
/// where forking the template (its page tables) takes milliseconds.
struct Spare {
    pid: u32,
    sock: UnixStream,
}

impl Spare {
    /// Forks the next spare.
    fn fork(module: &Model) -> std::io::Result<Spare> {
        let (ours, theirs) = UnixStream::pair()?;
        let master = std::os::unix::process::parent_id() as libc::pid_t;
        let theirs_fd = theirs.as_raw_fd();
        let ours_fd = ours.as_raw_fd();
        let pid = double_fork(|| {
            // SAFETY: closing the template's end in the spare; `ours` is never used here.
            unsafe { libc::close(ours_fd) };
            // SAFETY: `theirs` is this process's end of the pair; nothing else owns it.
            let sock = unsafe { UnixStream::from_raw_fd(theirs_fd) };
            become_spare(sock, module, master)
        })?;
        drop(theirs);
        Ok(Spare { pid, sock: ours })
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

fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    const MAX_FDS: usize = 4;
    assert!(fds.len() <= MAX_FDS, "at most {MAX_FDS} descriptors");
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cmsg = [0u64; 8];
    let size = std::mem::size_of_val(fds) as u32;
    // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below, and the
    // control buffer (64 bytes) holds MAX_FDS descriptors (CMSG_SPACE(16) = 32).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(size) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size) as _;
        let slots = libc::CMSG_DATA(c) as *mut libc::c_int;
        for (k, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(slots.add(k), *fd);
        }
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if (n as usize) < data.len() {
            let mut s = std::mem::ManuallyDrop::new(UnixStream::from_raw_fd(sock));
            s.write_all(&data[n as usize..])?;
        }
    }
    Ok(())
}

/// Forks a worker now (no spare at hand); returns its pid.
fn fork_worker(cfg: WorkerConfig, fds: Attached, module: &Model) -> std::io::Result<u32> {
    let master = std::os::unix::process::parent_id() as libc::pid_t;
    // In the template the closure is dropped unrun, closing the template's copy of
    // `control`; in the worker it runs and `control` becomes the worker's channel.
    double_fork(move || {
        if adopt(master).is_err() {
            return worker_exit::OK;
        }
        serve_as(cfg, fds, module)
    })
}

/// Forks twice; the grandchild runs `then` and exits with its status. Returns the
/// grandchild's pid once the intermediate child has exited, so the grandchild is
/// re-parented to the master (a child subreaper).
fn double_fork(then: impl FnOnce() -> i32) -> std::io::Result<u32> {
    let mut pipe = [0 as libc::c_int; 2];
    // SAFETY: `pipe` is a valid 2-int array for the kernel to fill.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the template is single-threaded (checked before it announced itself), so the
    // child is a faithful copy with no lock held by a vanished thread.
    let child = unsafe { libc::fork() };
    if child < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing the pipe we just made.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
        return Err(e);
    }
    if child == 0 {
        // Intermediate child: fork the grandchild, report its pid, leave.
        // SAFETY: still single-threaded (a copy of the template).
        let grandchild = unsafe { libc::fork() };
        if grandchild == 0 {
            // SAFETY: closing our copies of the pipe ends.
            unsafe {
                libc::close(pipe[0]);
                libc::close(pipe[1]);
            }
            process::exit_now(then());
        }
        let pid = grandchild.to_ne_bytes();
        // SAFETY: writing 4 bytes from a live buffer to our pipe end, then leaving at once
        // without running any destructor of the template's state.
        unsafe {
            libc::write(pipe[1], pid.as_ptr().cast(), pid.len());
            libc::_exit(0);
        }
    }
    // SAFETY: closing the write end in the template, so the read below ends if the child
    // dies without writing.
    unsafe { libc::close(pipe[1]) };
    let mut buf = [0u8; 4];
    // SAFETY: pipe[0] is our open read end; File takes ownership and closes it.
    let mut r = unsafe { std::fs::File::from_raw_fd(pipe[0]) };
    let got = r.read_exact(&mut buf);
    let mut status = 0;
    // SAFETY: reaping our own intermediate child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    got?;
    let pid = i32::from_ne_bytes(buf);
    if pid <= 0 {
        return Err(std::io::Error::other("the second fork failed"));
    }
    Ok(pid as u32)
}

/// In a forked process: wait to be re-parented to the master, then tie our life to it
/// (`PR_SET_PDEATHSIG`) and leave the template's process group.
fn adopt(master: i32) -> Result<(), ()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    // SAFETY: getppid, prctl and setpgid have no memory-safety preconditions.
    unsafe {
        while libc::getppid() != master {
            if Instant::now() > deadline {
                return Err(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != master {
            return Err(());
        }
        libc::setpgid(0, 0);
    }
    Ok(())
}

/// The spare's life: adopted by the master, it waits for its assignment (or for the
/// template to go away, then exits) and becomes that worker.
fn become_spare(sock: UnixStream, module: &Model, master: i32) -> i32 {
    // SAFETY: the template's control channel (fd 4) is not the spare's to read.
    unsafe { libc::close(CONTROL_FD) };
    if adopt(master).is_err() {
        return worker_exit::OK;
    }
    process::set_process_name("vf-spare");
    let mut pending = Vec::new();
    let (line, fds) = match receive(&sock, &mut pending) {
        Ok(Some((line, fds))) if !fds.is_empty() => (line, fds),
        // The template went away (or sent nothing usable): nothing to become.
        _ => return worker_exit::OK,
    };
    drop(sock);
    match serde_json::from_str::<WorkerConfig>(&line) {
        Ok(cfg) => serve_as(cfg, fds, module),
        Err(e) => {
            vramfork::logging::say(&format!("app-worker (spare): bad assignment: {e}"));
            worker_exit::CONFIG
        }
    }
}

/// In a forked, adopted process: take the first of `fds` as the control channel (fd 4)
/// and the second, when the configuration says so, as the key and TLS material (fd 7),
/// point CUDA at this worker's GPU, and boot with the preloaded model.
fn serve_as(cfg: WorkerConfig, fds: Attached, module: &Model) -> i32 {
    let mut fds = fds.into_iter();
    let Some(control) = fds.next() else {
        return worker_exit::CONFIG;
    };
    let secrets = if cfg.secrets {
        let Some(s) = fds.next() else {
            vramfork::logging::say("app-worker: the key and certificate hand-over is missing");
            return worker_exit::CONFIG;
        };
        Some(s)
    } else {
        None
    };
    // Each descriptor onto its number (control 4, material 7). The received ones may sit
    // on either number, so each is first moved above them, then placed: no dup2 can
    // clobber the other. What fd 4 held before (the template's channel) is never used here.
    let mut high = Vec::new();
    for (fd, at) in [(Some(control), CONTROL_FD), (secrets, SECRETS_FD)] {
        let Some(fd) = fd else { continue };
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a descriptor this process owns (the original
        // closes when `fd` drops).
        let h = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
        if h < 0 {
            return worker_exit::CONFIG;
        }
        high.push((h, at));
    }
    for (h, at) in high {
        // SAFETY: dup2 of our own copy onto its number, then the copy closed.
        unsafe {
            if libc::dup2(h, at) < 0 {
                return worker_exit::CONFIG;
            }
            libc::close(h);
        }
    }
    // Still single-threaded: safe to change the environment; CUDA (lazy) sees its GPU alone.
    for (k, v) in vramfork::protocol::gpu_env(cfg.gpu.as_ref()) {
        std::env::set_var(k, v);
    }
    let metadata = match vramfork::metadata::AppMetadata::parse(
        std::path::Path::new(&cfg.metadata_path),
        &cfg.metadata_json,
    ) {
        Ok(m) => m,
        Err(e) => {
            vramfork::logging::say(&format!("app-worker: {e}"));
            return worker_exit::CONFIG;
        }
    };
    let process_ms = process::ms_since_exec();
    // SAFETY: this process never returns into the template's frames that own `module`
    // (it ends with `exit_now`), so moving the value out here makes this the only owner.
    let module = unsafe { std::ptr::read(module) };
    match crate::boot(cfg, metadata, process_ms, Some(module)) {
        Ok(code) => code,
        Err((code, msg)) => {
            vramfork::logging::say(&format!("app-worker: {msg}"));
            code
        }
    }
}
