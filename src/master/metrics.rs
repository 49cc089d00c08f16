//! What the master knows for `/metrics`: the totals of workers that are gone, the last
//! report of each live worker, starts, boot durations and exits, the pool, the listening
//! socket's accept queue (read by the supervisor on each turn of its loop) and the plan. The
//! supervisor records into it (a lock and a few additions per event); the metrics thread
//! turns it into a [`Snapshot`] at scrape time, reading NVML and `/proc` outside the lock.
//!
//! Counters never go backwards: a worker's figures are cumulative, the master keeps its
//! last report while it lives and adds that to the totals of gone workers when it is reaped
//! (after reading the final report it sent before exiting). What a worker killed with
//! SIGKILL answered since its last report (at most one heartbeat, 1 s) is lost.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::events::Pool;
use super::slot::{KillReason, Phase, WorkerState};
use crate::master::plan::Plan;
use crate::master::resources::NvmlProbe;
use crate::metrics::endpoint::{SharedSource, Source};
use crate::metrics::exposition::{
    GpuRow, IdleFigures, LedgerRow, PlanGauges, Snapshot, Waiting, WorkerRow,
};
use crate::metrics::histogram::Hist;
use crate::metrics::listen_queue::Backlog;
use crate::metrics::traffic::Traffic;
use crate::protocol::{worker_exit, Device, RetireReason};

#[derive(Debug, Clone)]
struct LiveWorker {
    slot: u32,
    generation: u64,
    method: &'static str,
    gpu: Option<u32>,
    served: u64,
    /// Requests it has taken that wait for its model (its last heartbeat).
    queued: u32,
    /// `queued` by priority lane, highest first.
    queued_lanes: [u32; 3],
    traffic: Traffic,
    allocator_peak: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    gone: Traffic,
    live: HashMap<u32, LiveWorker>,
    starts: BTreeMap<String, u64>,
    boot: BTreeMap<String, Hist>,
    exits: BTreeMap<String, u64>,
    /// The pool as the supervisor last reported it (workers by phase, in flight, planned).
    pool: Pool,
    /// The listening socket's accept queue as the supervisor last read it (`None` once it
    /// closed its socket).
    backlog: Option<Backlog>,
    plan: PlanGauges,
    /// When the supervisor loop last reported the pool (it does on every turn).
    last_turn: Option<Instant>,
    /// When a worker was last seen ready.
    last_ready: Option<Instant>,
    stopping: bool,
    /// `--idle-release`'s figures.
    idle: IdleFigures,
}

/// Shared between the supervisor (writes) and the metrics thread (reads).
#[derive(Clone)]
pub struct MasterMetrics {
    state: Arc<Mutex<State>>,
    /// NVML for the GPU families, opened by the metrics thread at its first scrape.
    nvml: Arc<OnceLock<Option<NvmlProbe>>>,
    nvml_library: Option<PathBuf>,
    on_gpu: bool,
    /// The GPU-memory ledger this server reserves in, read at each scrape.
    ledger: Arc<OnceLock<PathBuf>>,
}

