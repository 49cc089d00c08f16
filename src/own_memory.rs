//! A process's **own** host memory: what it alone holds, the figure `--max-worker-memory-mb`
//! recycles by, the host-memory bound plans with and `/metrics` shows per worker — shared by
//! the worker (which reads its own) and the master (which reads its workers' at scrape time).
//!
//! The figure is `/proc/<pid>/smaps_rollup`'s `Private_Dirty` plus `SwapPss`: the pages only
//! this process maps and has written (its heap, its activations, its copies of the
//! template's pages it wrote to), and its share of what of it went to swap. Why not the
//! others:
//!
//! - RSS counts every page the process maps: a worker forked from the template maps the
//!   model's weights, so each would look as large as the model (5 forked workers of the
//!   small MLP take 369 MB of PSS together against 365 MB for one: counting RSS would be
//!   wrong the other way).
//! - PSS divides a shared page between the processes that map it: a worker's figure would
//!   then fall when a sibling starts and rise when one exits, and with one worker and its
//!   template half of the weights would count as the worker's.
//! - `Private_Clean` is mostly file pages only this process maps (libtorch's code in a
//!   worker that was exec'd alone): page cache the kernel takes back under pressure, not
//!   what a leak grows; left out.
//!
//! Reading `smaps_rollup` walks the process's page tables (0.9 ms for a worker forked from
//! the template of the small MLP); `statm` ([`resident_and_anon`]) takes microseconds and
//! shows new anonymous pages (a leak) but not copies of pages shared with the template.

use std::path::Path;

/// The figures of `smaps_rollup` this module reads, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rollup {
    pub rss: u64,
    pub pss: u64,
    pub private_clean: u64,
    pub private_dirty: u64,
    pub swap_pss: u64,
}

impl Rollup {
    /// What the process alone holds: `Private_Dirty + SwapPss`.
    pub fn own(&self) -> u64 {
        self.private_dirty + self.swap_pss
    }
}

/// Parses `smaps_rollup`'s text (`Key:   1234 kB` lines).
pub fn parse_rollup(text: &str) -> Option<Rollup> {
    let mut r = Rollup::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let field = match key {
            "Rss" => &mut r.rss,
            "Pss" => &mut r.pss,
            "Private_Clean" => &mut r.private_clean,
            "Private_Dirty" => &mut r.private_dirty,
            "SwapPss" => &mut r.swap_pss,
            _ => continue,
        };
        let mut parts = rest.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        if parts.next() != Some("kB") {
            return None;
        }
        *field = n * 1024;
        seen += 1;
    }
    // SwapPss is missing on kernels without swap accounting; the others are always there.
    (seen >= 4).then_some(r)
}

/// The rollup of process `pid` (`None`: this process).
pub fn rollup(pid: Option<u32>) -> Option<Rollup> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/smaps_rollup"),
        None => "/proc/self/smaps_rollup".to_string(),
    };
    parse_rollup(&std::fs::read_to_string(Path::new(&path)).ok()?)
}

/// This process's own memory in bytes ([`Rollup::own`]).
pub fn own(pid: Option<u32>) -> Option<u64> {
    rollup(pid).map(|r| r.own())
}

/// The resident set size and its anonymous part (resident − file − shmem) of process `pid`
/// (`None`: this process), from `statm` (a read of a few microseconds), in bytes.
pub fn resident_and_anon(pid: Option<u32>) -> Option<(u64, u64)> {
    let statm = match pid {
        Some(p) => std::fs::read_to_string(format!("/proc/{p}/statm")),
        None => std::fs::read_to_string("/proc/self/statm"),
    }
    .ok()?;
    let mut f = statm.split_whitespace().skip(1);
    let resident: u64 = f.next()?.parse().ok()?;
    let shared: u64 = f.next()?.parse().ok()?;
    let page = page_size();
    Some((resident * page, resident.saturating_sub(shared) * page))
}

/// The resident set size of process `pid` (`None`: this process), from `statm`, in bytes.
pub fn resident(pid: Option<u32>) -> Option<u64> {
    resident_and_anon(pid).map(|(r, _)| r)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).unwrap_or(4096)
}

/// Resets this process's peak resident set size (`VmHWM`) to its resident set size now
/// (`/proc/self/clear_refs` ← `5`, Linux 4.0+), so that [`peak_resident`] after a pass tells
/// how far the pass took it. `false` when the kernel refused.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's peak resident set size (`VmHWM`), in bytes.
pub fn peak_resident() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    crate::hwline::parse_vm_hwm(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLLUP: &str =
        "556944186000-7ffdaf8fe000 ---p 00000000 00:00 0                          [rollup]
Rss:              409600 kB
Pss:              120000 kB
Pss_Dirty:         90000 kB
Shared_Clean:     300000 kB
Shared_Dirty:      20000 kB
Private_Clean:     10000 kB
Private_Dirty:     79600 kB
Anonymous:        350000 kB
Swap:                 10 kB
SwapPss:               4 kB
";

    #[test]
    fn the_own_figure_is_private_dirty_plus_the_swap_share() {
        let r = parse_rollup(ROLLUP).unwrap();
        assert_eq!(r.rss, 409_600 * 1024);
        assert_eq!(r.private_clean, 10_000 * 1024);
        assert_eq!(r.own(), (79_600 + 4) * 1024);
        // Without SwapPss (no swap accounting) the rest still reads.
        let no_swap: String = ROLLUP
            .lines()
            .filter(|l| !l.starts_with("SwapPss"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(parse_rollup(&no_swap).unwrap().own(), 79_600 * 1024);
        assert_eq!(parse_rollup("Rss: 12 MB\n"), None);
        assert_eq!(parse_rollup(""), None);
    }

    #[test]
    fn this_process_has_an_own_figure_below_its_resident_set() {
        let r = rollup(None).expect("smaps_rollup (Linux 4.14+)");
        assert!(r.own() > 0 && r.own() <= r.rss, "{r:?}");
        // Writing 64 MB of fresh memory shows in the figure and in the peak.
        assert!(reset_peak());
        let before = own(None).unwrap();
        let v = vec![1u8; 64 << 20];
        let after = own(None).unwrap();
        assert!(after >= before + (60 << 20), "{before} -> {after}");
        assert!(peak_resident().unwrap() >= resident(None).unwrap() - (1 << 20));
        let (rss, anon) = resident_and_anon(None).unwrap();
        assert!(anon >= 60 << 20 && rss >= anon, "{rss} {anon}");
        drop(v);
    }
}
