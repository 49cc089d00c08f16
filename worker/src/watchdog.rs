//! The watchdog of passes run on the event loop (`runner/inline.rs`): while such a pass
//! blocks the event loop, it sends the heartbeats the event loop cannot (so the master does
//! not take a long pass for a hung worker, as it does not for a long pass on the model
//! thread), and once the pass has run past `--request-timeout` it retires the worker as a
//! stuck pass on the model thread does (reason `request-timeout`) and ends it, since its
//! event loop will not come back to drain: the stuck request's connection closes without the
//! 504 the model thread's path would have answered. A thread of its own (`vf-watch`), started
//! only where passes may run on the event loop, waking every [`TICK`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::app::App;

/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(100);

/// Starts the watchdog when this worker may run passes on its event loop.
pub fn start(app: &Arc<App>, heartbeat: Duration) {
    let Some(inline) = app.runner.inline() else {
        return;
    };
    let app = app.clone();
    let spawned = std::thread::Builder::new()
        .name("vf-watch".into())
        .spawn(move || {
            let mut last_beat = Instant::now();
            loop {
                std::thread::sleep(TICK);
                let Some(running) = inline.running_for() else {
                    continue;
                };
                if running >= app.request_timeout {
                    stuck(&app, running);
                }
                // Half a heartbeat apart, from half a heartbeat into the pass: the master
                // then never sees a gap much longer than one heartbeat.
                if running >= heartbeat / 2 && last_beat.elapsed() >= heartbeat / 2 {
                    crate::heartbeat::send(&app);
                    last_beat = Instant::now();
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the watchdog thread ({e}); passes stay on the model thread");
    }
}

/// A pass on the event loop has run past `--request-timeout`: retire and end the worker.
fn stuck(app: &App, running: Duration) -> ! {
    tracing::error!(
        event = "inline_pass_stuck",
        seconds = running.as_secs_f64(),
        "a forward pass run on the event loop has run {:.1} s, past --request-timeout \
         ({:.1} s): this worker retires and exits; its client's connection closes unanswered",
        running.as_secs_f64(),
        app.request_timeout.as_secs_f64()
    );
    app.shared.model_stuck();
    crate::report::at_exit(app);
    let code = app.shared.get().exit_code;
    // SAFETY: `_exit` ends the process at once, without running atexit handlers or static
    // destructors, which could wait on the pass still running on the event loop's thread.
    unsafe { libc::_exit(code) }
}
