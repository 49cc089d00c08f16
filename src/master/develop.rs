//! Development mode (`app` without `--production`): bind the socket, then become the worker
//! by exec — one process serves, no forking and no recycling, the same worker code as in
//! production.

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::master::config::Config;
use crate::master::plan::Plan;
use crate::master::spawn::worker_config;
use crate::protocol::{ENV_LISTEN_FDS, ENV_WORKER_CONFIG, LISTEN_FD, METRICS_FD, SECRETS_FD};

/// Execs the worker binary in place of this process; returns only on failure. With a
/// metrics listener, the worker serves `/metrics` on it (fd 5).
pub fn exec_worker(
    cfg: &Config,
    plan: &Plan,
    listener: TcpListener,
    metrics: Option<TcpListener>,
) -> std::io::Error {
    let mut wc = worker_config(cfg, plan, 0, 0, 0);
    wc.has_control = false;
    // One process is the whole server: nothing to recycle into, nobody to protect.
    wc.host_memory.max_worker_memory_mb = None;
    wc.oom_score_adj = None;
    let secrets_fd = cfg.access.secrets.fd();
    wc.secrets = secrets_fd.is_some();
    if let Some(m) = wc.metrics.as_mut() {
        m.serve = metrics.is_some();
    }
    let metrics_fd = metrics.as_ref().map(|m| m.as_raw_fd());
    let json = serde_json::to_string(&wc).expect("worker config serializes");
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(&cfg.workers.binary);
    cmd.env(ENV_WORKER_CONFIG, json)
        .env(ENV_LISTEN_FDS, "1")
        .env_remove("LISTEN_PID");
    crate::master::spawn::child_env(
        &mut cmd,
        plan.placement.first().and_then(|p| p.gpu.as_ref()),
    );
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec; here there
    // is no fork at all, exec() runs the hook in this process.
    unsafe {
        cmd.pre_exec(move || {
            if fd != LISTEN_FD && libc::dup2(fd, LISTEN_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::fcntl(LISTEN_FD, libc::F_SETFD, 0);
            if let Some(m) = metrics_fd {
                if m != METRICS_FD && libc::dup2(m, METRICS_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::fcntl(METRICS_FD, libc::F_SETFD, 0);
            }
            if let Some(s) = secrets_fd {
                if s != SECRETS_FD && libc::dup2(s, SECRETS_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::fcntl(SECRETS_FD, libc::F_SETFD, 0);
            }
            Ok(())
        });
    }
    // The lines queued so far, before this process becomes the worker.
    crate::logging::flush();
    cmd.exec()
}
