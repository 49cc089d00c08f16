//! Planning from measured GPU memory: whether to profile (`--profile-memory`), the plan
//! made again from the measured footprint (`master::profile`), and what `app plan
//! --measure` prints.
//!
//! The plan assumes `max(ceil(footprint × --memory-headroom), est_gpu_mem_min)` MB per
//! worker instead of `est_gpu_mem_typ`; every other rule of the plan (usable memory,
//! reserve, the CPU bound, the allocator cap per worker) is unchanged. When the measured
//! figure fits on no GPU, the estimate's plan stands (with a warning): profiling never
//! plans zero workers. Which figure `app --production` plans from: [`source`].

use std::fmt::Write as _;

use super::profile::{measure, Measured};
use crate::master::config::Config;
use crate::master::plan::{self, Demand, Plan};
use crate::master::resources::{NvmlProbe, Resources};

/// Whether `app --production` profiles before planning: `--profile-memory on/off`, else
/// (auto) when a worker is planned on a GPU and the metadata declares the input shapes a
/// pass can be made from.
pub fn wanted(cfg: &Config, plan: &Plan) -> bool {
    let on_gpu = plan.placement.iter().any(|p| p.gpu.is_some());
    let shapes = cfg
        .app
        .metadata
        .profile_shapes(cfg.batch.max_batch_size)
        .is_some();
    match cfg.footprint.profile_memory {
        Some(false) => false,
        Some(true) => {
            if !on_gpu {
                tracing::warn!(
                    event = "memory_profile_skipped",
                    "--profile-memory on: no worker is planned on a GPU, nothing to measure"
                );
            }
            on_gpu
        }
        None => on_gpu && shapes,
    }
}

/// Where the figure per worker comes from when `app --production` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The high-water mark `--footprint-file` recorded, in MB.
    Remembered(u64),
    /// One worker profiled now.
    Profile,
    /// The declared estimate.
    Estimate,
}

/// Where the figure per worker comes from (pure): experience beats a new measurement, so a
/// footprint `--footprint-file` `remembered` plans GPU workers (`on_gpu`) unless
/// `--profile-memory off`; else a profile when [`wanted`] (asked only then: it may warn);
/// else the estimate.
pub fn source(
    remembered: Option<u64>,
    on_gpu: bool,
    profile_memory: Option<bool>,
    wanted: impl FnOnce() -> bool,
) -> Source {
    match remembered {
        Some(mb) if on_gpu && profile_memory != Some(false) => Source::Remembered(mb),
        _ if wanted() => Source::Profile,
        _ => Source::Estimate,
    }
}

/// The measurement and the plan made from it.
#[derive(Debug)]
pub struct Profiled {
    /// `profiled` (a worker measured now) or `remembered` (`--footprint-file`).
    pub source: &'static str,
    pub measured: Measured,
    /// MB per worker the new plan assumes.
    pub planned_mb: u64,
    pub headroom: f64,
    pub declared_min: u64,
    pub declared_typ: u64,
    /// The plan from the declared estimate.
    pub estimate_workers: u32,
    pub plan: Plan,
    /// Set when the measured figure fits nowhere and the estimate's plan was kept.
    pub kept_estimate: Option<String>,
}

/// Profiles one worker and plans again from what it measured.
pub fn measure_and_plan(
    cfg: &Config,
    res: &Resources,
    plan: &Plan,
    gpus: Option<&NvmlProbe>,
) -> Result<Profiled, String> {
    let measured = measure(cfg, plan, gpus)?;
    Ok(plan_from(cfg, res, plan, measured, "profiled"))
}

/// The plan made from a footprint recorded by an earlier run (`--footprint-file`).
pub fn remembered(
    cfg: &Config,
    res: &Resources,
    plan: &Plan,
    mb: u64,
    context_mb: Option<u64>,
) -> Profiled {
    let measured = Measured {
        gpu: plan
            .placement
            .iter()
            .find_map(|p| p.gpu.as_ref().map(|g| g.index))
            .unwrap_or(0),
        footprint_mb: mb,
        nvml_used: None,
        device_delta: None,
        allocator_peak: None,
        allocator_reserved: None,
        recorded_context_mb: context_mb,
        pass_ms: 0.0,
        pid: 0,
    };
    plan_from(cfg, res, plan, measured, "remembered")
}

