//! The plan for people (`app plan`) and as JSON (`app plan --json`).

use std::fmt::Write as _;

use super::fit::UTILIZATION_BY_GPU_SIZE;
use super::{Placement, PlacementMode, Plan};
use crate::master::resources::ComputeMode;
use crate::protocol::{cuda_version_text, GpuAssignment, CUDA_BUILD_MIN_DRIVER};

impl Plan {
    /// The plan as pretty JSON (`app plan --json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan always serializes")
    }

    /// The plan for people (`app plan`): inputs, each GPU, bounds and why, the result,
    /// where each worker goes, and warnings marked loudly.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_inputs(&mut s);
        let _ = self.write_gpus(&mut s);
        let _ = self.write_host(&mut s);
        let _ = self.write_result(&mut s);
        s
    }

    /// What was planned from: CPUs, device, the estimates, reserve, utilisation, override,
    /// driver.
    fn write_inputs(&self, s: &mut String) -> std::fmt::Result {
        writeln!(s, "inputs")?;
        writeln!(s, "  cpus                  {}", self.cpus)?;
        writeln!(
            s,
            "  device                {}",
            self.requested_device.name()
        )?;
        writeln!(s, "  est_gpu_mem_min       {} MB", self.est_gpu_mem_min)?;
        match self.measured_mb {
            None => writeln!(s, "  est_gpu_mem_typ       {} MB", self.planned_typ_mb)?,
            Some(m) => writeln!(
                s,
                "  per worker            {} MB, from a measured footprint of {m} MB (est_gpu_mem_typ declared {} MB)",
                self.planned_typ_mb, self.declared_typ_mb
            )?,
        }
        writeln!(s, "  gpu reserve           {} MB per GPU", self.reserve_mb)?;
        match self.utilization_override {
            Some(f) => writeln!(s, "  gpu utilisation       {f} (--gpu-memory-utilization)")?,
            None => {
                let table: Vec<String> = UTILIZATION_BY_GPU_SIZE
                    .iter()
                    .map(|(mb, f)| format!("≥ {} GiB: {f}", mb / 1024))
                    .collect();
                writeln!(
                    s,
                    "  gpu utilisation       by GPU size ({})",
                    table.join(", ")
                )?
            }
        }
        if self.source != "plan" {
            writeln!(
                s,
                "  workers override      {} ({})",
                self.workers, self.source
            )?;
        }
        let cuda = |v: Option<u32>| v.map_or_else(|| "unknown".to_string(), cuda_version_text);
        writeln!(
            s,
            "  driver                {} (CUDA {}); worker built for CUDA {} (driver {CUDA_BUILD_MIN_DRIVER}+)",
            self.driver_version.as_deref().unwrap_or("unknown"),
            cuda(self.cuda_driver_version),
            cuda_version_text(self.cuda_build_version)
        )?;
        Ok(())
    }

    /// Each GPU: its memory, what fits and is assigned, its allocator cap, why it takes none.
    fn write_gpus(&self, s: &mut String) -> std::fmt::Result {
        writeln!(s, "gpus (NVML)")?;
        if self.gpus.is_empty() {
            match &self.gpu_note {
                Some(note) => writeln!(s, "  none: {note}")?,
                None => writeln!(s, "  none used: workers run on the CPU")?,
            }
        } else if let Some(note) = &self.gpu_note {
            writeln!(s, "  note: {note}")?;
        }
        for g in &self.gpus {
            write!(s, "  {}  {}  {}", g.label, g.name, g.uuid)?;
            if g.compute_mode != ComputeMode::Default {
                write!(s, "  compute mode {}", g.compute_mode.name())?;
            }
            if g.mps {
                write!(s, "  MPS")?;
            }
            if let Some(gi) = g.gpu_instance {
                write!(s, "  GPU instance {gi}")?;
            }
            write!(
                s,
                "\n    total {} MB, free {} MB, fraction {}, usable {} MB",
                g.total_mb, g.free_mb, g.fraction, g.usable_mb
            )?;
            if g.ledger_mb > 0 {
                let share = super::share_mb(g.total_mb, g.fraction);
                write!(
                    s,
                    " (ledger: other servers reserved {} MB of the {share} MB share, {} MB left)",
                    g.ledger_mb,
                    share.saturating_sub(g.ledger_mb)
                )?;
            }
            if self.mode == PlacementMode::GpuMemory {
                write!(s, ", fits {}, assigned {}", g.fits, g.assigned)?;
            } else if self.mode == PlacementMode::GpuSpread {
                write!(s, ", assigned {}", g.assigned)?;
            }
            if let (Some(cap), Some(mf)) = (g.cap_mb, g.memory_fraction) {
                write!(
                    s,
                    ", allocator cap {cap} MB ({mf}) + CUDA context ~{} MB per worker",
                    self.cuda_context_mb
                )?;
            }
            if let Some(limit) = g.mps_limit_mb {
                write!(s, ", MPS limit {limit} MB per worker")?;
            }
            writeln!(s)?;
            if let Some(x) = &g.excluded {
                if self.mode != PlacementMode::Cpu {
                    writeln!(s, "    no worker: {x}")?;
                }
            }
        }
        Ok(())
    }

    /// Host memory (rule 13): what the server may use, what a worker costs, the bound.
    fn write_host(&self, s: &mut String) -> std::fmt::Result {
        writeln!(s, "host memory")?;
        let Some(h) = &self.host else {
            return writeln!(
                s,
                "  unknown: neither a cgroup limit nor /proc/meminfo could be read"
            );
        };
        let b = &h.budget;
        writeln!(s, "  may be used           {} MB ({})", b.room_mb, b.source)?;
        match (h.per_worker_mb, &h.per_worker_from, h.bound) {
            (Some(per), Some(from), Some(bound)) => {
                writeln!(s, "  per worker            {per} MB at its peak ({from})")?;
                writeln!(s, "  bound                 {bound} workers")
            }
            _ => writeln!(
                s,
                "  per worker            measured from the template's warm-up pass when the server starts, else from the first worker's"
            ),
        }
    }

    /// The bounds and why, the result, where each worker goes, the warnings.
    fn write_result(&self, s: &mut String) -> std::fmt::Result {
        writeln!(s, "bounds and result")?;
        for w in &self.why {
            writeln!(s, "  {w}")?;
        }
        writeln!(
            s,
            "  => {} worker(s) on {} ({})",
            self.workers,
            self.device.name(),
            self.source
        )?;
        let unmeasured = self.host.as_ref().is_some_and(|h| h.bound.is_none());
        writeln!(
            s,
            "  bound that won: {}{}",
            self.bounded_by,
            if unmeasured {
                " (host memory: measured when the server starts)"
            } else {
                ""
            }
        )?;
        writeln!(s, "placement")?;
        for (first, last, gpu) in runs(&self.placement) {
            let slots = if first == last {
                format!("worker {first}")
            } else {
                format!("workers {first}-{last}")
            };
            match gpu {
                None => writeln!(s, "  {slots} -> CPU")?,
                Some(a) => {
                    let label = self.gpu_label(a.index);
                    write!(s, "  {slots} -> {label} ({})", a.uuid)?;
                    match (a.cap_mb, a.memory_fraction) {
                        (Some(c), Some(f)) => writeln!(s, ", allocator cap {c} MB ({f})")?,
                        _ => writeln!(s)?,
                    }
                }
            }
        }
        if let (Some(first), Some(last)) = (self.unplaced.first(), self.unplaced.last()) {
            writeln!(
                s,
                "  workers {first}-{last} -> not placed: wait for {} MB free on a GPU",
                self.admission_mb()
            )?;
        }
        for w in &self.warnings {
            writeln!(s, "WARNING: {w}")?;
        }
        Ok(())
    }
}

/// Consecutive slots with the same place, as (first, last, place).
fn runs(placement: &[Placement]) -> Vec<(u32, u32, Option<&GpuAssignment>)> {
    let mut out: Vec<(u32, u32, Option<&GpuAssignment>)> = Vec::new();
    for p in placement {
        match out.last_mut() {
            Some((_, last, gpu)) if *gpu == p.gpu.as_ref() && *last + 1 == p.slot => *last = p.slot,
            _ => out.push((p.slot, p.slot, p.gpu.as_ref())),
        }
    }
    out
}
