//! The bootstrap of `app`, as library calls a test can drive (pingora's `Server::new →
//! bootstrap → run_forever`): [`Server::new`] probes the machine and plans, [`next`] says
//! what to do with the plan (**pure**: print it, measure, refuse, serve in development mode
//! or supervise), [`Server::bind`] binds the sockets, and [`Bound::develop`] or
//! [`Bound::supervise`] runs until the end. `main.rs` parses the command line and calls
//! [`run`]. Exit statuses: [`crate::master::exit`].
//!
//! Its events keep the target `app` they had when this was the binary's own code.

use std::net::TcpListener;
use std::sync::Arc;

use super::activation::{self, Inherited};
use super::config::{Config, ConfigError, Mode};
use super::footprint::Learner;
use super::host::footprint_file::FootprintFile;
use super::host::reservation::Reservation;
use super::measured::{self, Profiled, Source};
use super::metrics::MasterMetrics;
use super::plan::{self, Demand, Plan};
use super::resources::host_memory::{Budget, Cgroup};
use super::resources::{self, NvmlProbe, Resources};
use super::signals::Signals;
use super::supervisor::Supervisor;
use super::{develop, exit, listen};
use crate::protocol::Device;
use crate::{logging, metrics};

/// Runs `app` with a valid configuration until it exits; returns the exit status.
pub fn run(cfg: Config) -> i32 {
    let _unpacked = super::host::unpack::Sweep::start();
    let server = match Server::new(cfg) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match next(server.cfg.mode, &server.plan) {
        Next::Print { json } => server.print(json),
        Next::Measure { json } => server.measure(json),
        Next::Refuse(why) => fail(ConfigError(why)),
        Next::Develop => match server.bind() {
            Ok(b) => b.develop(),
            Err(code) => code,
        },
        Next::Supervise => match server.bind() {
            Ok(b) => b.supervise(),
            Err(code) => code,
        },
    }
}

/// A configuration error (or one found later, before any worker started): one line on
/// stderr, exit status 2.
pub fn fail(e: ConfigError) -> i32 {
    logging::say(&format!("app: {e}"));
    exit::CONFIG
}

/// Whether NVIDIA MPS serves the GPUs: `--mps on`/`off` as said; `auto`, when there are
/// GPUs to serve on, whether its control daemon accepts connections where the workers'
/// CUDA will look for it (`resources::mps`).
fn mps_on(cfg: &Config, res: &Resources) -> bool {
    match cfg.mps.setting {
        Some(on) => on,
        None if res.gpus.is_empty() || cfg.gpu.device == Device::Cpu => false,
        None => match resources::mps::detect(&cfg.mps.pipe_directory) {
            Ok(how) => {
                tracing::info!(
                    target: "app",
                    event = "mps_detected",
                    pipe_directory = %cfg.mps.pipe_directory.display(),
                    "NVIDIA MPS: {how}; the workers will be its clients: a GPU in exclusive-process mode takes as many as a shared one, each worker gets its share as its MPS memory limit, and a fatal CUDA error retires that GPU's workers together (--mps off plans without MPS)"
                );
                true
            }
            Err(not) => {
                // Said at start when something is there ("something else listens there" must
                // not pass unseen); nothing there, the usual host without MPS, only at debug.
                let pipe_directory = cfg.mps.pipe_directory.display();
                let why = &not.why;
                if not.something_there {
                    tracing::info!(
                        target: "app",
                        event = "mps_not_detected",
                        %pipe_directory,
                        "NVIDIA MPS not detected: {why}; the workers are plain CUDA processes (--mps on assumes MPS)"
                    );
                } else {
                    tracing::debug!(
                        target: "app",
                        event = "mps_not_detected",
                        %pipe_directory,
                        "NVIDIA MPS not detected: {why}"
                    );
                }
                false
            }
        },
    }
}

/// What `app` does once it has a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// `app plan [--json]`: print the plan, exit 0.
    Print { json: bool },
    /// `app plan --measure [--json]`: profile one worker, print what it measured and the plan
    /// from it.
    Measure { json: bool },
    /// The plan cannot run (the driver is too old for the GPUs it uses, or the caching
    /// allocator is off): exit 2.
    Refuse(String),
    /// Development mode: one process serves.
    Develop,
    /// `--production`: the master supervises workers.
    Supervise,
}

/// What to do with `plan` in `mode` (pure). `app plan` shows a plan the driver cannot run,
/// with its warning; serving refuses to start on it.
pub fn next(mode: Mode, plan: &Plan) -> Next {
    match (mode, plan.refusal()) {
        (Mode::Plan { json, measure }, _) if !measure => Next::Print { json },
        (Mode::Plan { json, .. }, _) => Next::Measure { json },
        (_, Some(why)) => Next::Refuse(why.clone()),
        (Mode::Develop, None) => Next::Develop,
        (Mode::Production, None) => Next::Supervise,
    }
}