impl MasterMetrics {
    pub fn new(plan: &Plan, nvml_library: Option<PathBuf>) -> MasterMetrics {
        let state = State {
            pool: Pool {
                target: plan.workers,
                ..Pool::default()
            },
            plan: PlanGauges {
                cpu_bound: plan.cpu_bound,
                gpu_bound: plan.gpu_bound,
                host_bound: plan.host.as_ref().and_then(|h| h.bound),
                workers: plan.workers,
                footprint_declared_mb: plan.declared_typ_mb,
                footprint_measured_mb: plan.measured_mb,
                footprint_planned_mb: plan.planned_typ_mb,
                footprint_observed_mb: None,
                pass_peak_warmup: None,
                pass_peak_observed: None,
            },
            ..State::default()
        };
        MasterMetrics {
            state: Arc::new(Mutex::new(state)),
            nvml: Arc::new(OnceLock::new()),
            nvml_library,
            on_gpu: plan.device == Device::Cuda,
            ledger: Arc::new(OnceLock::new()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A worker process exists (`method`: `fork` or `exec`).
    pub fn started(&self, st: &WorkerState, method: &'static str) {
        self.with(|s| {
            *s.starts.entry(method.into()).or_default() += 1;
            s.live.insert(
                st.pid,
                LiveWorker {
                    slot: st.slot,
                    generation: st.generation,
                    method,
                    gpu: st.gpu,
                    served: 0,
                    queued: 0,
                    queued_lanes: [0; 3],
                    traffic: Traffic::default(),
                    allocator_peak: None,
                },
            );
        });
    }

    /// The host-memory bound, measured once the template was ready, and the worker count
    /// it left.
    pub fn host_plan(&self, bound: u32, workers: u32) {
        self.with(|s| {
            s.plan.host_bound = Some(bound);
            s.plan.workers = workers;
        });
    }

    /// How far the template's resident set rose over its warm-up passes, in bytes.
    pub fn warmup_pass_peak(&self, bytes: u64) {
        self.with(|s| s.plan.pass_peak_warmup = Some(bytes));
    }

    /// How far a worker's resident set rose above its figure when ready, over its passes:
    /// the highest seen is kept.
    pub fn serving_pass_peak(&self, bytes: u64) {
        self.with(|s| {
            s.plan.pass_peak_observed = Some(s.plan.pass_peak_observed.unwrap_or(0).max(bytes))
        });
    }

    /// The highest GPU footprint a worker has reached while serving, in MB.
    pub fn observed_footprint(&self, mb: u64) {
        self.with(|s| s.plan.footprint_observed_mb = Some(mb));
    }

    /// A worker became ready `secs` after it was started.
    pub fn worker_ready(&self, pid: u32, secs: f64) {
        self.with(|s| {
            if let Some(w) = s.live.get(&pid) {
                s.boot.entry(w.method.into()).or_default().observe(secs);
            }
        });
    }

    /// A worker's cumulative report.
    pub fn report(&self, pid: u32, traffic: Traffic, allocator_peak: Option<u64>) {
        self.with(|s| {
            if let Some(w) = s.live.get_mut(&pid) {
                w.traffic = traffic;
                w.allocator_peak = allocator_peak.or(w.allocator_peak);
            }
        });
    }

    /// The pool as the supervisor sees it now (`pool` is what it reports of `workers`;
    /// called on every turn of its loop).
    pub fn pool<'a>(
        &self,
        pool: Pool,
        stopping: bool,
        workers: impl IntoIterator<Item = &'a WorkerState>,
    ) {
        self.with(|s| {
            s.pool = pool;
            s.stopping = stopping;
            s.last_turn = Some(Instant::now());
            if pool.ready > 0 {
                s.last_ready = s.last_turn;
            }
            for st in workers {
                if let Some(w) = s.live.get_mut(&st.pid) {
                    w.served = st.served;
                    w.queued = st.queued;
                    w.queued_lanes = st.queued_lanes;
                }
            }
        });
    }

    /// `--idle-release`: released now (`Some(true)`), serving (`Some(false)`); a release
    /// is counted when it begins.
    pub fn idle_state(&self, released: Option<bool>) {
        self.with(|s| {
            if released == Some(true) && s.idle.released != Some(true) {
                s.idle.releases += 1;
            }
            s.idle.released = released;
        });
    }

    /// Each scrape shows the GPU-memory ledger in `dir` as this server sees it.
    pub fn see_ledger(&self, dir: PathBuf) {
        let _ = self.ledger.set(dir);
    }

    /// A request arrived while released, with this outcome (`admitted`, `no_room`).
    pub fn readmission(&self, outcome: &str) {
        self.with(|s| *s.idle.readmissions.entry(outcome.into()).or_default() += 1);
    }

    /// A re-admitted server's first worker was ready `secs` after the request.
    pub fn readmitted(&self, secs: f64) {
        self.with(|s| s.idle.readmission.observe(secs));
    }

    /// The listening socket's accept queue, read now (`None`: the master has closed its
    /// socket).
    pub fn backlog(&self, b: Option<Backlog>) {
        self.with(|s| s.backlog = b);
    }

    /// A worker was reaped: its last report joins the totals, its exit is counted.
    pub fn exited(&self, pid: u32, reason: &'static str) {
        self.with(|s| {
            if let Some(w) = s.live.remove(&pid) {
                s.gone.add(&w.traffic);
            }
            *s.exits.entry(reason.into()).or_default() += 1;
        });
    }

    /// What a scrape answers.
    fn build_snapshot(&self) -> Snapshot {
        let (mut snap, live) = self.with(|s| {
            let mut traffic = s.gone.clone();
            for w in s.live.values() {
                traffic.add(&w.traffic);
            }
            traffic.log_lines_dropped += crate::logging::dropped(crate::logging::Kind::Log);
            let p = s.pool;
            let model: u64 = s.live.values().map(|w| u64::from(w.queued)).sum();
            let mut lanes = [0u64; 3];
            for w in s.live.values() {
                for (sum, n) in lanes.iter_mut().zip(w.queued_lanes) {
                    *sum += u64::from(n);
                }
            }
            let snap = Snapshot {
                traffic,
                in_flight: u64::from(p.in_flight),
                waiting: Waiting {
                    lanes,
                    ..Waiting::of(s.backlog, model)
                },
                workers: [p.booting, p.ready, p.retiring],
                planned: p.target,
                starts: s.starts.clone(),
                boot: s.boot.clone(),
                exits: s.exits.clone(),
                plan: s.plan,
                idle: s.idle.clone(),
                ..Snapshot::default()
            };
            let live: Vec<(u32, LiveWorker)> =
                s.live.iter().map(|(p, w)| (*p, w.clone())).collect();
            (snap, live)
        });
        // One row per slot: its newest worker (a retiring one may still share the slot).
        let mut newest: BTreeMap<u32, (u32, LiveWorker)> = BTreeMap::new();
        for (pid, w) in live {
            if newest
                .get(&w.slot)
                .is_none_or(|(_, n)| w.generation > n.generation)
            {
                newest.insert(w.slot, (pid, w));
            }
        }
        let nvml = self.nvml();
        snap.per_worker = newest
            .into_values()
            .map(|(pid, w)| WorkerRow {
                slot: w.slot,
                gpu_used: w
                    .gpu
                    .zip(nvml)
                    .and_then(|(g, n)| n.process_used_bytes(g, pid).ok().flatten()),
                allocator_peak: w.allocator_peak,
                rss: crate::own_memory::resident(Some(pid)),
                own: crate::own_memory::own(Some(pid)),
                served: w.served,
            })
            .collect();
        if let Some(n) = nvml {
            snap.gpus = gpu_rows(n);
        }
        if let Some(dir) = self.ledger.get() {
            snap.ledger = ledger_rows(dir);
        }
        snap
    }

    fn nvml(&self) -> Option<&NvmlProbe> {
        if !self.on_gpu {
            return None;
        }
        self.nvml
            .get_or_init(|| match NvmlProbe::open(self.nvml_library.as_deref()) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!("metrics: no GPU figures: {e}");
                    None
                }
            })
            .as_ref()
    }

