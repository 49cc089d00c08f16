//! The workers' life under NVIDIA MPS: fatal faults, and the daemon coming and going.
//!
//! **A fatal CUDA error.** MPS delivers a fatal GPU fault of one client to every client
//! sharing that GPU, and its server then takes no new client until all of them have exited
//! (NVIDIA's MPS documentation, "Error Containment"; new clients get
//! `cudaErrorMpsServerNotReady` meanwhile). One control daemon and its server serve every
//! GPU the workers see (one pipe directory, `CUDA_MPS_PIPE_DIRECTORY`, is the master's), so
//! a client refused is refused on any of them. So when a worker on an MPS GPU ends with a
//! fatal CUDA error (`worker_exit::CUDA_FATAL`), serving or still booting (a reload's new
//! generation faulting poisons the old generation's clients on its GPU just the same), the
//! master asks the others on that GPU to retire (`mps_fault`), and starts no worker on any
//! MPS GPU until they are gone ([`MpsFaults`]).
//!
//! **The daemon.** Under `--mps auto` the master found the daemon at start; it may die or
//! be restarted later (a device plugin's daemon set rolling). It is looked for again at a
//! low rate ([`DaemonWatch`]: every [`CHECK_EVERY`]) and at once when a worker on an MPS
//! GPU fails. Gone: `mps_daemon_lost`, and no worker starts on an exclusive-process GPU —
//! without MPS such a GPU takes one process, the plan put several there, and a worker there
//! would either crash at boot again and again or hold the GPU that a restarted MPS server
//! needs. Workers on default-mode GPUs start as usual (they run as plain CUDA processes),
//! those that run are left alone, and the master looks every [`CHECK_WHILE_GONE`]; back:
//! `mps_daemon_back`, and starts resume. If no worker is ready for `--boot-timeout`
//! meanwhile, the master gives up (exit 4) as after any failed boots, so the orchestrator
//! sees a dead service rather than one that waits forever.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::Supervisor;
use crate::master::plan::{GpuPlan, Plan};
use crate::master::resources::mps;
use crate::master::slot::{Phase, RetireAsk, WorkerState};
use crate::protocol::worker_exit;

/// How often the daemon is looked for while it is there. Each look is a connection the
/// daemon writes into its control log, for the server's whole life, and the look that
/// matters comes at once anyway: when a worker on an MPS GPU fails (a lost daemon shows
/// first there). So the steady rate is low: 720 entries a day.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(120);
/// How often while it is gone.
pub(super) const CHECK_WHILE_GONE: Duration = Duration::from_secs(1);

/// The GPUs waiting for the workers that shared a fatal MPS fault to exit.
#[derive(Debug, Default)]
pub(super) struct MpsFaults {
    /// The GPUs MPS serves: one daemon serves them all.
    mps_gpus: Vec<u32>,
    /// (GPU, the pids that were on it).
    waiting: Vec<(u32, Vec<u32>)>,
}

impl MpsFaults {
    /// For the GPUs of `plan` that MPS serves.
    pub fn serving(plan: &Plan) -> MpsFaults {
        MpsFaults {
            mps_gpus: plan
                .gpus
                .iter()
                .filter(|g| g.mps)
                .map(|g| g.index)
                .collect(),
            waiting: Vec::new(),
        }
    }

    /// GPU `gpu` waits for `pids` to exit.
    pub fn fault(&mut self, gpu: u32, pids: Vec<u32>) {
        self.waiting.retain(|(g, _)| *g != gpu);
        if !pids.is_empty() {
            self.waiting.push((gpu, pids));
        }
    }

    /// Forgets the GPUs whose faulted workers are all gone (`live`: the pids alive now).
    pub fn settle(&mut self, live: &[u32]) {
        for (_, pids) in &mut self.waiting {
            pids.retain(|p| live.contains(p));
        }
        self.waiting.retain(|(_, pids)| !pids.is_empty());
    }

    /// Whether no worker may start on `gpu` yet: it is served by the daemon whose server
    /// waits for faulted clients (on this GPU or another).
    pub fn blocks(&self, gpu: u32) -> bool {
        !self.waiting.is_empty() && (self.mps_gpus.contains(&gpu) || self.faulted(gpu))
    }

    fn faulted(&self, gpu: u32) -> bool {
        self.waiting.iter().any(|(g, _)| *g == gpu)
    }
}