/// A configuration with the machine probed and the plan made.
pub struct Server {
    cfg: Config,
    res: Resources,
    gpus: Option<NvmlProbe>,
    plan: Plan,
    inherited: Option<Inherited>,
    /// Read (its lock held) before planning, written provisionally with the plan; written
    /// again, under the lock, once the plan is final.
    reservation: Option<Reservation>,
}

impl Server {
    /// Takes a socket systemd handed over, starts logging, probes the machine (CPUs, the
    /// GPUs `CUDA_VISIBLE_DEVICES` leaves) and plans. Errors are exit statuses.
    pub fn new(cfg: Config) -> Result<Server, i32> {
        // Before anything else (no thread exists yet): it takes LISTEN_* out of the
        // environment.
        let inherited = activation::inherited().map_err(fail)?;
        logging::init(cfg.log.json);
        cfg.tracing.log();
        let (res, gpus) = resources::probe(cfg.gpu.nvml_library.as_deref())
            .map_err(|e| fail(ConfigError(format!("--nvml-library: {e}"))))?;
        let mut res = resources::visible::restrict(res, cfg.gpu.cuda_visible_devices.as_deref());
        let mut reservation =
            Reservation::begin(&cfg, &mut res, gpus.as_ref()).map_err(|e| fail(ConfigError(e)))?;
        let mut cfg = cfg;
        cfg.mps.on = mps_on(&cfg, &res);
        let plan = plan::plan(&res, &Demand::declared(&cfg.app.metadata), &cfg.policy())
            .map_err(|e| fail(ConfigError(e.to_string())))?;
        let plan = with_budget(plan, &cfg);
        // Reserved at once, and the ledger's lock let go: profiling holds no other start.
        if let Some(r) = &mut reservation {
            r.provisional(&plan).map_err(|e| fail(ConfigError(e)))?;
        }
        Ok(Server {
            cfg,
            res,
            gpus,
            plan,
            inherited,
            reservation,
        })
    }

    /// `app plan`: the plan as text or JSON (after the log lines so far, so that the two
    /// never interleave where both streams go to one place).
    fn print(&self, json: bool) -> i32 {
        logging::flush();
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&self.plan).expect("a plan serializes")
            );
        } else {
            print!("{}", self.plan.to_text());
        }
        exit::OK
    }

    /// `app plan --measure`: one worker profiled, what it measured and the plan from it.
    fn measure(&self, json: bool) -> i32 {
        match measured::measure_and_plan(&self.cfg, &self.res, &self.plan, self.gpus.as_ref()) {
            Ok(p) => {
                logging::flush();
                print!("{}", p.report(json));
                exit::OK
            }
            Err(e) => {
                logging::say(&format!("app: cannot measure the model's GPU memory: {e}"));
                exit::MODEL_LOAD
            }
        }
    }

    /// Says the plan's warnings, then binds the serving socket (or takes the one systemd
    /// handed over) and the metrics port, so that a port in use is said before any model
    /// loads.
    pub fn bind(self) -> Result<Bound, i32> {
        let cfg = &self.cfg;
        for w in &self.plan.warnings {
            tracing::warn!(target: "app", event = "plan_warning", "{w}");
        }
        if cfg.gpu.simulated_gpus {
            tracing::warn!(
                target: "app",
                event = "plan_warning",
                "--simulated-gpus: workers placed on GPUs run their model on the CPU (for tests with a simulated NVML only)"
            );
        }
        listen::raise_open_files_limit();
        let (listener, socket) = match self.inherited {
            Some(i) => (activated(i, cfg), "systemd"),
            None => (
                listen::bind(&cfg.address.host, cfg.address.port).map_err(fail)?,
                "bound",
            ),
        };
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let scheme = if cfg.access.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let metrics_listener = match cfg.address.metrics_port {
            None => None,
            Some(port) => {
                let l =
                    listen::bind_plain(&cfg.address.host, port, "--metrics-port").map_err(fail)?;
                let maddr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                tracing::info!(
                    target: "app",
                    event = "metrics_listening",
                    addr = maddr,
                    "metrics at {scheme}://{maddr}/metrics"
                );
                Some(l)
            }
        };
        Ok(Bound {
            cfg: self.cfg,
            res: self.res,
            gpus: self.gpus,
            plan: self.plan,
            listener,
            socket,
            addr,
            scheme,
            metrics_listener,
            reservation: self.reservation,
        })
    }
}

