//! What the supervisor learns of its workers' GPU memory while they serve
//! ([`crate::master::footprint`]), and `--adapt-workers` acting on it
//! ([`crate::master::rules::adapt`]).

use std::time::Instant;

use super::Supervisor;
use crate::master::footprint::Sample;
use crate::master::rules::{self, AdaptView};
use crate::master::slot::Phase;

impl Supervisor {
    /// Samples the workers' GPU memory (once a second); when the plan's assumption is
    /// passed, says so once and, with `--adapt-workers`, lowers the worker count one
    /// worker at a time to what fits.
    pub(super) fn learn(&mut self) {
        let now = Instant::now();
        let (Some(l), Some(nvml)) = (self.learner.as_mut(), self.gpus.as_ref()) else {
            return;
        };
        if !l.due(now) {
            return;
        }
        let samples: Vec<Sample> = self
            .workers
            .iter()
            .filter_map(|w| {
                Some(Sample {
                    pid: w.state.pid,
                    slot: w.state.slot,
                    gpu: w.state.gpu?,
                    ready: w.state.phase == Phase::Ready,
                    allocator: w.state.allocator,
                    footprint: w.state.footprint,
                })
            })
            .collect();
        if let Some(hw) = l.sample(now, &samples, nvml) {
            if let Some(m) = &self.metrics {
                m.observed_footprint(hw);
            }
            tracing::debug!(
                event = "footprint_observed",
                observed_mb = hw,
                planned_mb = l.assumed_mb,
                "a worker reached {hw} MB of GPU memory (the plan assumes {} MB)",
                l.assumed_mb
            );
            if l.check() {
                let cap = l.capacity(&self.plan).unwrap_or(0);
                tracing::warn!(
                    event = "footprint_exceeded",
                    observed_mb = hw,
                    planned_mb = l.assumed_mb,
                    capacity = cap,
                    workers = self.target,
                    adapt = self.cfg.footprint.adapt_workers,
                    slots = ?l.slot_marks(),
                    "a worker reached {hw} MB of GPU memory, more than the {} MB the plan assumed per worker: at that footprint the GPUs hold {cap} workers, {} run; {}",
                    l.assumed_mb,
                    self.target,
                    if self.cfg.footprint.adapt_workers {
                        "retiring workers one at a time down to that (--adapt-workers)"
                    } else {
                        "no more are added (TTIN refused); --adapt-workers would retire the surplus"
                    }
                );
            }
        }
        let adapted = rules::adapt(AdaptView {
            enabled: self.cfg.footprint.adapt_workers,
            exceeded: l.exceeded(),
            busy: self.stopping.is_some() || self.reload.under_way,
            settling: rules::settling(self.workers.iter().map(|w| &w.state)),
            capacity: l.capacity(&self.plan),
            target: self.target,
        });
        if let Some((target, cap)) = adapted {
            self.target = target;
            tracing::warn!(
                event = "workers_adapted",
                workers = self.target,
                capacity = cap,
                observed_mb = l.high_water_mb().unwrap_or(0),
                planned_mb = l.assumed_mb,
                "retiring one worker: {} MB observed per worker leaves room for {cap}; {} workers now",
                l.high_water_mb().unwrap_or(0),
                self.target
            );
        }
    }
}
