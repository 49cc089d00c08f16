//! What leaves the worker about its traffic: the figures sent to the master with the
//! heartbeat when they changed, and, in development mode, the `/metrics` source this one
//! worker serves itself (it is the whole server).

use std::sync::Arc;

use vramfork::metrics::endpoint::Source;
use vramfork::metrics::exposition::{PlanGauges, Snapshot, Waiting, WorkerRow};
use vramfork::metrics::histogram::Hist;
use vramfork::metrics::traffic::Traffic;
use vramfork::protocol::{ControlMsg, WorkerMetrics};

use crate::app::App;

/// Sends the figures to the master when they changed since `last`.
/// The last access-log lines and figures, as a worker ends (drained, or ended by the
/// watchdog): what a recycled worker answered is not lost.
pub fn at_exit(app: &App) {
    if let Some(log) = &app.access_log {
        log.flush_at_exit();
    }
    // Written (for a bounded time), or counted as dropped in the last report.
    vramfork::logging::flush();
    report(app, &mut None);
}

pub fn report(app: &App, last: &mut Option<Traffic>) {
    if app.metrics.is_none() {
        return;
    }
    let traffic = app.traffic();
    if last.as_ref() == Some(&traffic) {
        return;
    }
    *last = Some(traffic.clone());
    app.shared.control.send(&ControlMsg::Metrics {
        traffic,
        allocator_peak: app.hw.allocator_peak(),
    });
}

/// What a development-mode worker's `/metrics` listener answers from: this one worker is
/// the whole server.
pub struct DevSource {
    pub app: Arc<App>,
    pub cfg: WorkerMetrics,
    /// Boot durations (one: this worker's).
    pub boot: Hist,
}

impl DevSource {
    pub fn new(app: Arc<App>, cfg: WorkerMetrics, boot_secs: f64) -> DevSource {
        let mut boot = Hist::default();
        boot.observe(boot_secs);
        DevSource { app, cfg, boot }
    }
}

impl Source for DevSource {
    fn snapshot(&self) -> Snapshot {
        let app = &self.app;
        let c = app.shared.get();
        Snapshot {
            traffic: app.traffic(),
            in_flight: u64::from(c.in_flight),
            waiting: Waiting {
                lanes: app.runner.queued_lanes().map(u64::from),
                ..Waiting::of(app.shared.listen_backlog(), u64::from(app.runner.queued()))
            },
            workers: if c.stopping() { [0, 0, 1] } else { [0, 1, 0] },
            planned: 1,
            starts: [("exec".to_string(), 1)].into(),
            boot: [("exec".to_string(), self.boot.clone())].into(),
            exits: Default::default(),
            gpus: app.hw.gpu_row().into_iter().collect(),
            per_worker: vec![WorkerRow {
                slot: 0,
                gpu_used: app.hw.process_gpu_used(),
                allocator_peak: app.hw.allocator_peak(),
                rss: vramfork::own_memory::resident(None),
                own: vramfork::own_memory::own(None),
                served: c.served,
            }],
            plan: PlanGauges {
                cpu_bound: self.cfg.cpu_bound,
                gpu_bound: self.cfg.gpu_bound,
                host_bound: None,
                workers: self.cfg.planned,
                footprint_declared_mb: app.metadata.est_gpu_mem_typ,
                footprint_measured_mb: None,
                footprint_planned_mb: self.cfg.planned_typ_mb,
                footprint_observed_mb: app.hw.process_gpu_used().map(|b| b.div_ceil(1 << 20)),
                pass_peak_warmup: None,
                pass_peak_observed: app.serving_peak.read().map(|p| p.rise),
            },
            idle: Default::default(),
            // Development mode reserves nothing in a ledger.
            ledger: Vec::new(),
        }
    }

    fn live(&self) -> Result<String, String> {
        // Answered by the worker's own event loop: that it answers is the proof.
        Ok("the worker's event loop answers".into())
    }

    fn ready(&self) -> Result<String, String> {
        if self.app.shared.get().stopping() {
            Err("stopping".into())
        } else {
            Ok("1 of 1 workers ready".into())
        }
    }
}