fn plan_from(
    cfg: &Config,
    res: &Resources,
    plan: &Plan,
    measured: Measured,
    source: &'static str,
) -> Profiled {
    let meta = &cfg.app.metadata;
    let planned_mb = measured.planned_mb(cfg.footprint.memory_headroom, meta.est_gpu_mem_min);
    let demand =
        Demand::declared(meta).measured(measured.footprint_mb, planned_mb, measured.context_mb());
    let (new_plan, kept_estimate) = match plan::plan(res, &demand, &cfg.policy()) {
        Ok(p) => (p, None),
        Err(e) => (plan.clone(), Some(e.to_string())),
    };
    Profiled {
        source,
        measured,
        planned_mb,
        headroom: cfg.footprint.memory_headroom,
        declared_min: meta.est_gpu_mem_min,
        declared_typ: meta.est_gpu_mem_typ,
        estimate_workers: plan.workers,
        plan: new_plan,
        kept_estimate,
    }
}

impl Profiled {
    /// One log line with the numbers (and a warning when the estimate's plan was kept).
    pub fn log(&self) {
        let m = &self.measured;
        match &self.kept_estimate {
            None => tracing::info!(
                event = "memory_profiled",
                source = self.source,
                gpu = m.gpu,
                measured_mb = m.footprint_mb,
                planned_mb = self.planned_mb,
                declared_typ_mb = self.declared_typ,
                declared_min_mb = self.declared_min,
                workers = self.plan.workers,
                estimate_workers = self.estimate_workers,
                "{} {} MB per worker on GPU {} (declared est_gpu_mem_typ {} MB); planning {} MB per worker (× {} headroom, at least est_gpu_mem_min {} MB): {} workers (the estimate gave {})",
                if self.source == "remembered" { "remembered (--footprint-file)" } else { "measured" },
                m.footprint_mb,
                m.gpu,
                self.declared_typ,
                self.planned_mb,
                self.headroom,
                self.declared_min,
                self.plan.workers,
                self.estimate_workers
            ),
            Some(why) => tracing::warn!(
                event = "memory_profile_failed",
                measured_mb = m.footprint_mb,
                planned_mb = self.planned_mb,
                declared_typ_mb = self.declared_typ,
                "measured {} MB per worker ({} MB with headroom), which fits no GPU ({why}); planning from est_gpu_mem_typ ({} MB) as declared",
                m.footprint_mb,
                self.planned_mb,
                self.declared_typ
            ),
        }
    }