/// The socket systemd handed over, said in the log (and `--host`/`--port` said unused).
fn activated(i: Inherited, cfg: &Config) -> TcpListener {
    tracing::info!(
        target: "app",
        event = "socket_activation",
        fd = i.fd,
        name = i.name,
        "serving on the socket systemd handed over (fd {}, name '{}')",
        i.fd,
        i.name
    );
    if cfg.address.address_given {
        tracing::warn!(
            target: "app",
            event = "address_unused",
            host = cfg.address.host,
            port = cfg.address.port,
            "--host/--port ({}:{}) are unused: the socket handed over by systemd decides the address",
            cfg.address.host,
            cfg.address.port
        );
    }
    i.listener
}

/// A server with its sockets bound.
pub struct Bound {
    cfg: Config,
    res: Resources,
    gpus: Option<NvmlProbe>,
    plan: Plan,
    listener: TcpListener,
    /// `"bound"` or `"systemd"`.
    socket: &'static str,
    addr: String,
    scheme: &'static str,
    metrics_listener: Option<TcpListener>,
    reservation: Option<Reservation>,
}

impl Bound {
    /// Development mode: this process becomes the one worker (exec); returns only when
    /// that fails.
    pub fn develop(self) -> i32 {
        let (addr, socket, scheme) = (&self.addr, self.socket, self.scheme);
        tracing::info!(
            target: "app",
            event = "listening",
            addr,
            socket,
            workers = 1,
            "listening on {scheme}://{addr} (development mode: one process)"
        );
        let e = develop::exec_worker(&self.cfg, &self.plan, self.listener, self.metrics_listener);
        fail(ConfigError(format!(
            "cannot run the worker {}: {e}",
            self.cfg.workers.binary.display()
        )))
    }