/// The MPS control daemon found at start (`--mps auto`), looked for again.
#[derive(Debug)]
pub(super) struct DaemonWatch {
    pipe_dir: PathBuf,
    next_check: Instant,
    /// Why it is gone, while it is.
    gone: Option<String>,
}

impl DaemonWatch {
    /// Watches the daemon in `pipe_dir` from `now` on.
    pub fn new(pipe_dir: PathBuf, now: Instant) -> DaemonWatch {
        DaemonWatch {
            pipe_dir,
            next_check: now + CHECK_EVERY,
            gone: None,
        }
    }

    /// Looks for it at the next chance (a worker on an MPS GPU failed).
    pub fn soon(&mut self) {
        self.next_check = Instant::now();
    }

    /// Whether no worker may start on `g`: the daemon is gone and `g`, exclusive without
    /// it, was planned with several clients.
    pub fn blocks(&self, g: &GpuPlan) -> bool {
        self.gone.is_some() && g.mps && g.compute_mode.is_exclusive()
    }

    /// Looks when due; `Some(Err(why))` it has just gone, `Some(Ok(how))` it has just come
    /// back, `None` nothing changed.
    fn check(&mut self, now: Instant) -> Option<Result<String, String>> {
        if now < self.next_check {
            return None;
        }
        let found = mps::detect(&self.pipe_dir).map_err(|not| not.why);
        let every = if found.is_ok() {
            CHECK_EVERY
        } else {
            CHECK_WHILE_GONE
        };
        self.next_check = now + every;
        match (found, self.gone.is_some()) {
            (Err(why), false) => {
                self.gone = Some(why.clone());
                Some(Err(why))
            }
            (Ok(how), true) => {
                self.gone = None;
                Some(Ok(how))
            }
            _ => None,
        }
    }
}

impl Supervisor {
    /// Worker `st` ended with a fatal CUDA error: under MPS its GPU's other workers got it
    /// too (module docs).
    pub(super) fn mps_fault(&mut self, st: &WorkerState, now: Instant) {
        let Some(gpu) = st.gpu else { return };
        if !self.plan.gpus.iter().any(|g| g.index == gpu && g.mps) {
            return;
        }
        let others: Vec<u32> = self
            .workers
            .iter()
            .filter(|w| w.state.gpu == Some(gpu) && w.state.pid != st.pid)
            .map(|w| w.state.pid)
            .collect();
        tracing::error!(
            event = "mps_fault",
            gpu,
            pid = st.pid,
            workers = others.len(),
            "worker {} (pid {}) on {} ended with a fatal CUDA error; under MPS every client of that GPU gets it and the MPS server takes no new client, on any GPU it serves, until they have all exited: retiring its {} other worker(s) and starting none on an MPS GPU until they are gone",
            st.slot,
            st.pid,
            self.plan.gpu_label(gpu),
            others.len()
        );
        for &pid in &others {
            let asked = self
                .workers
                .iter()
                .any(|w| w.state.pid == pid && w.state.asked_to_stop.is_some());
            if !asked {
                self.ask(pid, RetireAsk::MpsFault, Signal::SIGTERM, now);
            }
        }
        self.mps_faults.fault(gpu, others);
    }

    /// Worker `st` exited with `code` (not stopped on purpose): a fatal CUDA error, at boot
    /// or while serving, is an MPS fault; any failure of a worker on an MPS GPU has its
    /// daemon looked for at once.
    pub(super) fn mps_exit(&mut self, st: &WorkerState, code: Option<i32>, now: Instant) {
        if code == Some(worker_exit::CUDA_FATAL) {
            self.mps_fault(st, now);
        }
        let failed = code != Some(0) || st.phase == Phase::Booting;
        let gpu = st.gpu.filter(|_| failed);
        let mps = gpu.is_some_and(|i| self.plan.gpus.iter().any(|g| g.index == i && g.mps));
        if let Some(d) = self.mps_daemon.as_mut().filter(|_| mps) {
            d.soon();
        }
    }

