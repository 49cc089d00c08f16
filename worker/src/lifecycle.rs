//! The worker's life once its model is loaded: tell the master it is ready, send heartbeats
//! (with the metrics figures when they changed), turn signals into retirement (TERM) or an
//! immediate exit (INT, QUIT), serve until retired and drained, report the final figures,
//! and pick the exit status.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use vramfork::protocol::{BootTimes, ControlMsg, RetireReason, WorkerMetrics};

use crate::app::App;

/// `/metrics` served by this worker itself (development mode).
pub struct ServeMetrics {
    pub listener: std::net::TcpListener,
    pub config: WorkerMetrics,
    /// `--metrics-api-key-file`.
    pub key_file: Option<std::path::PathBuf>,
    /// Its keys as the master accepted them (`vramfork::secrets`).
    pub keys: Option<vramfork::auth::ApiKeys>,
    /// `--tls-cert`: the metrics port serves HTTPS too.
    pub tls: Option<Arc<vramfork::tls::Reloading>>,
}

pub struct Plan {
    pub listener: std::net::TcpListener,
    pub app: Arc<App>,
    pub boot: BootTimes,
    /// Where the model runs (`cuda:0`, `cpu`, `cpu (simulated GPU)`), told in `Ready`.
    pub device: String,
    pub heartbeat: Duration,
    pub graceful: Duration,
    pub metrics: Option<ServeMetrics>,
}

/// Runs the worker to its end; returns the exit status.
pub fn run(plan: Plan) -> anyhow::Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("vf-http")
        .build()?;
    rt.block_on(async move {
        let app = plan.app.clone();
        let shared = app.shared.clone();
        // SAFETY: the listener owns its descriptor (fd 3, taken over in `listener::inherit`)
        // and keeps it open, the same one, for as long as the AsyncFd holds it.
        let listener = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                plan.listener,
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| e.into_parts().1)?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut quit = signal(SignalKind::quit())?;
        // No master (development mode): the process that started it is watched instead.
        if !shared.control.attached() {
            crate::parent_watch::start();
        }

        // Siblings may hand requests to this worker once it shows free: listen for them first.
        listen_for_siblings(&app);
        // Free on the idle board before the master (and a client waiting for readiness)
        // hears of it: siblings leave connections to this worker from now on.
        shared.show_state();
        let mut memory = crate::memory::at_ready();
        let rise = app.serving_peak.start(memory.map(|m| m.own));
        // A worker that warmed itself up (exec'd): how far its load and warm-up took it.
        if let Some(m) = memory.as_mut().filter(|_| plan.boot.warmup_ms > 0.0) {
            m.pass_peak = rise;
        }
        shared.control.send(&ControlMsg::Ready {
            pid: std::process::id(),
            boot_ms: plan.boot,
            device: plan.device.clone(),
            memory,
        });
        tracing::info!(
            event = "ready",
            process_ms = plan.boot.process_ms,
            model_ms = plan.boot.model_ms,
            "ready"
        );
        tokio::spawn(crate::heartbeat::every(app.clone(), plan.heartbeat));
        crate::watchdog::start(&app, plan.heartbeat);
        if let Some(m) = plan.metrics {
            let b = plan.boot;
            let boot_s = (b.process_ms + b.model_ms + b.warmup_ms) / 1e3;
            let source = Arc::new(crate::report::DevSource::new(app.clone(), m.config, boot_s));
            m.listener.set_nonblocking(true)?;
            let l = tokio::net::TcpListener::from_std(m.listener)?;
            let auth = vramfork::metrics::endpoint::MetricsAuth::new(m.key_file, m.keys);
            tokio::spawn(vramfork::metrics::endpoint::serve_with(
                l,
                source,
                Arc::new(auth),
                m.tls,
            ));
        }

        let server = crate::server::serve(listener, app.clone(), plan.graceful);
        tokio::pin!(server);
        let quick = loop {
            tokio::select! {
                _ = &mut server => break false,
                _ = term.recv() => shared.retire(RetireReason::Asked),
                _ = int.recv() => break true,
                _ = quit.recv() => break true,
            }
        };
        crate::report::at_exit(&app);
        if quick {
            return Ok(vramfork::protocol::worker_exit::OK);
        }
        Ok(shared.get().exit_code)
    })
}

/// Binds this worker's socket for its siblings' hand-offs and serves them (`siblings/`), and
/// starts watching for free siblings to hand its own waiting requests to.
fn listen_for_siblings(app: &Arc<App>) {
    let Some(siblings) = &app.siblings else {
        return;
    };
    let name = siblings.own_address();
    match crate::siblings::link::bind(&name) {
        Ok(listener) => {
            let for_links = app.clone();
            let handle = move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(crate::grpc::HandedIn);
                crate::grpc::handle(req, for_links.clone())
            };
            tokio::spawn(crate::siblings::link::serve(
                listener,
                app.shared.clone(),
                handle,
            ));
        }
        // Siblings find no link and serve what they would have handed here themselves.
        Err(e) => tracing::warn!("cannot listen for siblings' requests on @{name}: {e}"),
    }
    siblings.start();
}
