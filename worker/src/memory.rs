//! The worker's host memory (`vramfork::own_memory` reads the figures): what it reports
//! when ready, the template's measurement of its warm-up passes' peak (what one more
//! forked worker's passes will cost: the plan's host-memory bound), its own memory between
//! exact readings ([`OwnMemory`]: the heartbeat's figure and the `--max-worker-memory-mb`
//! check after a request), and the `oom_score_adj` that makes the
//! kernel's OOM killer take a worker before the master or the template.

use vramfork::own_memory;
use vramfork::protocol::{PassesPeak, ReadyMemory};

/// This process's own memory and resident set now, for its `Ready` message.
pub fn at_ready() -> Option<ReadyMemory> {
    let r = own_memory::rollup(None)?;
    Some(ReadyMemory {
        own: r.own(),
        rss: r.rss,
        pass_peak: None,
    })
}

/// Measures how far some passes take the resident set: the peak is reset before them
/// (`own_memory::reset_peak`) and read after. Every page a pass touches for the first time
/// is one this process writes (activations, scratch), so the rise of the resident set's
/// peak is what the passes need at most beyond what was already mapped — what a worker
/// forked after them writes again, as its own, on its first pass.
pub struct PassPeak {
    before: Option<u64>,
}

impl PassPeak {
    pub fn start() -> PassPeak {
        let before = own_memory::reset_peak()
            .then(|| own_memory::resident(None))
            .flatten();
        PassPeak { before }
    }

    /// The figures after the passes.
    pub fn finish(self) -> Option<ReadyMemory> {
        let mut m = at_ready()?;
        m.pass_peak = match (self.before, own_memory::peak_resident()) {
            (Some(before), Some(peak)) => Some(peak.saturating_sub(before)),
            _ => None,
        };
        Some(m)
    }
}

/// How far this worker's passes take its resident set once it serves (the master bounds
/// the pool by it when nothing measured a pass at start: no declared input shape, or
/// workers started without a template): its resident set's peak (`VmHWM`: since its start
/// when exec'd, so its load counts too; since [`forked`] when forked) above the resident
/// set it had when ready, read once a pass has answered a request.
#[derive(Default)]
pub struct ServingPeak {
    /// Its own memory and resident set when ready, bytes.
    at_ready: std::sync::Mutex<Option<(u64, u64)>>,
    passed: std::sync::atomic::AtomicBool,
}

impl ServingPeak {
    /// The worker is ready with `own` bytes of its own: measured from here. Returns how far
    /// its resident set's peak is above its resident set now (its load and warm-up).
    pub fn start(&self, own: Option<u64>) -> Option<u64> {
        let resident = own_memory::resident(None);
        *self.at_ready.lock().unwrap_or_else(|p| p.into_inner()) = own.zip(resident);
        Some(own_memory::peak_resident()?.saturating_sub(resident?))
    }

    /// A pass answered a request.
    pub fn passed(&self) {
        self.passed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The figures once a pass has answered (`None` before, or when unreadable).
    pub fn read(&self) -> Option<PassesPeak> {
        if !self.passed.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let (own_at_ready, resident) = (*self.at_ready.lock().unwrap_or_else(|p| p.into_inner()))?;
        let rise = own_memory::peak_resident()?.saturating_sub(resident);
        Some(PassesPeak { own_at_ready, rise })
    }
}

/// In a worker the template forked: its resident set's peak was the template's (the
/// kernel copies it at fork); from here it is this worker's own (hwFetch's CPU figure, and
/// [`ServingPeak`]).
pub fn forked() {
    own_memory::reset_peak();
}

/// This worker's own memory between exact readings: `smaps_rollup` (0.9 ms) is read by the
/// heartbeat and when a cheap estimate — the last exact figure plus the anonymous memory
/// `statm` shows gained since — passes the limit. New pages (a leak, activations) show in
/// `statm` at once; copies of pages shared with the template do not, and are seen at the
/// next heartbeat's reading.
#[derive(Default)]
pub struct OwnMemory {
    /// The last exact figure and the anonymous resident memory at that moment, bytes.
    last: std::sync::Mutex<Option<(u64, u64)>>,
}

impl OwnMemory {
    /// Reads the exact figure now (and remembers it).
    pub fn read(&self) -> Option<u64> {
        let anon = own_memory::resident_and_anon(None).map(|(_, a)| a)?;
        let own = own_memory::own(None)?;
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((own, anon));
        Some(own)
    }

    /// After a request: this worker's own memory when it is past `limit` bytes.
    pub fn over(&self, limit: u64) -> Option<u64> {
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some((own, anon_then)), Some((_, anon))) =
            (last, own_memory::resident_and_anon(None))
        {
            if own + anon.saturating_sub(anon_then) <= limit {
                return None;
            }
        }
        self.read().filter(|own| *own > limit)
    }
}

/// Sets this process's `oom_score_adj` (raising it needs no privilege). A failure is said
/// once, and serving goes on.
pub fn set_oom_score_adj(value: Option<i32>) {
    let Some(v) = value else {
        return;
    };
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", v.to_string()) {
        tracing::warn!("cannot set oom_score_adj to {v}: {e}; the OOM killer may take the master or the template before this worker");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_that_writes_64_mb_shows_in_the_peak() {
        let probe = PassPeak::start();
        let v = vec![7u8; 64 << 20];
        std::hint::black_box(&v);
        drop(v);
        let m = probe.finish().unwrap();
        let peak = m.pass_peak.expect("the kernel resets VmHWM (Linux 4.0+)");
        assert!(peak >= 60 << 20, "{peak}");
        assert!(m.own > 0 && m.rss >= m.own);
        let own = OwnMemory::default();
        assert_eq!(own.over(u64::MAX), None);
        let now = own.over(1).expect("above 1 byte");
        // 32 MB more of fresh memory shows without a new exact reading being needed to see it.
        let v = vec![3u8; 32 << 20];
        std::hint::black_box(&v);
        assert!(own.over(now + (16 << 20)).is_some());
    }
}
