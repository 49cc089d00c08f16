//! [`FixedProbe`]: an in-memory [`GpuProbe`] for tests of the code above NVML (admission,
//! planning). Its free memory and per-process figures can be changed while it is shared.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{GpuInfo, GpuProbe, ProbeError};

/// GPUs held in memory.
#[derive(Debug, Default)]
pub struct FixedProbe {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    gpus: Vec<GpuInfo>,
    /// (GPU index, pid) → bytes.
    processes: HashMap<(u32, u32), u64>,
}

impl FixedProbe {
    /// GPUs answered by position: `gpus[i]` is GPU `i` (their `index` fields are set so).
    pub fn new(mut gpus: Vec<GpuInfo>) -> FixedProbe {
        for (i, g) in gpus.iter_mut().enumerate() {
            g.index = i as u32;
        }
        FixedProbe {
            state: Mutex::new(State {
                gpus,
                processes: HashMap::new(),
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s)
    }

    /// Changes a GPU's free memory (used memory follows).
    pub fn set_free_bytes(&self, index: u32, free: u64) {
        self.with(|s| {
            if let Some(g) = s.gpus.get_mut(index as usize) {
                g.free_bytes = free.min(g.total_bytes);
                g.used_bytes = g.total_bytes - g.free_bytes;
            }
        });
    }

    /// Records that `pid` holds `bytes` on GPU `index`.
    pub fn set_process(&self, index: u32, pid: u32, bytes: u64) {
        self.with(|s| s.processes.insert((index, pid), bytes));
    }
}

impl GpuProbe for FixedProbe {
    fn indices(&self) -> Result<Vec<u32>, ProbeError> {
        Ok(self.with(|s| (0..s.gpus.len() as u32).collect()))
    }

    fn gpu(&self, index: u32) -> Result<GpuInfo, ProbeError> {
        self.with(|s| s.gpus.get(index as usize).cloned())
            .ok_or(ProbeError::NoSuchGpu(index))
    }

    fn process_used_bytes(&self, index: u32, pid: u32) -> Result<Option<u64>, ProbeError> {
        self.gpu(index)?;
        Ok(self.with(|s| s.processes.get(&(index, pid)).copied()))
    }
}
