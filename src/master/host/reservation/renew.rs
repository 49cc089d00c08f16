//! The provisional reservation's renewal while the main thread profiles (which can take
//! longer than a lease): a thread rewrites this server's entry every renewal period until
//! the final plan's is written. It takes no lock (a server's own file is its own).

use std::collections::BTreeMap;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;

use crate::master::host::ledger::{Ledger, RENEW_EVERY};

/// The renewing thread; [`Renewer::stop`] ends it.
pub struct Renewer {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Renewer {
    /// Renews `gpus` in `ledger` every [`RENEW_EVERY`] (without a thread, none: said).
    pub fn start(ledger: Ledger, gpus: BTreeMap<String, u64>) -> Renewer {
        let (stop, stopped) = mpsc::channel::<()>();
        let run = move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(RENEW_EVERY) {
                if let Err(e) = ledger.reserve(&gpus) {
                    tracing::warn!(
                        target: "app",
                        event = "ledger_write_failed",
                        "cannot renew this server's provisional reservation in the GPU-memory ledger ({}): {e}",
                        ledger.dir().display()
                    );
                }
            }
        };
        let thread = std::thread::Builder::new()
            .name("vf-ledger-renew".into())
            .spawn(run)
            .map_err(|e| {
                tracing::warn!(
                    target: "app",
                    "cannot start the thread renewing the provisional reservation ({e}): it may lapse while the model is measured"
                )
            })
            .ok();
        Renewer { stop, thread }
    }

    /// Ends the renewal (at once: the thread waits on this).
    pub fn stop(self) {
        drop(self.stop);
        if let Some(t) = self.thread {
            let _ = t.join();
        }
    }
}