    /// What `app plan --measure` prints: the measurement, the metadata values to use, and
    /// the plan they give (JSON with `json`).
    pub fn report(&self, json: bool) -> String {
        let m = &self.measured;
        let suggest_min = m.footprint_mb;
        let suggest_typ = self.planned_mb.max(suggest_min);
        if json {
            let v = serde_json::json!({
                "measured": {
                    "gpu": m.gpu,
                    "footprint_mb": m.footprint_mb,
                    "nvml_process_bytes": m.nvml_used,
                    "device_free_memory_fall_bytes": m.device_delta,
                    "allocator_peak_reserved_bytes": m.allocator_peak,
                    "allocator_reserved_bytes": m.allocator_reserved,
                    "pass_ms": m.pass_ms,
                },
                "declared": {"est_gpu_mem_min": self.declared_min, "est_gpu_mem_typ": self.declared_typ},
                "headroom": self.headroom,
                "planned_mb_per_worker": self.planned_mb,
                "suggested_metadata": {"est_gpu_mem_min": suggest_min, "est_gpu_mem_typ": suggest_typ},
                "estimate_workers": self.estimate_workers,
                "kept_estimate": self.kept_estimate,
                "plan": self.plan,
            });
            return format!(
                "{}\n",
                serde_json::to_string_pretty(&v).expect("a report serializes")
            );
        }
        let mut s = String::new();
        let mbf = |b: Option<u64>| {
            b.map_or("n/a".to_string(), |b| {
                format!("{:.0} MB", b as f64 / (1u64 << 20) as f64)
            })
        };
        let _ = writeln!(
            s,
            "measured (one worker, one forward pass at the profile input)"
        );
        let _ = writeln!(
            s,
            "  footprint             {} MB on GPU {} (pass {:.1} ms)",
            m.footprint_mb, m.gpu, m.pass_ms
        );
        let _ = writeln!(
            s,
            "  from                  NVML process {}{}, allocator peak reserved {}, reserved after the pass {}",
            mbf(m.nvml_used),
            m.device_delta
                .map(|d| format!(" (pid not visible: GPU free memory fell {})", mbf(Some(d))))
                .unwrap_or_default(),
            mbf(m.allocator_peak),
            mbf(m.allocator_reserved)
        );
        let _ = writeln!(
            s,
            "  declared              est_gpu_mem_min {} MB, est_gpu_mem_typ {} MB",
            self.declared_min, self.declared_typ
        );
        let _ = writeln!(
            s,
            "  planned per worker    {} MB (footprint × {} headroom, at least est_gpu_mem_min)",
            self.planned_mb, self.headroom
        );
        let _ = writeln!(
            s,
            "  metadata to use       \"est_gpu_mem_min\": {suggest_min}, \"est_gpu_mem_typ\": {suggest_typ}"
        );
        match &self.kept_estimate {
            None => {
                let _ = writeln!(
                    s,
                    "  workers               {} from the measurement ({} from the declared estimate)",
                    self.plan.workers, self.estimate_workers
                );
            }
            Some(why) => {
                let _ = writeln!(
                    s,
                    "  workers               the measured figure fits no GPU ({why}); the estimate's plan ({} workers) is kept",
                    self.estimate_workers
                );
            }
        }
        let _ = writeln!(s);
        s.push_str(&self.plan.to_text());
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_footprint_beats_a_profile_which_beats_the_estimate() {
        let asked = std::cell::Cell::new(0);
        let wanted = |w: bool| {
            let asked = &asked;
            move || {
                asked.set(asked.get() + 1);
                w
            }
        };
        // (recorded MB, on a GPU, --profile-memory, profile wanted, source)
        let rows = [
            (Some(900), true, None, true, Source::Remembered(900)),
            (Some(900), true, Some(true), true, Source::Remembered(900)),
            (Some(900), true, Some(false), false, Source::Estimate),
            (Some(900), false, None, false, Source::Estimate),
            (None, true, None, true, Source::Profile),
            (None, true, None, false, Source::Estimate),
        ];
        for (mb, on_gpu, flag, want, expect) in rows {
            assert_eq!(
                source(mb, on_gpu, flag, wanted(want)),
                expect,
                "{mb:?} {on_gpu} {flag:?}"
            );
        }
        // `wanted` (which may warn) is asked only when no recorded footprint decides.
        assert_eq!(asked.get(), 4);
    }

    /// A plan made from a profile leaves each worker the context that
    /// profiling measured beside its allocator (NVML's figure less the allocator's reserved
    /// bytes), not the 500 MB constant, in its cap and in what it reports.
    #[test]
    fn a_profiled_plan_takes_the_context_it_measured() {
        use clap::Parser;
        const MB: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let meta =
            r#"{"name": "t", "model": "m.pt", "est_gpu_mem_min": 1000, "est_gpu_mem_typ": 5000}"#;
        std::fs::write(dir.path().join("meta.json"), meta).unwrap();
        std::fs::write(dir.path().join("app-worker"), "").unwrap();
        let argv: Vec<String> = ["app", "--metadata"]
            .iter()
            .map(|s| s.to_string())
            .chain([dir.path().join("meta.json").display().to_string()])
            .collect();
        let cli = crate::master::cli::Cli::try_parse_from(&argv).unwrap();
        let cfg = Config::from_cli(cli, &|_| None, &argv, Some(dir.path())).unwrap();
        let probe =
            crate::master::resources::FixedProbe::new(vec![crate::master::resources::GpuInfo {
                uuid: "GPU-0".into(),
                name: "test".into(),
                total_bytes: 40960 * MB,
                free_bytes: 40960 * MB,
                ..Default::default()
            }]);
        let res = Resources::from_probe(8, &probe);
        let estimate =
            plan::plan(&res, &Demand::declared(&cfg.app.metadata), &cfg.policy()).unwrap();
        // The worker: 1500 MB reserved by its allocator, 2300 MB as NVML shows it.
        let measured = Measured {
            gpu: 0,
            footprint_mb: 2300,
            nvml_used: Some(2300 * MB),
            device_delta: None,
            allocator_peak: Some(1500 * MB),
            allocator_reserved: Some(1500 * MB),
            recorded_context_mb: None,
            pass_ms: 1.0,
            pid: 1,
        };
        let p = plan_from(&cfg, &res, &estimate, measured.clone(), "profiled").plan;
        assert_eq!(p.cuda_context_mb, 800, "the measured context, not 500");
        let g = &p.gpus[0];
        assert_eq!(g.cap_mb, Some(p.planned_typ_mb - 800));
        // A measurement that missed most of the context (NVML's figure
        // barely above the allocator's) is taken at the floor, never as a few MB…
        let missed = Measured {
            nvml_used: Some(1510 * MB),
            ..measured
        };
        let p = plan_from(&cfg, &res, &estimate, missed, "profiled").plan;
        assert_eq!(p.cuda_context_mb, plan::CUDA_CONTEXT_FLOOR_MB);
        // …and a plan made from `--footprint-file` takes the context recorded with it,
        // not the 500 MB constant.
        let p = remembered(&cfg, &res, &estimate, 2300, Some(700)).plan;
        assert_eq!(p.cuda_context_mb, 700);
        let p = remembered(&cfg, &res, &estimate, 2300, None).plan;
        assert_eq!(p.cuda_context_mb, plan::CUDA_CONTEXT_MB);
    }
}
