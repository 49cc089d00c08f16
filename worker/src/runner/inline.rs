//! Small CPU passes on the event loop's own thread (`--inline-passes auto`).
//!
//! For a pass of tens of microseconds the hop to the model thread and back (a futex wake
//! one way, an eventfd wake the other, two threads taking turns on the cores) costs more
//! than the pass: measured on the MLP (2 workers × 1 torch thread, c = 4, builds
//! alternating) served 1.25× the requests per second with the pass run where the request
//! was parsed. A dedicated model thread is what keeps the event loop free during a pass —
//! deadlines and `--request-timeout` answered, heartbeats sent — so a pass runs here only
//! where that costs nothing measurable:
//!
//! - the model runs on the CPU with one intra-op thread (`--torch-threads 1`; more would
//!   start a second OpenMP team on this thread) and without batching;
//! - the model thread is idle and nothing is queued for it (the pass lock, held by the model
//!   thread around each of its passes, is free: one pass at a time, in either place);
//! - the last [`STREAK`] passes each took under [`INLINE_MAX`] of their thread's CPU time
//!   ([`thread_cpu`]), and this input is no larger than the largest of those (a larger
//!   input goes to the model thread, and teaches the rule its size if it is fast there);
//! - no pass run here has ever taken [`OFF_AFTER`] or more: the first that does turns this
//!   off for the worker's life (a model whose pass time depends on its input's values, not
//!   its size, blocks the event loop that long once, not again); one over [`INLINE_MAX`]
//!   only ends the streak, as on the model thread (a pass of 0.2 ms now and then takes
//!   1.1 ms of CPU, page faults and all).
//!
//! A pass run here that gets stuck is still bounded: [`Inline::running_for`] tells the
//! worker's watchdog (`crate::watchdog`) how long it has run, and the watchdog sends the
//! heartbeats the blocked event loop cannot, and at `--request-timeout` retires the worker as
//! a stuck pass on the model thread would (its client's connection closes without the 504).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use tch::Device;

use crate::model::Model;

use super::{forward, guarded, Encoding, RunError, RunOutput};
use crate::args::{Arg, Inputs};

/// A pass under this is small enough to run on the event loop.
pub const INLINE_MAX: Duration = Duration::from_millis(1);

/// Consecutive passes under [`INLINE_MAX`] before one runs on the event loop.
pub const STREAK: u32 = 8;

/// A pass run on the event loop that takes this long turns running there off for good.
pub const OFF_AFTER: Duration = Duration::from_millis(100);

/// What decides whether the next pass may run on the event loop: the recent passes' times
/// and sizes (see the module's doc).
#[derive(Debug, Default)]
pub struct Policy {
    /// Consecutive passes under [`INLINE_MAX`], up to [`STREAK`].
    streak: u32,
    /// The largest input (in elements) among the passes of the streak.
    largest_fast: usize,
    /// A pass run on the event loop took [`OFF_AFTER`] or more: never again.
    off: bool,
}

impl Policy {
    /// Whether an input of `size` elements may run on the event loop now.
    pub fn allows(&self, size: usize) -> bool {
        !self.off && self.streak >= STREAK && size <= self.largest_fast
    }