    /// The source [`crate::metrics::endpoint`] answers from.
    pub fn source(&self) -> SharedSource {
        Arc::new(self.clone())
    }
}

/// The ledger in `dir`, read without its lock, as rows for `/metrics` (none when it
/// cannot be read).
fn ledger_rows(dir: &std::path::Path) -> Vec<LedgerRow> {
    let Ok(view) = crate::master::host::view::read(dir) else {
        return Vec::new();
    };
    let rows = view.servers.into_iter().map(|r| LedgerRow {
        server: r.id,
        app: r.app,
        port: r.port.map(|p| p.to_string()).unwrap_or_default(),
        state: r
            .state
            .map(|s| format!("{s:?}").to_lowercase())
            .unwrap_or_default(),
        reserved_mb: r.reserved_mb,
        workers: r.live_workers,
        reload_ms: r.reload_ms,
    });
    rows.collect()
}

/// The master's loop turns at least every 100 ms; this long without a turn, it is stuck.
const LOOP_STALE: Duration = Duration::from_secs(10);
/// Readiness survives this long without a ready worker: the gap while the only workers
/// recycle (milliseconds; requests wait in the listen queue meanwhile) is not an outage.
pub const READY_GRACE: Duration = Duration::from_secs(5);

impl Source for MasterMetrics {
    fn snapshot(&self) -> Snapshot {
        self.build_snapshot()
    }

    fn live(&self) -> Result<String, String> {
        let last = self.with(|s| s.last_turn);
        match last.map(|t| t.elapsed()) {
            Some(ago) if ago <= LOOP_STALE => Ok(format!(
                "the supervisor loop turned {} ms ago",
                ago.as_millis()
            )),
            Some(ago) => Err(format!(
                "the supervisor loop has not turned for {:.1} s",
                ago.as_secs_f64()
            )),
            None => Err("the supervisor loop has not started".into()),
        }
    }

