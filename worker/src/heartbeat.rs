//! The worker's heartbeats to the master on the control channel: one every interval from the
//! event loop (the master kills a worker silent for `--timeout`), with the figures the master keeps of the worker (served,
//! in flight, queued, GPU allocator and footprint, own host memory), and the metrics
//! report when it changed; and the same message sent by the watchdog while a pass blocks
//! the event loop (`crate::watchdog`).

use std::sync::Arc;
use std::time::Duration;

use vramfork::protocol::ControlMsg;

use crate::app::App;

/// Sends a heartbeat every `interval` (the first one interval after ready), and the
/// metrics report after each when it changed.
pub async fn every(app: Arc<App>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut reported = None;
    loop {
        tick.tick().await;
        send(&app);
        crate::report::report(&app, &mut reported);
    }
}

/// Sends one heartbeat with the figures it carries: from the event loop's timer, and from
/// the watchdog while a pass blocks the event loop (`crate::watchdog`).
pub fn send(app: &App) {
    let c = app.shared.get();
    let gpu = app.hw.allocator();
    let (peak, reserved) = (gpu.map(|s| s.peak_reserved), gpu.map(|s| s.reserved));
    // NVML is read only on a GPU (and then once a second). Only with NVML's figure for
    // this process: without it (a container without the host's PID namespace) the
    // allocator's figures alone would leave the context out, and the master makes the
    // footprint from its device instead (`master::footprint`).
    let used = gpu.and_then(|_| app.hw.process_gpu_used());
    let footprint =
        used.and_then(|used| vramfork::protocol::gpu_footprint(Some(used), peak, reserved));
    if let (Some(used), Some(reserved)) = (used, reserved) {
        app.gpu_context.store(
            used.saturating_sub(reserved),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    app.shared.control.send(&ControlMsg::Heartbeat {
        served: c.served,
        in_flight: c.in_flight,
        queued: app.runner.queued(),
        queued_lanes: app.runner.queued_lanes(),
        allocator_peak: peak,
        allocator_reserved: reserved,
        footprint,
        own_memory: app.own_memory.read(),
        passes_peak: app.serving_peak.read(),
    });
}