    /// Takes a pass's time into account; `true` when this pass, run on the event loop,
    /// turned running there off.
    pub fn record(&mut self, size: usize, took: Duration, here: bool) -> bool {
        if took < INLINE_MAX {
            self.streak = (self.streak + 1).min(STREAK);
            self.largest_fast = self.largest_fast.max(size);
            return false;
        }
        self.streak = 0;
        self.largest_fast = 0;
        let turned_off = here && took >= OFF_AFTER && !self.off;
        self.off |= turned_off;
        turned_off
    }
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`). What [`Policy`] is told of a
/// pass: its wall-clock time would count the moments the thread was not running (on two
/// cores shared by two workers and their clients, a 20 µs pass is now and then preempted
/// for milliseconds, which turned passes on the event loop off within seconds), and the
/// watchdog bounds the wall-clock time anyway.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to write.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// An input's size for [`Policy`]: its tensors' elements, its strings' and blobs' bytes.
pub fn size(input: &Inputs) -> usize {
    input
        .args
        .iter()
        .map(|a| match a {
            Arg::Tensor(t) | Arg::Padded { tensor: t, .. } => t.numel(),
            Arg::Strings(v) => v.iter().map(String::len).sum(),
            Arg::Blobs(v) => v.iter().map(Vec::len).sum(),
        })
        .sum()
}

/// The model, shared by the model thread and (for small passes) the event loop.
pub struct Inline {
    module: Model,
    device: Device,
    /// Whether passes may ever run on the event loop (CPU, one intra-op thread, asked for).
    enabled: bool,
    /// Held for every pass, wherever it runs; guards the policy too.
    pass: Mutex<Policy>,
    /// When the pass now running on the event loop started, in µs since `epoch`; 0: none.
    running_since: AtomicU64,
    epoch: Instant,
}

impl Inline {
    pub(super) fn new(module: Model, device: Device, threads: usize, asked: bool) -> Arc<Inline> {
        Arc::new(Inline {
            module,
            device,
            enabled: asked && device == Device::Cpu && threads == 1,
            pass: Mutex::new(Policy::default()),
            running_since: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    pub(super) fn module(&self) -> &Model {
        &self.module
    }

    /// Whether passes may run on the event loop at all (otherwise the runner never asks, and
    /// the model thread's passes need not be timed).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The pass lock, for a pass on the model thread.
    pub(super) fn hold(&self) -> MutexGuard<'_, Policy> {
        self.pass.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` here and now when the rule allows an input of `size` and the model is idle;
    /// `None`: it did not run (submit it to the model thread).
    pub(super) fn run<T>(&self, size: usize, f: impl FnOnce(&Model, Device) -> T) -> Option<T> {
        let mut policy = match self.pass.try_lock() {
            Ok(p) => p,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        if !policy.allows(size) {
            return None;
        }
        // This thread's own intra-op setting (libtorch keeps it per thread; see
        // `crate::process`): one thread, as on the model thread.
        crate::process::one_intra_thread_here();
        let since = self.epoch.elapsed().as_micros() as u64;
        self.running_since.store(since.max(1), Ordering::Release);
        let cpu = thread_cpu();
        let out = f(&self.module, self.device);
        let took = thread_cpu().saturating_sub(cpu);
        self.running_since.store(0, Ordering::Release);
        if policy.record(size, took, true) {
            tracing::warn!(
                event = "inline_passes_off",
                ms = took.as_secs_f64() * 1e3,
                limit_ms = OFF_AFTER.as_secs_f64() * 1e3,
                "a forward pass run on the event loop took {:.3} ms of CPU (over {} ms): from \
                 now on every pass of this worker runs on its model thread",
                took.as_secs_f64() * 1e3,
                OFF_AFTER.as_millis()
            );
        }
        Some(out)
    }

    /// How long the pass now running on the event loop has run; `None`: none is.
    pub fn running_for(&self) -> Option<Duration> {
        let since = self.running_since.load(Ordering::Acquire);
        (since != 0).then(|| {
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_micros(since))
        })
    }
}

impl super::Runner {
    /// Runs `input` here and now, on the caller's thread (the event loop), when the rule of
    /// `inline.rs` allows it, nothing is queued and the model thread is idle; `None`: submit
    /// it.
    pub fn try_inline(
        &self,
        input: &Inputs,
        encoding: &Encoding,
    ) -> Option<Result<RunOutput, RunError>> {
        let inline = self.inline.as_ref()?;
        if self.queued.get() > 0 {
            return None;
        }
        let run = inline.run(size(input), |module, device| {
            guarded(|| forward(module, device, input, encoding))
        })?;
        Some(run.map(|out| RunOutput {
            inline: true,
            ..out
        }))
    }

