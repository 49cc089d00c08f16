//! The supervisor's decisions, as a pure function: given the workers, the slots, the time
//! and the limits, what to start, stop, kill, or whether to give up. No I/O here, so every
//! rule is a row in the tests below.
//!
//! Rules, in order:
//! 1. Stopping: ask every worker to stop once; kill those that outlive the graceful timeout;
//!    exit 0 when none is left.
//! 2. Give up: no worker ever became ready and `FIRST_BOOT_TRIES` boots failed → exit 3;
//!    no worker ready for `boot_timeout` (after one had been) → exit 4.
//! 3. Deadlines: kill a worker still booting after `boot_timeout`, a ready one silent for
//!    `timeout`, a retiring one past `graceful_timeout`.
//! 4. Shrink: stop workers in slots at or beyond the target.
//! 5. Fill: start a worker in every slot below the target that has none, unless the slot
//!    backs off after failures or its GPU has no room (the GPU's capacity counts retiring
//!    workers too: a replacement starts at once where both fit, else once the old one left).
//! 6. Reload (after HUP): one slot at a time, a worker of the new configuration starts
//!    beside the old one where the GPU has room (start-then-stop), else the old one is
//!    stopped first (stop-then-start); once the new one is ready the old one retires, and
//!    the next slot waits until it has exited (so at most one worker more than planned
//!    exists). A worker still booting with a configuration that a newer HUP superseded is
//!    killed: it never served.

use std::time::{Duration, Instant};

use super::slot::{KillReason, Phase, RetireAsk, Slot, WorkerState};
use crate::master::exit;

/// Workers already planned per GPU this round: (NVML index, count).
type Extra = Vec<(u32, u32)>;

/// Boot failures, before any worker was ever ready, after which the master exits 3.
pub const FIRST_BOOT_TRIES: u32 = 3;
/// Time a stopped worker gets beyond the graceful timeout before it is killed.
pub const KILL_GRACE: Duration = Duration::from_secs(1);
/// How long a quick stop waits before it kills.
pub const QUICK_STOP_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopping {
    Graceful(Instant),
    Quick(Instant),
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeout: Duration,
    pub boot_timeout: Duration,
    pub graceful_timeout: Duration,
}

/// Everything `decide` looks at.
pub struct View<'a> {
    pub now: Instant,
    pub workers: &'a [WorkerState],
    pub slots: &'a [Slot],
    /// Slots `0..target` should each have a worker.
    pub target: u32,
    /// The current configuration generation.
    pub cfg_gen: u64,
    pub stopping: Option<Stopping>,
    pub ever_ready: bool,
    /// Boots that failed while no worker had ever been ready.
    pub first_boot_failures: u32,
    /// The exit status of the last boot that failed, when it exited (not killed).
    pub last_boot_code: Option<i32>,
    /// The last moment a worker was ready (or the master's start).
    pub last_ready_at: Instant,
    /// How many workers fit on a GPU (by NVML index), retiring ones included.
    pub gpu_capacity: &'a dyn Fn(u32) -> u32,
    /// Whether a GPU has the free memory to admit one more worker now.
    pub gpu_admits: &'a dyn Fn(u32) -> bool,
    pub limits: Limits,
}

/// Why a slot cannot start its worker yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// Beyond what the plan fitted, and no GPU has the memory for it yet.
    Unplaced,
    /// Its GPU is full by the plan until a retiring worker exits.
    GpuRoom(u32),
    /// Its GPU lacks the free memory for `est_gpu_mem_min` plus the reserve (admission).
    GpuMemory(u32),
}

