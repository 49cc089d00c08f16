//! The master's side of the kernel's OOM killer: workers are its first choice, and their
//! deaths by it are told apart from other SIGKILLs.
//!
//! **Who is taken first**: the kernel kills the process with the highest badness — its
//! memory (RSS, which for a forked worker counts the template's shared weights in full, so
//! every worker, the template and its spare look alike) plus `oom_score_adj` thousandths
//! of the machine's (or the cgroup's) memory. Each worker sets its own `oom_score_adj`
//! ([`worker_score_adj`]: the master's plus [`WORKER_ABOVE`], at most 1000) as it starts,
//! so the OOM killer takes a worker — which the master replaces — before the master or the
//! template, which keep theirs. Raising one's own score needs no privilege.
//!
//! **Telling an OOM kill apart** ([`OomCounter`]): the kernel raises its `oom_kill` count
//! (the cgroup's, `master::resources::host_memory`; else the whole machine's in
//! `/proc/vmstat`) before it sends the SIGKILL, so a worker reaped after a SIGKILL nobody
//! here sent, while the count is above what was accounted for, was taken by the OOM killer.

use std::path::Path;

use super::resources::host_memory::{read, stat_field, Cgroup};

/// How far above the master's `oom_score_adj` its workers set theirs.
pub const WORKER_ABOVE: i32 = 500;

/// The `oom_score_adj` workers take: the master's own + [`WORKER_ABOVE`], at most 1000;
/// `None` when that is not above the master's (the master is at 1000 already) or it cannot
/// be read.
pub fn worker_score_adj() -> Option<i32> {
    let own: i32 = read(Path::new("/proc/self/oom_score_adj"))?
        .trim()
        .parse()
        .ok()?;
    worker_score_over(own)
}

/// [`worker_score_adj`] for a master at `own` (pure).
pub fn worker_score_over(own: i32) -> Option<i32> {
    Some(own.saturating_add(WORKER_ABOVE).min(1000)).filter(|w| *w > own)
}

/// Says, once at start, the `oom_score_adj` workers take beside the master's.
pub fn say_scores() {
    let Some(master) =
        read(Path::new("/proc/self/oom_score_adj")).and_then(|s| s.trim().parse::<i32>().ok())
    else {
        return;
    };
    match worker_score_over(master) {
        Some(workers) => tracing::info!(
            event = "oom_score_adj",
            master,
            workers,
            "workers take oom_score_adj {workers} (the master and the template keep {master}): under memory pressure the kernel's OOM killer takes a worker first"
        ),
        None => tracing::warn!(
            event = "oom_score_adj",
            master,
            "the master's oom_score_adj is {master} already: workers cannot be made likelier OOM victims than the master and the template"
        ),
    }
}

/// Tells a worker's SIGKILL by the OOM killer from others: the kernel raises its `oom_kill`
/// count before it sends the signal, so a count above what was accounted for when a
/// worker is reaped after a SIGKILL nobody here sent means the OOM killer took it.
#[derive(Debug)]
pub struct OomCounter {
    cgroup: Option<Cgroup>,
    /// Kills accounted for (counted at the start, and each one attributed since).
    seen: Option<u64>,
}

impl OomCounter {
    /// Starts counting from now.
    pub fn new(cgroup: Option<Cgroup>) -> OomCounter {
        let mut c = OomCounter { cgroup, seen: None };
        c.seen = c.read();
        c
    }

    /// Where the count is read (for messages).
    pub fn source(&self) -> String {
        match &self.cgroup {
            Some(c) if c.oom_kills().is_some() => c
                .file("memory.oom_control", "memory.events")
                .display()
                .to_string(),
            _ => "/proc/vmstat".into(),
        }
    }

    fn read(&self) -> Option<u64> {
        self.cgroup
            .as_ref()
            .and_then(Cgroup::oom_kills)
            .or_else(|| read(Path::new("/proc/vmstat")).and_then(|s| stat_field(&s, "oom_kill")))
    }

    /// A process of the server was SIGKILLed by nobody here: whether the OOM killer did
    /// (one kill of the count is attributed to it).
    pub fn took_one(&mut self) -> bool {
        let Some(now) = self.read() else {
            return false;
        };
        match self.seen {
            Some(seen) if now > seen => {
                self.seen = Some(seen + 1);
                true
            }
            Some(_) => false,
            None => {
                self.seen = Some(now);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_score_above_the_master_up_to_1000() {
        assert_eq!(worker_score_over(0), Some(500));
        assert_eq!(worker_score_over(-900), Some(-400));
        assert_eq!(worker_score_over(700), Some(1000));
        assert_eq!(worker_score_over(1000), None, "nothing is above 1000");
    }

    #[test]
    fn an_oom_kill_is_attributed_once_per_count() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("memory.max"), "max\n").unwrap();
        std::fs::write(d.path().join("memory.events"), "oom_kill 1\n").unwrap();
        let c = Cgroup::given(d.path()).unwrap();
        let mut oom = OomCounter::new(Some(c));
        // The kill counted before the start is not ours.
        assert!(!oom.took_one());
        std::fs::write(d.path().join("memory.events"), "oom_kill 3\n").unwrap();
        assert!(oom.took_one());
        assert!(oom.took_one());
        assert!(!oom.took_one(), "two kills, two workers");
        assert!(oom.source().ends_with("memory.events"));
    }
}
