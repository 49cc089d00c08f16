//! What the master learns of its workers' GPU memory while they serve. Once a second it
//! reads NVML's figure for each ready worker on a GPU and combines it with the allocator
//! figures the worker's last heartbeat carried (`profile::footprint`: allocator peak
//! reserved + what the process holds besides the allocator). It keeps each slot's and the
//! overall high-water mark.
//!
//! Where NVML lists no figure for a worker's pid (in a container without the host's PID
//! namespace NVML lists host pids), the part besides the allocator is taken from the
//! device, as profiling does: how far its free memory fell since the plan read it, less
//! what our workers' allocators reserve there, shared among our workers there (only when
//! every one of them is ready, so that none is half-loaded), each worker's footprint being
//! its allocator peak plus that share; without allocator figures, the fall shared among
//! them. That fall counts anything else started on the device meanwhile (said once, as
//! `footprint_without_context`). When the device tells nothing (its free memory did not
//! fall), the allocator peak plus the plan's context figure (`Plan::cuda_context_mb`).
//!
//! When the overall mark passes what the plan assumed per worker, the plan no longer
//! holds: the supervisor logs it once, adds no more workers (TTIN is refused) and, with
//! `--adapt-workers`, lowers its worker count one at a time (never below one) to what the
//! GPUs hold at the observed footprint — each lowering is a graceful retirement, as TTOU.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::host::footprint_file::FootprintFile;
use super::profile::footprint;
use crate::master::plan::Plan;
use crate::master::resources::GpuProbe;

/// How often NVML is read.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often a growing high-water mark is written to `--footprint-file` at most.
const SAVE_EVERY: Duration = Duration::from_secs(10);
const MB: u64 = 1 << 20;

/// One live worker on a GPU, as the supervisor knows it.
pub struct Sample {
    pub pid: u32,
    pub slot: u32,
    pub gpu: u32,
    /// Ready (serving): only ready workers are sampled; the others only hold their
    /// device's figures back.
    pub ready: bool,
    /// Its last heartbeat's allocator peak and current reserved bytes.
    pub allocator: Option<(u64, u64)>,
    /// The footprint its last heartbeat computed from its own fresh figures.
    pub footprint: Option<u64>,
}