impl WaitReason {
    /// The `why` of the `worker_waits` event.
    pub fn code(self) -> &'static str {
        match self {
            WaitReason::Unplaced => "unplaced",
            WaitReason::GpuRoom(_) => "gpu_room",
            WaitReason::GpuMemory(_) => "gpu_memory",
        }
    }

    pub fn gpu(self) -> Option<u32> {
        match self {
            WaitReason::Unplaced => None,
            WaitReason::GpuRoom(g) | WaitReason::GpuMemory(g) => Some(g),
        }
    }
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitReason::Unplaced => {
                f.write_str("no GPU has the free memory for est_gpu_mem_typ plus the reserve yet")
            }
            WaitReason::GpuRoom(g) => {
                write!(f, "GPU {g} has no room until a retiring worker exits")
            }
            WaitReason::GpuMemory(g) => write!(
                f,
                "GPU {g} lacks the free memory for est_gpu_mem_min plus the reserve"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start a worker in this slot.
    Spawn { slot: u32 },
    /// A slot waits: its GPU lacks room or free memory.
    Wait { slot: u32, why: WaitReason },
    /// Ask a worker to retire gracefully (TERM).
    Retire { pid: u32, why: RetireAsk },
    /// Ask a worker to exit at once (QUIT).
    Quit { pid: u32 },
    /// SIGKILL.
    Kill { pid: u32, why: KillReason },
    /// Exit the master with this status.
    Exit { code: i32, why: String },
}

/// Exit statuses of a process that never reached `main`: the shell's convention, which
/// `execve` failures and the dynamic loader follow (127: a shared library not found).
pub const EXIT_LOADER: i32 = 127;
pub const EXIT_NOT_EXECUTABLE: i32 = 126;

/// Why the first workers' failed boots end the service (exit 3), from how the last one
/// ended: a worker that never started is not a model that could not be loaded.
pub fn gave_up_booting(failures: u32, last_code: Option<i32>) -> String {
    match last_code {
        Some(EXIT_LOADER) => format!(
            "the worker could not start: after {failures} failed tries, the last ended with exit status 127, the dynamic loader's: a shared library it needs was not found (named on stderr above; usually libtorch: its lib/ folder must be readable by this user, or on LD_LIBRARY_PATH)"
        ),
        Some(EXIT_NOT_EXECUTABLE) => format!(
            "the worker could not start: after {failures} failed tries, the last could not execute the worker binary (not executable by this user)"
        ),
        _ => format!(
            "the model could not be loaded: {failures} workers failed to boot and none ever became ready (the worker's reason is logged above)"
        ),
    }
}

