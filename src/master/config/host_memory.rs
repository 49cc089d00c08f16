//! Host memory: `--max-worker-memory-mb` (recycling on a worker's own memory) and
//! `--memory-cgroup` (where the limit, the usage and the OOM kills are read).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checker::{absolute, Checker};
use super::ConfigError;
use crate::master::cli::Cli;
use crate::master::resources::host_memory::Cgroup;

/// `--max-worker-memory-mb` and `--memory-cgroup`, checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostMemory {
    /// `--max-worker-memory-mb`: recycle a worker whose own host memory grew past this.
    pub max_worker_memory_mb: Option<u64>,
    /// `--memory-cgroup`: where the memory limit, usage and OOM kills are read (checked to
    /// be a cgroup's directory); `None`: this process's own cgroup.
    pub memory_cgroup: Option<PathBuf>,
}

impl HostMemory {
    pub(super) fn check(cli: &Cli, c: &Checker<'_>) -> Result<HostMemory, ConfigError> {
        let max_worker_memory_mb = match cli.max_worker_memory_mb.as_deref() {
            None => None,
            Some(v) => Some(c.uint_given("--max-worker-memory-mb", v, 1)?),
        };
        let memory_cgroup = match &cli.memory_cgroup {
            None => None,
            Some(d) => {
                let dir = absolute(Path::new(d));
                if let Err(e) = Cgroup::given(&dir) {
                    return Err(c.bad(
                        "--memory-cgroup",
                        &dir.display().to_string(),
                        &format!("expected a memory cgroup's directory ({e})"),
                    ));
                }
                Some(dir)
            }
        };
        Ok(HostMemory {
            max_worker_memory_mb,
            memory_cgroup,
        })
    }
}