    /// Whether passes may ever run on the caller's thread (the event loop).
    pub fn inlines(&self) -> bool {
        self.inline.is_some()
    }

    /// The model as the event loop may run it, when it may (for the watchdog).
    pub fn inline(&self) -> Option<Arc<Inline>> {
        self.inline.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_micros(50);
    const SLOW: Duration = Duration::from_millis(2);

    /// A streak of fast passes of `size` on the model thread.
    fn streak(p: &mut Policy, size: usize) {
        for _ in 0..STREAK {
            p.record(size, FAST, false);
        }
    }

    #[test]
    fn only_after_a_streak_of_fast_passes_and_no_larger_than_they_were() {
        let mut p = Policy::default();
        for i in 0..STREAK {
            assert!(!p.allows(64), "after {i} fast passes");
            assert!(!p.record(64, FAST, false));
        }
        assert!(p.allows(64));
        assert!(p.allows(1));
        assert!(
            !p.allows(65),
            "a larger input than any fast one goes to the model thread"
        );
        // Fast on the model thread at 512: now allowed up to 512.
        p.record(512, FAST, false);
        assert!(p.allows(512));
    }

    #[test]
    fn a_slow_pass_on_the_model_thread_restarts_the_streak() {
        let mut p = Policy::default();
        streak(&mut p, 64);
        assert!(
            !p.record(64, SLOW, false),
            "not run here: nothing turned off"
        );
        assert!(!p.allows(64));
        for _ in 0..STREAK - 1 {
            p.record(8, FAST, false);
        }
        assert!(!p.allows(8));
        p.record(8, FAST, false);
        assert!(p.allows(8));
        assert!(!p.allows(64), "the old streak's sizes are forgotten");
    }

    #[test]
    fn a_slow_pass_run_here_ends_the_streak_and_a_very_slow_one_turns_it_off_for_good() {
        let mut p = Policy::default();
        streak(&mut p, 64);
        assert!(
            !p.record(64, SLOW, true),
            "over 1 ms: the streak ends, no more"
        );
        assert!(!p.allows(64));
        streak(&mut p, 64);
        assert!(p.allows(64), "a new streak");
        let under = OFF_AFTER - Duration::from_micros(1);
        assert!(!p.record(64, under, true), "just under the bound");
        streak(&mut p, 64);
        assert!(
            p.record(64, OFF_AFTER, true),
            "the first very slow pass here turns it off"
        );
        for _ in 0..3 * STREAK {
            p.record(64, FAST, false);
        }
        assert!(!p.allows(64));
        assert!(!p.record(64, OFF_AFTER, true), "turned off once only");
    }

    #[test]
    fn the_limit_itself_is_slow() {
        let mut p = Policy::default();
        for _ in 0..STREAK {
            p.record(1, INLINE_MAX, false);
        }
        assert!(!p.allows(1));
    }

    #[test]
    fn thread_cpu_time_counts_work_not_waiting() {
        let before = thread_cpu();
        std::thread::sleep(Duration::from_millis(30));
        let slept = thread_cpu() - before;
        let before = thread_cpu();
        let mut x = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let worked = thread_cpu() - before;
        assert!(worked > slept, "worked {worked:?}, slept {slept:?}");
        assert!(slept < Duration::from_millis(30), "{slept:?}");
    }

    #[test]
    fn sizes_count_elements_and_bytes() {
        let t = tch::Tensor::zeros([3, 64], (tch::Kind::Float, Device::Cpu));
        let input = Inputs {
            args: vec![
                Arg::Tensor(t),
                Arg::Strings(vec!["abc".into(), "de".into()]),
                Arg::Blobs(vec![vec![0; 10]]),
            ],
        };
        assert_eq!(size(&input), 192 + 5 + 10);
    }
}