    /// Looks for the daemon when due, and says when it went or came back.
    pub(super) fn check_mps_daemon(&mut self, now: Instant) {
        let Some(d) = self.mps_daemon.as_mut() else {
            return;
        };
        let exclusive: Vec<String> = self
            .plan
            .gpus
            .iter()
            .filter(|g| g.compute_mode.is_exclusive())
            .map(|g| g.label.clone())
            .collect();
        let pipe = d.pipe_dir.display().to_string();
        match d.check(now) {
            Some(Err(why)) => tracing::error!(
                event = "mps_daemon_lost",
                pipe_directory = pipe,
                "the MPS control daemon is gone: {why}. Its clients cannot start; on {} (exclusive-process: without MPS one process at a time) no worker starts until it is back, looked for every {}s; workers that run are left alone, and without a ready worker for --boot-timeout the server gives up. Start the daemon again (nvidia-cuda-mps-control -d, or the device plugin's MPS daemon), or restart the server with --mps off",
                if exclusive.is_empty() { "no GPU here".to_string() } else { exclusive.join(", ") },
                CHECK_WHILE_GONE.as_secs()
            ),
            Some(Ok(how)) => tracing::info!(
                event = "mps_daemon_back",
                pipe_directory = pipe,
                "the MPS control daemon is back: {how}; workers start again"
            ),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::resources::ComputeMode;

    fn serving(gpus: &[u32]) -> MpsFaults {
        MpsFaults {
            mps_gpus: gpus.to_vec(),
            waiting: Vec::new(),
        }
    }

    #[test]
    fn a_faulted_gpu_blocks_until_its_workers_are_gone() {
        let mut f = MpsFaults::default();
        assert!(!f.blocks(0));
        f.fault(0, vec![11, 12]);
        f.fault(1, vec![]);
        assert!(f.blocks(0));
        f.settle(&[12, 99]);
        assert!(f.blocks(0), "12 is still alive");
        f.settle(&[99]);
        assert!(!f.blocks(0));
    }

    /// One daemon serves every GPU, so a fault on one blocks starts on
    /// all of them until the faulted clients are gone.
    #[test]
    fn a_fault_on_one_gpu_blocks_every_gpu_of_its_daemon() {
        let mut f = serving(&[0, 1]);
        f.fault(0, vec![11]);
        assert!(f.blocks(0) && f.blocks(1));
        assert!(!f.blocks(2), "GPU 2 is not served by MPS");
        f.settle(&[]);
        assert!(!f.blocks(0) && !f.blocks(1));
    }

    /// The daemon looked for again, at a low rate while there and every
    /// second while gone; only exclusive-process MPS GPUs are blocked while it is gone.
    #[test]
    fn a_daemon_that_goes_blocks_exclusive_gpus_until_it_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control");
        let daemon = || mps::listen_as_daemon(dir.path());
        let up = daemon();
        let t0 = Instant::now();
        let mut w = DaemonWatch::new(dir.path().to_path_buf(), t0);
        assert_eq!(w.check(t0), None, "not due yet");
        assert_eq!(w.check(t0 + CHECK_EVERY), None, "there, nothing changed");
        drop(up);
        std::fs::remove_file(&control).unwrap();
        assert_eq!(
            w.check(t0 + CHECK_EVERY + CHECK_WHILE_GONE),
            None,
            "not due yet"
        );
        w.soon();
        assert!(matches!(w.check(Instant::now()), Some(Err(_))));
        let mut g = GpuPlan {
            index: 0,
            label: "GPU 0".into(),
            name: "test".into(),
            uuid: "GPU-0".into(),
            compute_mode: ComputeMode::ExclusiveProcess,
            mig: None,
            total_mb: 1000,
            free_mb: 1000,
            fraction: 0.9,
            usable_mb: 400,
            fits: 4,
            assigned: 4,
            cap_mb: None,
            memory_fraction: None,
            excluded: None,
            mps: true,
            mps_limit_mb: Some(100),
            mps_client_limit_mb: None,
            gpu_instance: None,
            ledger_mb: 0,
            compute_capability: None,
        };
        assert!(w.blocks(&g));
        g.compute_mode = ComputeMode::Default;
        assert!(
            !w.blocks(&g),
            "a default-mode GPU takes plain CUDA processes"
        );
        let _up = daemon();
        let t = Instant::now() + CHECK_WHILE_GONE;
        assert!(matches!(w.check(t), Some(Ok(_))));
        assert_eq!(w.check(t), None, "next look in CHECK_EVERY");
        g.compute_mode = ComputeMode::ExclusiveProcess;
        assert!(!w.blocks(&g));
    }
}
