//! Prometheus metrics. Workers count what they answer ([`traffic::Traffic`], latency
//! [`histogram`]s) and report it over their control channel at heartbeat pace; the master
//! keeps the totals of workers that are gone, adds those of live ones, and serves `/metrics`
//! on its own listener ([`endpoint`]), encoded by [`exposition`] in the Prometheus text
//! format or OpenMetrics. In development mode the single worker serves the same families.
//! What waits for a worker in the listening socket's queue is read from the kernel
//! ([`listen_queue`]).
//! The README's metrics table lists every family.

pub mod endpoint;
pub mod exposition;
pub mod histogram;
pub mod listen_queue;
pub mod traffic;

/// A process's resident set size from `/proc/<pid>/statm`.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}