    fn ready(&self) -> Result<String, String> {
        let (ready, planned, stopping, last, turn, released) = self.with(|s| {
            (
                s.pool.ready,
                s.pool.target,
                s.stopping,
                s.last_ready,
                s.last_turn,
                s.idle.released == Some(true),
            )
        });
        let since = last.map(|t| t.elapsed());
        // The pool's figures are as of the loop's last turn: a stuck loop's are stale, and
        // nobody replaces a worker that dies meanwhile.
        let stale = turn.map(|t| t.elapsed()).filter(|ago| *ago > LOOP_STALE);
        if stopping {
            Err("stopping".into())
        } else if let Some(ago) = stale {
            Err(format!(
                "the supervisor loop has not turned for {:.1} s: the workers' state is not known",
                ago.as_secs_f64()
            ))
        } else if ready > 0 {
            Ok(format!("{ready} of {planned} workers ready"))
        } else if released {
            Ok("released for being idle (--idle-release): the next request starts workers again, or is answered 503 with Retry-After when the GPUs have no room".into())
        } else if let Some(ago) = since.filter(|a| *a <= READY_GRACE) {
            Ok(format!(
                "0 of {planned} workers ready, replacements booting (one was ready {} ms ago)",
                ago.as_millis()
            ))
        } else {
            Err(match since {
                Some(ago) => format!(
                    "no worker ready for {:.1} s (0 of {planned})",
                    ago.as_secs_f64()
                ),
                None => format!("no worker ready yet (0 of {planned})"),
            })
        }
    }
}

/// Every GPU NVML sees, now.
pub fn gpu_rows(n: &NvmlProbe) -> Vec<GpuRow> {
    n.indices()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| n.gpu(i).ok())
        .map(|g| GpuRow {
            index: g.index,
            uuid: g.uuid,
            name: g.name,
            total: g.total_bytes,
            free: g.free_bytes,
            used: g.used_bytes,
        })
        .collect()
}