    /// `--production`: installs the signal handlers, plans from measured memory when asked,
    /// starts the metrics endpoint and runs the supervisor until the master exits.
    pub fn supervise(mut self) -> i32 {
        let Bound { cfg, res, gpus, .. } = &self;
        let signals = match Signals::install() {
            Ok(s) => s,
            Err(e) => return fail(ConfigError(format!("cannot install signal handlers: {e}"))),
        };
        // Bound and listening (so a port in use is said before any model loads): plan from
        // measured memory when asked.
        let (plan, footprint_file) = match measured_plan(cfg, res, self.plan.clone(), gpus.as_ref())
        {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        // The final plan's reservation, under the ledger's lock taken again: fewer workers if
        // the other servers took room while this one profiled.
        let reserve_mb = self.cfg.gpu.gpu_reserve_mb;
        let plan = match self
            .reservation
            .as_mut()
            .map(|r| r.commit(plan.clone(), reserve_mb))
        {
            None => plan,
            Some(Ok(p)) => p,
            Some(Err(e)) => return fail(ConfigError(e)),
        };
        let (addr, socket, scheme) = (&self.addr, self.socket, self.scheme);
        tracing::info!(
            target: "app",
            event = "listening",
            addr,
            socket,
            workers = plan.workers,
            "listening on {scheme}://{addr} with {} workers ({})",
            plan.workers,
            plan.source
        );
        super::oom::say_scores();
        let metrics = match self.metrics_listener {
            None => None,
            Some(l) => match metrics_endpoint(&self.cfg, &plan, l) {
                Ok(m) => Some(m),
                Err(e) => return fail(e),
            },
        };
        // Learning needs something to compare with: GPU workers planned from a footprint.
        let learner =
            (plan.device == Device::Cuda && self.gpus.is_some() && plan.planned_typ_mb > 0)
                .then(|| Learner::new(&plan, footprint_file));
        Supervisor::new(self.cfg, plan, self.listener, signals, self.gpus, metrics)
            .with_learner(learner)
            .with_reservation(self.reservation)
            .run()
    }
}

/// The plan with the host memory the server may use now (rule 13's row; the bound comes
/// once a worker's cost is measured).
fn with_budget(mut plan: Plan, cfg: &Config) -> Plan {
    let cgroup = Cgroup::of(cfg.host_memory.memory_cgroup.as_deref());
    if let Some(b) = Budget::now(cgroup.as_ref()) {
        plan::host::budget(&mut plan, b);
    }
    plan
}

/// The `/metrics` listener's thread, serving what the master keeps.
fn metrics_endpoint(
    cfg: &Config,
    plan: &Plan,
    l: TcpListener,
) -> Result<MasterMetrics, ConfigError> {
    let m = MasterMetrics::new(plan, cfg.gpu.nvml_library.clone());
    // From what the configuration read and checked (`vramfork::secrets`).
    let (tls, keys) = match (
        cfg.access.secrets.tls(cfg.access.tls.as_ref()),
        cfg.access.secrets.metrics_keys(),
    ) {
        (Ok(t), Ok(k)) => (t.map(Arc::new), k),
        (Err(e), _) | (_, Err(e)) => return Err(ConfigError(format!("TLS: {e}"))),
    };
    metrics::endpoint::spawn_thread(
        l,
        m.source(),
        metrics::endpoint::MetricsAuth::new(cfg.access.metrics_api_key_file.clone(), keys),
        tls,
    )
    .map_err(|e| ConfigError(format!("cannot start the metrics listener: {e}")))?;
    Ok(m)
}

/// The plan from a footprint recorded by `--footprint-file`, else from profiling one worker
/// (`--profile-memory`), else the estimate's ([`measured::source`]); and the footprint
/// file, when given.
fn measured_plan(
    cfg: &Config,
    res: &Resources,
    plan: Plan,
    gpus: Option<&NvmlProbe>,
) -> Result<(Plan, Option<FootprintFile>), ConfigError> {
    let file_error = |e: String| ConfigError(format!("--footprint-file: {e}"));
    let footprint_file = match (&cfg.footprint.footprint_file, &cfg.app.model_path) {
        (Some(f), Some(model)) => Some(FootprintFile::new(f, model).map_err(file_error)?),
        _ => None,
    };
    let recorded = match &footprint_file {
        Some(ff) => ff.recorded().map_err(file_error)?,
        None => None,
    };
    let remembered = recorded.map(|r| r.high_water_mb);
    let on_gpu = plan.placement.iter().any(|p| p.gpu.is_some());
    let profiled = match measured::source(remembered, on_gpu, cfg.footprint.profile_memory, || {
        measured::wanted(cfg, &plan)
    }) {
        Source::Remembered(mb) => {
            let context_mb = recorded.and_then(|r| r.context_mb);
            Some(measured::remembered(cfg, res, &plan, mb, context_mb))
        }
        Source::Profile => match measured::measure_and_plan(cfg, res, &plan, gpus) {
            Ok(p) => {
                if let Some(ff) = &footprint_file {
                    if let Err(e) = ff.record(p.measured.footprint_mb, p.measured.context_mb()) {
                        tracing::warn!(target: "app", event = "footprint_file_error", "--footprint-file: {e}");
                    }
                }
                Some(p)
            }
            Err(e) => {
                tracing::warn!(
                    target: "app",
                    event = "memory_profile_failed",
                    "could not measure a worker's GPU memory ({e}); planning from est_gpu_mem_typ ({} MB) as declared",
                    cfg.app.metadata.est_gpu_mem_typ
                );
                None
            }
        },
        Source::Estimate => None,
    };
    let Some(p) = profiled else {
        return Ok((plan, footprint_file));
    };
    p.log();
    let p = Profiled {
        plan: with_budget(p.plan, cfg),
        ..p
    };
    for w in p
        .plan
        .warnings
        .iter()
        .filter(|w| !plan.warnings.contains(w))
    {
        tracing::warn!(target: "app", event = "plan_warning", "{w}");
    }
    Ok((p.plan, footprint_file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::plan::Policy;

    fn plan(driver_too_old: Option<&str>) -> Plan {
        let meta = crate::metadata::AppMetadata::parse(
            std::path::Path::new("/apps/t/app-metadata.json"),
            r#"{"name": "t"}"#,
        )
        .unwrap();
        let res = Resources {
            cpus: 2,
            ..Default::default()
        };
        let mut p = plan::plan(&res, &Demand::declared(&meta), &Policy::default()).unwrap();
        p.driver_too_old = driver_too_old.map(str::to_string);
        p
    }

    #[test]
    fn what_app_does_with_its_plan() {
        let (ok, old) = (plan(None), plan(Some("the driver is too old")));
        let rows = [
            (Mode::Develop, &ok, Next::Develop),
            (Mode::Production, &ok, Next::Supervise),
            (
                Mode::Plan {
                    json: true,
                    measure: false,
                },
                &ok,
                Next::Print { json: true },
            ),
            (
                Mode::Plan {
                    json: false,
                    measure: true,
                },
                &ok,
                Next::Measure { json: false },
            ),
            // Serving refuses a plan the driver cannot run; `app plan` shows it.
            (
                Mode::Production,
                &old,
                Next::Refuse("the driver is too old".into()),
            ),
            (
                Mode::Develop,
                &old,
                Next::Refuse("the driver is too old".into()),
            ),
            (
                Mode::Plan {
                    json: false,
                    measure: false,
                },
                &old,
                Next::Print { json: false },
            ),
            (
                Mode::Plan {
                    json: true,
                    measure: true,
                },
                &old,
                Next::Measure { json: true },
            ),
        ];
        for (mode, plan, want) in rows {
            assert_eq!(next(mode, plan), want, "{mode:?}");
        }
    }
}
