//! What the master learns of its workers' GPU memory while they serve. Once a second it
//! reads NVML's figure for each ready worker on a GPU and combines it with the allocator
//! figures the worker's last heartbeat carried (`profile::footprint`: allocator peak
//! reserved + what the process holds besides the allocator). It keeps each slot's and the
//! overall high-water mark.
//!
//! When the overall mark passes what the plan assumed per worker, the plan no longer
//! holds: the supervisor logs it once, adds no more workers (TTIN is refused) and, with
//! `--adapt-workers`, lowers its worker count one at a time (never below one) to what the
//! GPUs hold at the observed footprint — each lowering is a graceful retirement, as TTOU.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::footprint_file::FootprintFile;
use super::profile::footprint;
use crate::master::plan::{workers_fitting, Plan};
use crate::master::resources::NvmlProbe;

/// How often NVML is read.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often a growing high-water mark is written to `--footprint-file` at most.
const SAVE_EVERY: Duration = Duration::from_secs(10);
const MB: u64 = 1 << 20;

/// One ready worker on a GPU, as the supervisor knows it.
pub struct Sample {
    pub pid: u32,
    pub slot: u32,
    pub gpu: u32,
    /// Its last heartbeat's allocator peak and current reserved bytes.
    pub allocator: Option<(u64, u64)>,
    /// The footprint its last heartbeat computed from its own fresh figures.
    pub footprint: Option<u64>,
}

pub struct Learner {
    /// MB per worker the plan assumed.
    pub assumed_mb: u64,
    high_water_mb: Option<u64>,
    per_slot: HashMap<u32, u64>,
    exceeded: bool,
    last_sample: Option<Instant>,
    file: Option<FootprintFile>,
    saved_mb: Option<u64>,
    saved_at: Option<Instant>,
    file_warned: bool,
    context_warned: bool,
}

impl Learner {
    pub fn new(assumed_mb: u64, file: Option<FootprintFile>) -> Learner {
        Learner {
            assumed_mb,
            high_water_mb: None,
            per_slot: HashMap::new(),
            exceeded: false,
            last_sample: None,
            file,
            saved_mb: None,
            saved_at: None,
            file_warned: false,
            context_warned: false,
        }
    }

    pub fn high_water_mb(&self) -> Option<u64> {
        self.high_water_mb
    }

    /// Whether the observed footprint has passed what the plan assumed.
    pub fn exceeded(&self) -> bool {
        self.exceeded
    }

    /// Whether it is time to read NVML again.
    pub fn due(&self, now: Instant) -> bool {
        self.last_sample
            .is_none_or(|t| now.duration_since(t) >= SAMPLE_EVERY)
    }

    /// Reads NVML for these workers; returns the new overall high-water mark (MB) when it
    /// grew.
    pub fn sample(&mut self, now: Instant, workers: &[Sample], nvml: &NvmlProbe) -> Option<u64> {
        self.last_sample = Some(now);
        let mut grew = None;
        for w in workers {
            // The worker's own figure (NVML and allocator read together), else one made
            // here from NVML now and its last heartbeat's allocator figures.
            let bytes = match w.footprint {
                Some(b) => Some(b),
                None => {
                    let used = nvml.process_used_bytes(w.gpu, w.pid).ok().flatten();
                    if used.is_none() && w.allocator.is_some() && !self.context_warned {
                        self.context_warned = true;
                        tracing::warn!(
                            event = "footprint_without_context",
                            slot = w.slot,
                            pid = w.pid,
                            "NVML lists no memory for worker pid {} (a container without the host's PID namespace?): its footprint is the allocator's peak alone, without the CUDA context",
                            w.pid
                        );
                    }
                    let (peak, reserved) = w.allocator.unzip();
                    footprint(used, peak, reserved)
                }
            };
            let Some(bytes) = bytes else {
                continue;
            };
            let mb = bytes.div_ceil(MB);
            let slot = self.per_slot.entry(w.slot).or_default();
            *slot = (*slot).max(mb);
            if self.high_water_mb.is_none_or(|h| mb > h) {
                self.high_water_mb = Some(mb);
                grew = Some(mb);
            }
        }
        if grew.is_some() {
            self.save(now, false);
        }
        grew
    }

    /// Records a high-water mark as if a serving worker had shown it (tests without NVML).
    #[cfg(test)]
    pub fn observed(&mut self, mb: u64) {
        self.high_water_mb = self.high_water_mb.max(Some(mb));
        self.check();
    }

    /// Marks the assumption broken when the high-water mark passed it; `true` the first time.
    pub fn check(&mut self) -> bool {
        let over = self.high_water_mb.is_some_and(|h| h > self.assumed_mb);
        let first = over && !self.exceeded;
        self.exceeded |= over;
        first
    }

    /// Workers the plan's GPUs hold at the observed footprint: Σ floor(usable / high-water)
    /// over the GPUs the plan uses.
    pub fn capacity(&self, plan: &Plan) -> Option<u32> {
        let hw = self.high_water_mb?.max(1);
        Some(
            plan.gpus
                .iter()
                .filter(|g| g.excluded.is_none())
                .map(|g| g.compute_mode.limit(workers_fitting(g.usable_mb, hw)))
                .sum(),
        )
    }

    /// Writes the high-water mark to `--footprint-file` (at most every 10 s unless `force`).
    pub fn save(&mut self, now: Instant, force: bool) {
        let (Some(file), Some(hw)) = (&self.file, self.high_water_mb) else {
            return;
        };
        if self.saved_mb.is_some_and(|s| s >= hw) {
            return;
        }
        if !force
            && self
                .saved_at
                .is_some_and(|t| now.duration_since(t) < SAVE_EVERY)
        {
            return;
        }
        match file.record(hw) {
            Ok(()) => {
                self.saved_mb = Some(hw);
                self.saved_at = Some(now);
            }
            Err(e) if !self.file_warned => {
                self.file_warned = true;
                tracing::warn!(event = "footprint_file_error", "--footprint-file: {e}");
            }
            Err(_) => {}
        }
    }

    /// A reload changed the model: what is observed from now on is not the recorded
    /// model's, so nothing more is written to `--footprint-file` (until a restart hashes
    /// the new model).
    pub fn model_changed(&mut self) {
        if self.file.take().is_some() {
            tracing::info!(
                event = "footprint_file_detached",
                "the reload changed the model: --footprint-file is not updated until the next start"
            );
        }
    }

    /// The slot marks, for the log.
    pub fn slot_marks(&self) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = self.per_slot.iter().map(|(s, m)| (*s, *m)).collect();
        v.sort_unstable();
        v
    }
}