/// The `reason` label of an exit: why the master killed it, else how it ended, else why it
/// retired.
pub fn exit_reason(st: &WorkerState, code: Option<i32>, sig: Option<Signal>) -> &'static str {
    if let Some(k) = st.killed {
        return match k {
            KillReason::BootTimeout => "boot-timeout",
            KillReason::Heartbeat => "heartbeat",
            KillReason::GracefulTimeout => "graceful-timeout",
            KillReason::StopTimeout => "stop-timeout",
            KillReason::Superseded => "superseded",
        };
    }
    if st.oom_killed {
        return "oom-kill";
    }
    if sig.is_some() {
        return "signal";
    }
    match code {
        Some(worker_exit::CUDA_FATAL) => return "cuda-fatal",
        Some(c) if c != 0 && st.phase == Phase::Booting => return "boot-failure",
        Some(c) if c != 0 => return "crash",
        _ => {}
    }
    match st.retire_reason {
        Some(RetireReason::MaxRequests) => "max-requests",
        Some(RetireReason::GpuMemory) => "gpu-memory",
        Some(RetireReason::HostMemory) => "host-memory",
        Some(RetireReason::OutOfMemory) => "cuda-oom",
        Some(RetireReason::RequestTimeout) => "request-timeout",
        Some(RetireReason::Asked) | None => "asked",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_plan() -> Plan {
        let meta = crate::metadata::AppMetadata::parse(
            std::path::Path::new("/apps/t/app-metadata.json"),
            r#"{"name": "t"}"#,
        )
        .unwrap();
        let res = crate::master::resources::Resources {
            cpus: 1,
            gpus: vec![],
            ..Default::default()
        };
        crate::master::plan::plan(
            &res,
            &crate::master::plan::Demand::declared(&meta),
            &crate::master::plan::Policy::default(),
        )
        .unwrap()
    }

    fn worker(pid: u32, slot: u32, generation: u64) -> WorkerState {
        WorkerState::new(pid, slot, generation, 0, None, Instant::now())
    }

    fn answered(n: u64) -> Traffic {
        let mut t = Traffic::default();
        t.endpoints
            .entry("infer".into())
            .or_default()
            .codes
            .insert(200, n);
        t
    }

    #[test]
    fn counters_keep_the_totals_of_gone_workers() {
        let plan = cpu_plan();
        let m = MasterMetrics::new(&plan, None);
        let (a, b) = (worker(10, 0, 0), worker(11, 1, 0));
        m.started(&a, "exec");
        m.started(&b, "fork");
        m.worker_ready(10, 0.3);
        m.report(10, answered(4), None);
        m.report(11, answered(2), None);
        assert_eq!(m.build_snapshot().traffic.answers(), 6);
        m.report(10, answered(5), None);
        m.exited(10, "max-requests");
        let s = m.build_snapshot();
        assert_eq!(s.traffic.answers(), 7, "gone 5 + live 2");
        assert_eq!(s.exits["max-requests"], 1);
        assert_eq!(s.starts["exec"] + s.starts["fork"], 2);
        assert_eq!(s.boot["exec"].count(), 1);
        // The replacement in slot 0 starts from zero; the total does not go back.
        m.started(&worker(12, 0, 1), "fork");
        m.report(12, answered(1), None);
        assert_eq!(m.build_snapshot().traffic.answers(), 8);
        // A report from a pid the master no longer knows is ignored.
        m.report(10, answered(100), None);
        assert_eq!(m.build_snapshot().traffic.answers(), 8);
    }

    #[test]
    fn probes_follow_the_loop_and_the_ready_workers() {
        let m = MasterMetrics::new(&cpu_plan(), None);
        assert!(m.live().is_err(), "no turn of the loop yet");
        assert!(m.ready().is_err());
        let mut w = worker(1, 0, 0);
        m.pool(Pool::of(1, [&w]), false, [&w]);
        assert!(m.live().is_ok());
        assert_eq!(m.ready(), Err("no worker ready yet (0 of 1)".into()));
        w.phase = Phase::Ready;
        m.pool(Pool::of(1, [&w]), false, [&w]);
        assert_eq!(m.ready(), Ok("1 of 1 workers ready".into()));
        // It recycles: its replacement boots; still ready within the grace.
        let booting = worker(2, 0, 1);
        m.pool(Pool::of(1, [&booting]), false, [&booting]);
        assert!(m
            .ready()
            .unwrap()
            .starts_with("0 of 1 workers ready, replacements booting"));
        m.with(|s| s.last_ready = Some(Instant::now() - READY_GRACE - Duration::from_secs(1)));
        assert!(m.ready().unwrap_err().starts_with("no worker ready for 6"));
        m.pool(Pool::of(1, [&w]), false, [&w]);
        m.pool(Pool::of(1, [&w]), true, [&w]);
        assert_eq!(m.ready(), Err("stopping".into()));
        m.with(|s| s.last_turn = Some(Instant::now() - LOOP_STALE - Duration::from_secs(1)));
        assert!(m.live().unwrap_err().contains("has not turned"));
        // A loop that does not turn makes its last figures stale: not ready either.
        m.with(|s| s.stopping = false);
        assert!(m.ready().unwrap_err().contains("has not turned"));
    }

    #[test]
    fn one_row_per_slot_from_its_newest_worker() {
        let plan = cpu_plan();
        let m = MasterMetrics::new(&plan, None);
        let mut old = worker(std::process::id(), 0, 3);
        m.started(&old, "exec");
        old.phase = Phase::Retiring;
        old.served = 9;
        let new = worker(u32::MAX - 1, 0, 4);
        m.started(&new, "fork");
        m.pool(Pool::of(1, [&old, &new]), false, [&old, &new]);
        let s = m.build_snapshot();
        assert_eq!(s.workers, [1, 0, 1]);
        assert_eq!(s.per_worker.len(), 1);
        assert_eq!(s.per_worker[0].served, 0, "the newest worker's count");
    }

    #[test]
    fn exit_reasons() {
        let mut st = worker(1, 0, 0);
        assert_eq!(exit_reason(&st, Some(3), None), "boot-failure");
        st.phase = Phase::Ready;
        assert_eq!(exit_reason(&st, Some(1), None), "crash");
        assert_eq!(exit_reason(&st, None, Some(Signal::SIGKILL)), "signal");
        assert_eq!(exit_reason(&st, Some(5), None), "cuda-fatal");
        st.retire_reason = Some(RetireReason::MaxRequests);
        assert_eq!(exit_reason(&st, Some(0), None), "max-requests");
        st.retire_reason = Some(RetireReason::OutOfMemory);
        assert_eq!(exit_reason(&st, Some(0), None), "cuda-oom");
        st.killed = Some(KillReason::Heartbeat);
        assert_eq!(exit_reason(&st, None, Some(Signal::SIGKILL)), "heartbeat");
    }
}
