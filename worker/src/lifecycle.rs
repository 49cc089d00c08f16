//! The worker's life once its model is loaded: tell the master it is ready, send heartbeats,
//! turn signals into retirement (TERM) or an immediate exit (INT, QUIT), serve until
//! retired and drained, and pick the exit status.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use vramfork::protocol::{BootTimes, ControlMsg, RetireReason};

use crate::routes::App;
use crate::state::Shared;

pub struct Plan {
    pub listener: std::net::TcpListener,
    pub app: Arc<App>,
    pub boot: BootTimes,
    pub heartbeat: Duration,
    pub graceful: Duration,
}

/// Runs the worker to its end; returns the exit status.
pub fn run(plan: Plan) -> anyhow::Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("vf-http")
        .build()?;
    rt.block_on(async move {
        let shared = plan.app.shared.clone();
        let listener = tokio::net::TcpListener::from_std(plan.listener)?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut quit = signal(SignalKind::quit())?;

        shared.control.send(&ControlMsg::Ready {
            pid: std::process::id(),
            boot_ms: plan.boot,
        });
        tracing::info!(
            event = "ready",
            process_ms = plan.boot.process_ms,
            model_ms = plan.boot.model_ms,
            "ready"
        );
        tokio::spawn(heartbeats(shared.clone(), plan.heartbeat));

        let server = crate::server::serve(listener, plan.app.clone(), plan.graceful);
        tokio::pin!(server);
        loop {
            tokio::select! {
                _ = &mut server => break,
                _ = term.recv() => shared.retire(RetireReason::Asked),
                _ = int.recv() => return Ok(vramfork::protocol::worker_exit::OK),
                _ = quit.recv() => return Ok(vramfork::protocol::worker_exit::OK),
            }
        }
        Ok(shared.get().exit_code)
    })
}

async fn heartbeats(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let c = shared.get();
        shared.control.send(&ControlMsg::Heartbeat {
            served: c.served,
            in_flight: c.in_flight,
        });
    }
}