pub fn decide(v: &View<'_>) -> Vec<Action> {
    let mut out = Vec::new();
    if let Some(stop) = v.stopping {
        stopping(v, stop, &mut out);
        return out;
    }
    if let Some(exit) = give_up(v) {
        out.push(exit);
        return out;
    }
    deadlines(v, &mut out);
    let killed: Vec<u32> = out
        .iter()
        .filter_map(|a| match a {
            Action::Kill { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    let live = |w: &&WorkerState| !killed.contains(&w.pid);

    // Shrink.
    for w in v.workers.iter().filter(live) {
        if w.slot >= v.target && w.occupies_slot() {
            out.push(Action::Retire {
                pid: w.pid,
                why: RetireAsk::FewerWorkers,
            });
        }
    }

    // Fill, and the GPU room each spawn uses.
    let mut extra_on_gpu: Extra = Vec::new();
    let room = |gpu: u32, extra: &Extra| {
        let on_gpu = v
            .workers
            .iter()
            .filter(live)
            .filter(|w| w.gpu == Some(gpu))
            .count() as u32;
        let planned = extra.iter().find(|(g, _)| *g == gpu).map_or(0, |(_, n)| *n);
        on_gpu + planned < (v.gpu_capacity)(gpu)
    };
    fill(v, &live, &room, &mut extra_on_gpu, &mut out);
    reload(v, &live, &room, &mut extra_on_gpu, &mut out);
    out
}

/// Whether the master gives up: the first workers kept failing to boot (exit 3), or no
/// worker has been ready for `--boot-timeout` (3 before any was, else 4).
fn give_up(v: &View<'_>) -> Option<Action> {
    if !v.ever_ready && v.first_boot_failures >= FIRST_BOOT_TRIES {
        return Some(Action::Exit {
            code: exit::MODEL_LOAD,
            why: gave_up_booting(v.first_boot_failures, v.last_boot_code),
        });
    }
    let any_ready = v.workers.iter().any(|w| w.phase == Phase::Ready);
    if !any_ready && v.now.duration_since(v.last_ready_at) > v.limits.boot_timeout {
        let (code, what) = if v.ever_ready {
            (exit::GAVE_UP, "workers kept dying")
        } else {
            (exit::MODEL_LOAD, "the model could not be loaded")
        };
        return Some(Action::Exit {
            code,
            why: format!(
                "{what}: no worker has been ready for {:.0?} (--boot-timeout)",
                v.limits.boot_timeout
            ),
        });
    }
    None
}

/// Starts a worker in each empty slot below the target whose back-off is over, unless it
/// must wait: it has no GPU yet (beyond the plan), its GPU is at capacity (counting the
/// spawns decided before it, `extra`), or its GPU's free memory does not admit one.
fn fill(
    v: &View<'_>,
    live: &dyn Fn(&&WorkerState) -> bool,
    room: &dyn Fn(u32, &Extra) -> bool,
    extra_on_gpu: &mut Extra,
    out: &mut Vec<Action>,
) {
    let occupied = |slot: u32| {
        v.workers
            .iter()
            .filter(live)
            .any(|w| w.slot == slot && w.occupies_slot())
    };
    for s in v.slots.iter().filter(|s| s.id < v.target) {
        if occupied(s.id) {
            continue;
        }
        if let Some(until) = s.backoff_until {
            if v.now < until {
                continue;
            }
        }
        if s.unplaced {
            out.push(Action::Wait {
                slot: s.id,
                why: WaitReason::Unplaced,
            });
            continue;
        }
        if let Some(gpu) = s.gpu {
            if !room(gpu, extra_on_gpu) {
                out.push(Action::Wait {
                    slot: s.id,
                    why: WaitReason::GpuRoom(gpu),
                });
                continue;
            }
            if !(v.gpu_admits)(gpu) {
                out.push(Action::Wait {
                    slot: s.id,
                    why: WaitReason::GpuMemory(gpu),
                });
                continue;
            }
            bump(extra_on_gpu, gpu);
        }
        out.push(Action::Spawn { slot: s.id });
    }
}

fn bump(extra: &mut Extra, gpu: u32) {
    match extra.iter_mut().find(|(g, _)| *g == gpu) {
        Some((_, n)) => *n += 1,
        None => extra.push((gpu, 1)),
    }
}

fn stopping(v: &View<'_>, stop: Stopping, out: &mut Vec<Action>) {
    if v.workers.is_empty() {
        out.push(Action::Exit {
            code: exit::OK,
            why: "stopped".into(),
        });
        return;
    }
    let (since, wait) = match stop {
        Stopping::Graceful(t) => (t, v.limits.graceful_timeout + KILL_GRACE),
        Stopping::Quick(t) => (t, QUICK_STOP_WAIT),
    };
    for w in v.workers {
        if w.killed.is_some() {
            continue;
        }
        if v.now.duration_since(since) > wait {
            out.push(Action::Kill {
                pid: w.pid,
                why: KillReason::StopTimeout,
            });
        } else if w.asked_to_stop.is_none() {
            out.push(match stop {
                Stopping::Graceful(_) => Action::Retire {
                    pid: w.pid,
                    why: RetireAsk::Stopping,
                },
                Stopping::Quick(_) => Action::Quit { pid: w.pid },
            });
        }
    }
}

fn deadlines(v: &View<'_>, out: &mut Vec<Action>) {
    for w in v.workers {
        if w.killed.is_some() {
            continue;
        }
        let why = match w.phase {
            Phase::Booting if v.now.duration_since(w.started) > v.limits.boot_timeout => {
                Some(KillReason::BootTimeout)
            }
            Phase::Ready if v.now.duration_since(w.last_heartbeat) > v.limits.timeout => {
                Some(KillReason::Heartbeat)
            }
            _ => None,
        };
        let retiring_since = match (w.phase, w.asked_to_stop) {
            (Phase::Retiring, Some(t)) => Some(t.min(w.phase_since)),
            (Phase::Retiring, None) => Some(w.phase_since),
            (_, Some(t)) => Some(t),
            _ => None,
        };
        let why = why.or_else(|| {
            retiring_since
                .filter(|t| v.now.duration_since(*t) > v.limits.graceful_timeout + KILL_GRACE)
                .map(|_| KillReason::GracefulTimeout)
        });
        if let Some(why) = why {
            out.push(Action::Kill { pid: w.pid, why });
        }
    }
}

fn reload(
    v: &View<'_>,
    live: &dyn Fn(&&WorkerState) -> bool,
    room: &dyn Fn(u32, &Extra) -> bool,
    extra: &mut Extra,
    out: &mut Vec<Action>,
) {
    // Superseded boots stop at once.
    for w in v.workers.iter().filter(live) {
        if w.phase == Phase::Booting && w.cfg_gen < v.cfg_gen && w.occupies_slot() {
            out.push(Action::Kill {
                pid: w.pid,
                why: KillReason::Superseded,
            });
        }
    }
    let superseded = |w: &&WorkerState| {
        !out.iter()
            .any(|a| matches!(a, Action::Kill { pid, .. } if *pid == w.pid))
    };
    let current: Vec<&WorkerState> = v
        .workers
        .iter()
        .filter(live)
        .filter(superseded)
        .filter(|w| w.occupies_slot() && w.slot < v.target)
        .collect();
    // A slot with a new worker ready beside an old one: the old one retires.
    for new in current
        .iter()
        .filter(|w| w.cfg_gen == v.cfg_gen && w.phase == Phase::Ready)
    {
        for old in current
            .iter()
            .filter(|w| w.slot == new.slot && w.cfg_gen < v.cfg_gen)
        {
            out.push(Action::Retire {
                pid: old.pid,
                why: RetireAsk::ReloadReplaced,
            });
        }
    }
    if out
        .iter()
        .any(|a| matches!(a, Action::Retire { .. } | Action::Spawn { .. }))
    {
        return;
    }
    // One extra worker at most: the next slot waits until the replaced (or superseded)
    // one has exited.
    let old_leaving = out.iter().any(|a| matches!(a, Action::Kill { .. }))
        || v.workers.iter().any(|w| {
            w.cfg_gen < v.cfg_gen
                && (w.phase == Phase::Retiring || w.asked_to_stop.is_some() || w.killed.is_some())
        });
    if old_leaving {
        return;
    }
    // One slot at a time: wait while a new worker is booting beside an old one.
    let in_progress = current.iter().any(|n| {
        n.cfg_gen == v.cfg_gen
            && (n.phase == Phase::Booting
                || current
                    .iter()
                    .any(|o| o.slot == n.slot && o.cfg_gen < v.cfg_gen))
    });
    if in_progress {
        return;
    }
    let Some(old) = current
        .iter()
        .filter(|w| w.cfg_gen < v.cfg_gen && w.phase == Phase::Ready)
        .min_by_key(|w| w.slot)
    else {
        return;
    };
    // Never take the last ready worker away before its replacement is ready.
    let fits = match old.gpu {
        None => true,
        Some(g) => room(g, extra) && (v.gpu_admits)(g),
    };
    if fits {
        if let Some(g) = old.gpu {
            bump(extra, g);
        }
        out.push(Action::Spawn { slot: old.slot });
    } else {
        out.push(Action::Retire {
            pid: old.pid,
            why: RetireAsk::ReloadNoRoom,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        timeout: Duration::from_secs(30),
        boot_timeout: Duration::from_secs(300),
        graceful_timeout: Duration::from_secs(30),
    };

    struct World {
        t0: Instant,
        now: Instant,
        workers: Vec<WorkerState>,
        slots: Vec<Slot>,
        target: u32,
        cfg_gen: u64,
        stopping: Option<Stopping>,
        ever_ready: bool,
        first_boot_failures: u32,
        last_boot_code: Option<i32>,
        capacity: u32,
        admits: bool,
    }

    impl World {
        fn new(slots: u32, gpu: Option<u32>) -> World {
            let t0 = Instant::now();
            World {
                t0,
                now: t0,
                workers: vec![],
                slots: (0..slots).map(|i| Slot::new(i, gpu)).collect(),
                target: slots,
                cfg_gen: 0,
                stopping: None,
                ever_ready: true,
                first_boot_failures: 0,
                last_boot_code: None,
                capacity: 100,
                admits: true,
            }
        }
        fn at(mut self, secs: f64) -> World {
            self.now = self.t0 + Duration::from_secs_f64(secs);
            self
        }
        fn worker(mut self, pid: u32, slot: u32, phase: Phase) -> World {
            let gpu = self.slots.iter().find(|s| s.id == slot).and_then(|s| s.gpu);
            let mut w = WorkerState::new(pid, slot, 0, 0, gpu, self.t0);
            w.phase = phase;
            self.workers.push(w);
            self
        }
        fn edit(mut self, pid: u32, f: impl FnOnce(&mut WorkerState)) -> World {
            f(self.workers.iter_mut().find(|w| w.pid == pid).unwrap());
            self
        }
        fn decide(&self) -> Vec<Action> {
            let cap = self.capacity;
            let admits = self.admits;
            let capacity = move |_g: u32| cap;
            let gpu_admits = move |_g: u32| admits;
            decide(&View {
                now: self.now,
                workers: &self.workers,
                slots: &self.slots,
                target: self.target,
                cfg_gen: self.cfg_gen,
                stopping: self.stopping,
                ever_ready: self.ever_ready,
                first_boot_failures: self.first_boot_failures,
                last_boot_code: self.last_boot_code,
                last_ready_at: self.t0,
                gpu_capacity: &capacity,
                gpu_admits: &gpu_admits,
                limits: LIMITS,
            })
        }
    }

    fn spawn(slot: u32) -> Action {
        Action::Spawn { slot }
    }

    #[test]
    fn empty_slots_are_filled() {
        assert_eq!(
            World::new(3, None).decide(),
            vec![spawn(0), spawn(1), spawn(2)]
        );
        let w = World::new(2, None).worker(10, 0, Phase::Ready);
        assert_eq!(w.decide(), vec![spawn(1)]);
        let w = World::new(2, None)
            .worker(10, 0, Phase::Ready)
            .worker(11, 1, Phase::Booting);
        assert_eq!(w.decide(), vec![]);
    }

    #[test]
    fn retiring_worker_is_replaced_at_once_on_cpu() {
        let w = World::new(1, None).worker(10, 0, Phase::Retiring);
        assert_eq!(w.decide(), vec![spawn(0)]);
    }

    #[test]
    fn retiring_worker_on_a_full_gpu_is_replaced_only_after_it_exits() {
        let mut w = World::new(2, Some(0))
            .worker(10, 0, Phase::Retiring)
            .worker(11, 1, Phase::Ready);
        w.capacity = 2;
        assert_eq!(
            w.decide(),
            vec![Action::Wait {
                slot: 0,
                why: WaitReason::GpuRoom(0)
            }]
        );
        w.capacity = 3;
        assert_eq!(w.decide(), vec![spawn(0)]);
    }

    #[test]
    fn gpu_capacity_limits_simultaneous_spawns() {
        let mut w = World::new(3, Some(0));
        w.capacity = 2;
        let a = w.decide();
        assert_eq!(&a[..2], &[spawn(0), spawn(1)]);
        assert!(matches!(a[2], Action::Wait { slot: 2, .. }));
    }

    #[test]
    fn admission_waits_for_free_memory() {
        let mut w = World::new(1, Some(0));
        w.admits = false;
        match &w.decide()[..] {
            [Action::Wait { slot: 0, why }] => {
                assert_eq!(*why, WaitReason::GpuMemory(0));
                assert!(why.to_string().contains("est_gpu_mem_min"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unplaced_slots_wait() {
        let mut w = World::new(2, Some(0)).worker(10, 0, Phase::Ready);
        w.slots[1].unplaced = true;
        assert_eq!(
            w.decide(),
            vec![Action::Wait {
                slot: 1,
                why: WaitReason::Unplaced
            }]
        );
    }

    #[test]
    fn backoff_delays_the_next_try() {
        let mut w = World::new(1, None);
        let t0 = w.t0;
        w.slots[0].failed(t0);
        assert_eq!(w.at(0.05).decide(), vec![]);
        let mut w = World::new(1, None);
        w.slots[0].failed(t0);
        assert_eq!(w.at(0.2).decide(), vec![spawn(0)]);
    }

    #[test]
    fn deadlines_kill_stuck_workers() {
        let w = World::new(3, None)
            .worker(10, 0, Phase::Booting)
            .worker(11, 1, Phase::Ready)
            .worker(12, 2, Phase::Retiring)
            .at(301.0)
            .edit(11, |w| {
                w.last_heartbeat = w.started + Duration::from_secs(300)
            })
            .edit(12, |w| w.phase_since = w.started + Duration::from_secs(200));
        let a = w.decide();
        assert!(a.contains(&Action::Kill {
            pid: 10,
            why: KillReason::BootTimeout
        }));
        assert!(a.contains(&Action::Kill {
            pid: 12,
            why: KillReason::GracefulTimeout
        }));
        assert!(!a.iter().any(|x| matches!(x, Action::Kill { pid: 11, .. })));
        // the killed boot is replaced in the same round
        assert!(a.contains(&spawn(0)));
        let w = World::new(1, None).worker(11, 0, Phase::Ready).at(31.0);
        assert!(w.decide().contains(&Action::Kill {
            pid: 11,
            why: KillReason::Heartbeat
        }));
    }

    #[test]
    fn shrinking_retires_workers_beyond_the_target() {
        let mut w = World::new(2, None)
            .worker(10, 0, Phase::Ready)
            .worker(11, 1, Phase::Ready);
        w.target = 1;
        assert_eq!(
            w.decide(),
            vec![Action::Retire {
                pid: 11,
                why: RetireAsk::FewerWorkers
            }]
        );
    }

    #[test]
    fn first_boot_failures_exit_3() {
        let mut w = World::new(2, None);
        w.ever_ready = false;
        w.first_boot_failures = FIRST_BOOT_TRIES - 1;
        assert_eq!(w.decide(), vec![spawn(0), spawn(1)]);
        w.first_boot_failures = FIRST_BOOT_TRIES;
        assert!(matches!(w.decide()[..], [Action::Exit { code: 3, .. }]));
        // A worker that never started is named as such, not as the model.
        w.last_boot_code = Some(127);
        match &w.decide()[..] {
            [Action::Exit { code: 3, why }] => {
                assert!(why.starts_with("the worker could not start"), "{why}");
                assert!(
                    why.contains("a shared library it needs was not found"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(gave_up_booting(3, Some(3)).starts_with("the model could not be loaded"));
        assert!(gave_up_booting(3, Some(126)).contains("not executable"));
    }

    #[test]
    fn no_ready_worker_for_boot_timeout_gives_up() {
        let w = World::new(1, None).worker(10, 0, Phase::Booting).at(299.0);
        assert_eq!(w.decide(), vec![]);
        let w = World::new(1, None).at(301.0);
        assert!(matches!(w.decide()[..], [Action::Exit { code: 4, .. }]));
        let mut w = World::new(1, None).at(301.0);
        w.ever_ready = false;
        assert!(matches!(w.decide()[..], [Action::Exit { code: 3, .. }]));
        let w = World::new(1, None)
            .worker(10, 0, Phase::Ready)
            .at(301.0)
            .edit(10, |w| {
                w.last_heartbeat = w.started + Duration::from_secs(300)
            });
        assert!(!w.decide().iter().any(|a| matches!(a, Action::Exit { .. })));
    }

    #[test]
    fn graceful_stop_asks_once_then_kills_then_exits() {
        let mut w = World::new(2, None)
            .worker(10, 0, Phase::Ready)
            .worker(11, 1, Phase::Retiring);
        w.stopping = Some(Stopping::Graceful(w.t0));
        assert_eq!(
            w.decide(),
            vec![
                Action::Retire {
                    pid: 10,
                    why: RetireAsk::Stopping
                },
                Action::Retire {
                    pid: 11,
                    why: RetireAsk::Stopping
                }
            ]
        );
        let t0 = w.t0;
        let w = w
            .edit(10, |w| w.asked_to_stop = Some(t0))
            .edit(11, |w| w.asked_to_stop = Some(t0));
        assert_eq!(w.decide(), vec![]);
        let w = w.at(32.0);
        assert_eq!(w.decide().len(), 2);
        assert!(w.decide().iter().all(|a| matches!(a, Action::Kill { .. })));
        let mut w = World::new(2, None);
        w.stopping = Some(Stopping::Graceful(w.t0));
        assert!(matches!(w.decide()[..], [Action::Exit { code: 0, .. }]));
    }

    #[test]
    fn quick_stop_quits_and_does_not_refill() {
        let mut w = World::new(2, None).worker(10, 0, Phase::Ready);
        w.stopping = Some(Stopping::Quick(w.t0));
        assert_eq!(w.decide(), vec![Action::Quit { pid: 10 }]);
        let w = w.at(3.0);
        assert!(matches!(w.decide()[..], [Action::Kill { pid: 10, .. }]));
    }

    #[test]
    fn reload_replaces_one_slot_at_a_time_start_then_stop() {
        let mut w = World::new(2, None)
            .worker(10, 0, Phase::Ready)
            .worker(11, 1, Phase::Ready);
        w.cfg_gen = 1;
        assert_eq!(w.decide(), vec![spawn(0)]);
        // new worker for slot 0 booting: wait
        let mut nw = WorkerState::new(20, 0, 1, 1, None, w.t0);
        w.workers.push(nw.clone());
        assert_eq!(w.decide(), vec![]);
        // new worker ready: the old one retires
        nw.phase = Phase::Ready;
        w.workers.pop();
        w.workers.push(nw);
        assert_eq!(
            w.decide(),
            vec![Action::Retire {
                pid: 10,
                why: RetireAsk::ReloadReplaced
            }]
        );
        // old one retiring: slot 1 is next once it has exited
        let mut w = w.edit(10, |w| w.phase = Phase::Retiring);
        assert_eq!(w.decide(), vec![]);
        w.workers.retain(|x| x.pid != 10);
        assert_eq!(w.decide(), vec![spawn(1)]);
    }

    #[test]
    fn reload_waits_for_the_replaced_worker_to_exit_before_the_next_slot() {
        let mut w = World::new(2, None)
            .worker(10, 0, Phase::Retiring)
            .worker(11, 1, Phase::Ready);
        w.cfg_gen = 1;
        let mut new0 = WorkerState::new(20, 0, 1, 1, None, w.t0);
        new0.phase = Phase::Ready;
        w.workers.push(new0);
        // The replaced worker of slot 0 is still finishing: slot 1 waits.
        assert_eq!(w.decide(), vec![]);
        w.workers.retain(|x| x.pid != 10);
        assert_eq!(w.decide(), vec![spawn(1)]);
    }

    #[test]
    fn a_newer_reload_stops_the_boots_of_the_one_it_supersedes() {
        let mut w = World::new(2, None)
            .worker(10, 0, Phase::Ready)
            .worker(11, 1, Phase::Ready);
        // Generation 1 was booting beside slot 0's old worker when generation 2 came.
        w.workers.push(WorkerState::new(20, 0, 1, 1, None, w.t0));
        w.cfg_gen = 2;
        assert_eq!(
            w.decide(),
            vec![Action::Kill {
                pid: 20,
                why: KillReason::Superseded
            }]
        );
        // Once it is gone, the reload goes on with the newest configuration.
        let w = w.edit(20, |w| w.killed = Some(KillReason::Superseded));
        assert_eq!(w.decide(), vec![]);
        let mut w = w;
        w.workers.retain(|x| x.pid != 20);
        assert_eq!(w.decide(), vec![spawn(0)]);
        // A ready worker of the superseded configuration is just old: it is replaced in
        // turn, not killed.
        let mut w = World::new(1, None);
        let mut mid = WorkerState::new(30, 0, 1, 1, None, w.t0);
        mid.phase = Phase::Ready;
        w.workers.push(mid);
        w.cfg_gen = 2;
        assert_eq!(w.decide(), vec![spawn(0)]);
    }

    #[test]
    fn reload_on_a_full_gpu_stops_then_starts() {
        let mut w = World::new(2, Some(0))
            .worker(10, 0, Phase::Ready)
            .worker(11, 1, Phase::Ready);
        w.capacity = 2;
        w.cfg_gen = 1;
        assert_eq!(
            w.decide(),
            vec![Action::Retire {
                pid: 10,
                why: RetireAsk::ReloadNoRoom
            }]
        );
    }
}
