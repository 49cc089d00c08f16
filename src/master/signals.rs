//! Signals to the master, mapped to intents. The handlers only record (an atomic flag per
//! signal and a byte in a self-pipe that wakes the supervisor's poll); the supervisor loop
//! acts.
//!
//! | signal     | intent                                                                 |
//! |------------|------------------------------------------------------------------------|
//! | TERM       | graceful stop: workers stop accepting, in-flight requests finish within `--graceful-timeout`, exit 0 |
//! | INT, QUIT  | quick stop: workers exit at once, exit 0                                |
//! | HUP        | reload: re-read metadata and model, replace workers one at a time      |
//! | TTIN       | one worker more (refused when it would not fit on the GPUs)             |
//! | TTOU       | one worker fewer (never below one)                                      |
//! | CHLD       | reap exited workers and replace them                                    |
//! | USR1, USR2 | nothing but a warning: logs go to stderr (nothing to reopen) and there is no binary upgrade; gunicorn's meanings, which operators' log rotation sends, must not stop the server (their default action would) |

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{
    SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2,
};

/// What the master was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    GracefulStop,
    QuickStop,
    Reload,
    MoreWorkers,
    FewerWorkers,
    Reap,
    /// USR1 or USR2: acknowledged with a warning, nothing else.
    Ignored,
}

const TABLE: &[(i32, Intent)] = &[
    (SIGTERM, Intent::GracefulStop),
    (SIGINT, Intent::QuickStop),
    (SIGQUIT, Intent::QuickStop),
    (SIGHUP, Intent::Reload),
    (SIGTTIN, Intent::MoreWorkers),
    (SIGTTOU, Intent::FewerWorkers),
    (SIGCHLD, Intent::Reap),
    (SIGUSR1, Intent::Ignored),
    (SIGUSR2, Intent::Ignored),
];

/// Recorded signals, and the read end of the pipe that wakes the loop.
pub struct Signals {
    counts: Vec<(Arc<AtomicUsize>, Intent)>,
    wake: UnixStream,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        let mut counts = Vec::new();
        for &(sig, intent) in TABLE {
            let count = Arc::new(AtomicUsize::new(0));
            let c = Arc::clone(&count);
            // SAFETY: the handler only increments an atomic counter, which is
            // async-signal-safe; it allocates nothing and takes no lock.
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    c.fetch_add(1, Ordering::SeqCst);
                })?;
            }
            signal_hook::low_level::pipe::register(sig, write.try_clone()?)?;
            counts.push((count, intent));
        }
        Ok(Signals { counts, wake: read })
    }

    /// Signals that were never installed: nothing is ever recorded. For tests that hand the
    /// supervisor its intents as values (`Supervisor::on_intent`).
    #[cfg(test)]
    pub fn detached() -> std::io::Result<Signals> {
        let (read, _write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        Ok(Signals {
            counts: Vec::new(),
            wake: read,
        })
    }

    /// The descriptor to poll: readable when a signal arrived.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// The intents recorded since the last call, in table order; TTIN and TTOU once per
    /// signal received, the others once.
    pub fn take(&mut self) -> Vec<Intent> {
        let mut buf = [0u8; 64];
        while matches!((&self.wake).read(&mut buf), Ok(n) if n > 0) {}
        let mut out = Vec::new();
        for (count, intent) in &self.counts {
            let n = count.swap(0, Ordering::SeqCst);
            let repeat = matches!(intent, Intent::MoreWorkers | Intent::FewerWorkers);
            for _ in 0..if repeat { n } else { n.min(1) } {
                if repeat || !out.contains(intent) {
                    out.push(*intent);
                }
            }
        }
        out
    }
}