pub struct Learner {
    /// MB per worker the plan assumed.
    pub assumed_mb: u64,
    /// MB the plan assumes a worker holds besides its allocator (`Plan::cuda_context_mb`).
    context_mb: u64,
    /// Each device's free MB when the plan was made, and the devices sharing its memory
    /// (the compute instances of one MIG GPU instance), by device index.
    devices: HashMap<u32, (u64, Vec<u32>)>,
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
    pub fn new(plan: &Plan, file: Option<FootprintFile>) -> Learner {
        let pool = |g: &crate::master::plan::GpuPlan| match (g.mig, g.gpu_instance) {
            (Some(m), Some(gi)) => (m.parent, Some(gi)),
            _ => (g.index, None),
        };
        let devices = plan
            .gpus
            .iter()
            .map(|g| {
                let shared = plan
                    .gpus
                    .iter()
                    .filter(|o| pool(o) == pool(g))
                    .map(|o| o.index)
                    .collect();
                (g.index, (g.free_mb, shared))
            })
            .collect();
        Learner {
            assumed_mb: plan.planned_typ_mb,
            context_mb: plan.cuda_context_mb,
            devices,
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
    pub fn sample(&mut self, now: Instant, workers: &[Sample], nvml: &dyn GpuProbe) -> Option<u64> {
        self.last_sample = Some(now);
        let mut grew = None;
        for w in workers.iter().filter(|w| w.ready) {
            // The worker's own figure (NVML and allocator read together), else one made
            // here from NVML now and its last heartbeat's allocator figures, else from its
            // device (module docs).
            let bytes = match w.footprint {
                Some(b) => Some(b),
                None => match nvml.process_used_bytes(w.gpu, w.pid).ok().flatten() {
                    Some(used) => {
                        let (peak, reserved) = w.allocator.unzip();
                        footprint(Some(used), peak, reserved)
                    }
                    None => self.unseen(w, workers, nvml),
                },
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

    /// The footprint of a worker NVML lists no figure for (module docs), bytes.
    fn unseen(&mut self, w: &Sample, workers: &[Sample], nvml: &dyn GpuProbe) -> Option<u64> {
        let (before_mb, shared) = self.devices.get(&w.gpu)?.clone();
        let ours: Vec<&Sample> = workers.iter().filter(|o| shared.contains(&o.gpu)).collect();
        let settled = ours.iter().all(|o| o.ready);
        let fall = nvml
            .free_bytes(w.gpu)
            .ok()
            .map(|free| (before_mb * MB).saturating_sub(free))
            .filter(|fall| settled && *fall > 0);
        let n = ours.len().max(1) as u64;
        let reserved: u64 = ours.iter().filter_map(|o| o.allocator.map(|a| a.1)).sum();
        let (how, bytes) = match (w.allocator, fall) {
            (Some((peak, _)), Some(fall)) if fall > reserved => {
                ("its allocator's peak plus its share of what the GPU's free memory fell by beyond our workers' allocators", peak + (fall - reserved) / n)
            }
            (Some((peak, _)), _) => ("its allocator's peak plus the plan's context figure", peak + self.context_mb * MB),
            (None, Some(fall)) => ("its share of what the GPU's free memory fell by since the plan", fall / n),
            (None, None) => return None,
        };
        if !self.context_warned {
            self.context_warned = true;
            tracing::warn!(
                event = "footprint_without_context",
                slot = w.slot,
                pid = w.pid,
                gpu = w.gpu,
                mb = bytes.div_ceil(MB),
                "NVML lists no memory for worker pid {} (in a container without the host's PID namespace it lists host pids): its footprint, context included, is taken as {how} ({} MB), which also counts anything else started on that GPU meanwhile",
                w.pid,
                bytes.div_ceil(MB)
            );
        }
        Some(bytes)
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
    /// over the memory pools of the GPUs the plan uses (`plan::capacity`: the compute
    /// instances of a MIG GPU instance share one).
    pub fn capacity(&self, plan: &Plan) -> Option<u32> {
        let hw = self.high_water_mb?.max(1);
        Some(crate::master::plan::capacity(&plan.gpus, hw))
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
        match file.record(hw, None) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::plan::{plan, Demand, Policy};
    use crate::master::resources::{FixedProbe, GpuInfo, Resources};

    const GB: u64 = 1 << 30;

    /// One 40 GB GPU, all free when the plan was made, and a learner planning 4000 MB.
    fn setup() -> (FixedProbe, Learner) {
        let probe = FixedProbe::new(vec![GpuInfo {
            uuid: "GPU-0".into(),
            name: "test".into(),
            total_bytes: 40 * GB,
            free_bytes: 40 * GB,
            ..GpuInfo::default()
        }]);
        let meta = crate::metadata::AppMetadata::parse(
            std::path::Path::new("/apps/t/app-metadata.json"),
            r#"{"name": "t", "est_gpu_mem_min": 1000, "est_gpu_mem_typ": 4000}"#,
        )
        .unwrap();
        let p = plan(
            &Resources::from_probe(8, &probe),
            &Demand::declared(&meta),
            &Policy::default(),
        )
        .unwrap();
        let l = Learner::new(&p, None);
        (probe, l)
    }

    fn worker(pid: u32, ready: bool, peak_mb: u64, reserved_mb: u64) -> Sample {
        Sample {
            pid,
            slot: pid,
            gpu: 0,
            ready,
            allocator: Some((peak_mb * MB, reserved_mb * MB)),
            footprint: None,
        }
    }

    /// On CUDA: NVML lists no figure for the workers (container PID
    /// namespace), so each one's footprint is its allocator peak plus its share of what the
    /// GPU's free memory fell by beyond the allocators' reserved bytes — the context — not
    /// the peak alone (which is what the worker's heartbeat used to send).
    #[test]
    fn without_nvml_figures_the_context_comes_from_the_device() {
        let (probe, mut l) = setup();
        // Three workers: 1000 MB reserved each (peak 1200 for one), 700 MB of context each.
        probe.set_free_bytes(0, 40 * GB - 3 * 1700 * MB);
        let ws = [
            worker(1, true, 1200, 1000),
            worker(2, true, 1000, 1000),
            worker(3, true, 1000, 1000),
        ];
        let now = Instant::now();
        assert_eq!(l.sample(now, &ws, &probe), Some(1900));
        assert_eq!(l.slot_marks(), vec![(1, 1900), (2, 1700), (3, 1700)]);
        // While one of them boots, the device's figures are not trusted: the plan's
        // context figure (500 MB) stands in.
        let (probe, mut l) = setup();
        probe.set_free_bytes(0, 40 * GB - 3 * 1700 * MB);
        let ws = [worker(1, true, 1200, 1000), worker(2, false, 0, 0)];
        assert_eq!(l.sample(now, &ws, &probe), Some(1700));
        // NVML's own figure, where it lists the worker, wins.
        let (probe, mut l) = setup();
        probe.set_process(0, 1, 2500 * MB);
        let ws = [worker(1, true, 1200, 1000)];
        assert_eq!(l.sample(now, &ws, &probe), Some(2700));
    }
}
