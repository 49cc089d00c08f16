//! Whether NVML's process ids are this process's own. NVML lists the
//! processes on a GPU by their ids in the initial pid namespace — the host's — since the
//! driver knows no other (which is why `nvidia-smi` inside a container lists no processes of
//! its own, or host pids). A process in a container
//! with its own pid namespace has other ids, and one of its ids may equal the host id of a
//! foreign GPU process: a worker would then take that process's figure as its own, the
//! footprint learner would keep it as the high-water mark (and write it to
//! `--footprint-file`, refuse TTIN, recycle under `--max-worker-gpu-mb` after every pass).
//!
//! So a per-pid NVML figure is believed only in the initial pid namespace, whose
//! `/proc/self/ns/pid` is `pid:[4026531836]` (`PROC_PID_INIT_INO`, 0xEFFFFFFC, in Linux's
//! `include/linux/proc_ns.h`). Asked by the two readers of per-process figures: the
//! master's NVML probe (`master::resources::nvml`, for profiling, the footprint learner and
//! `/metrics`) and a worker's hwFetch and heartbeat figures; elsewhere the figures come from
//! the device's free memory, as where NVML lists no figure for a pid.

use std::sync::OnceLock;

/// `/proc/self/ns/pid` in the initial pid namespace.
pub const INITIAL: &str = "pid:[4026531836]";

/// Whether the ids NVML lists are this process's pid namespace's (read once).
pub fn nvml_pids_are_ours() -> bool {
    static OURS: OnceLock<bool> = OnceLock::new();
    *OURS.get_or_init(|| is_initial(std::fs::read_link("/proc/self/ns/pid").ok().as_deref()))
}

/// Whether `link` (the target of `/proc/self/ns/pid`) is the initial pid namespace.
fn is_initial(link: Option<&std::path::Path>) -> bool {
    link.is_some_and(|l| l.as_os_str() == INITIAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn only_the_initial_namespace_is_the_drivers() {
        assert!(is_initial(Some(Path::new("pid:[4026531836]"))));
        assert!(!is_initial(Some(Path::new("pid:[4026532401]"))));
        // No /proc (or no namespace support): nothing says the ids are ours.
        assert!(!is_initial(None));
    }
}
