//! A server without a master — development mode (`app` without `--production` becomes this
//! worker by exec), or a hand-started worker — stops when the process that started it is
//! gone, as on SIGTERM (drain, then exit): a wrapper that is stopped (a script, `cargo
//! run`, a test harness) would otherwise leave it serving, re-parented to init, with
//! nothing left to stop it. Production workers need none of this: the master adopts them
//! with `PR_SET_PDEATHSIG` (`template/fork.rs`). Not watched: a server started by init or
//! a subreaper that stays, and one started under `nohup` (SIGHUP ignored), which asks to
//! outlive its shell.

use std::time::Duration;

/// How often the parent is looked at.
const EVERY: Duration = Duration::from_millis(500);

/// Starts the watch on a thread of its own, when it applies (see the module doc).
pub fn start() {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    if parent <= 1 || sighup_ignored() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("vf-parent".into())
        .spawn(move || loop {
            std::thread::sleep(EVERY);
            // SAFETY: getppid has no preconditions.
            if unsafe { libc::getppid() } != parent {
                tracing::warn!(
                    parent,
                    "the process that started this server (pid {parent}) is gone: stopping, as on SIGTERM"
                );
                // SAFETY: kill with this process's own pid and a signal it handles
                // (`lifecycle.rs`: drain, then exit).
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
                return;
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch the process that started this server: {e}");
    }
}

/// Whether SIGHUP is ignored (`nohup`): this process was asked to outlive its terminal.
fn sighup_ignored() -> bool {
    // SAFETY: sigaction with a null new action only reads the current disposition into
    // `old`, a zeroed sigaction this function owns.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}
