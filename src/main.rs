//! `app`: the binary edge. Parses the command line, validates the configuration, probes the
//! machine, plans, and then prints the plan (`app plan`), becomes the single serving worker
//! (development) or runs the master (`--production`). Exit statuses: see `exit.rs`.

use std::process::ExitCode;

use clap::Parser;

use vramfork::master::cli::Cli;
use vramfork::master::config::{Config, ConfigError, Mode};
use vramfork::master::exit;
use vramfork::master::footprint::Learner;
use vramfork::master::footprint_file::FootprintFile;
use vramfork::master::measured;
use vramfork::master::metrics::MasterMetrics;
use vramfork::master::signals::Signals;
use vramfork::master::supervisor::Supervisor;
use vramfork::master::{activation, develop, listen, plan, resources};
use vramfork::{logging, metrics};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let cli = Cli::parse();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()));
    let env = |k: &str| std::env::var(k).ok();
    let code = match Config::from_cli(cli, &env, &args, exe_dir.as_deref()) {
        Ok(cfg) => run(cfg),
        Err(e) => fail(e),
    };
    // The last lines (why it exits), for a bounded time: a stalled reader does not hold it.
    logging::flush();
    ExitCode::from(code as u8)
}

fn fail(e: ConfigError) -> i32 {
    vramfork::logging::say(&format!("app: {e}"));
    exit::CONFIG
}

fn run(cfg: Config) -> i32 {
    // Before anything else (no thread exists yet): it takes LISTEN_* out of the environment.
    let inherited = match activation::inherited() {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    logging::init(cfg.log_json);
    let (res, gpus) = match resources::probe(cfg.nvml_library.as_deref()) {
        Ok(r) => r,
        Err(e) => return fail(ConfigError(format!("--nvml-library: {e}"))),
    };
    let res = resources::visible::restrict(res, cfg.cuda_visible_devices.as_deref());
    let plan = match plan::plan(&res, &plan::Demand::declared(&cfg.metadata), &cfg.policy()) {
        Ok(p) => p,
        Err(e) => return fail(ConfigError(e.to_string())),
    };
    let mut cfg = cfg;
    if let (Some(why), false) = (&plan.driver_too_old, matches!(cfg.mode, Mode::Plan { .. })) {
        return fail(ConfigError(why.clone()));
    }
    if let Mode::Plan { json, measure } = cfg.mode {
        if !measure {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&plan).expect("a plan serializes")
                );
            } else {
                print!("{}", plan.to_text());
            }
            return exit::OK;
        }
        return match measured::measure_and_plan(&cfg, &res, &plan, gpus.as_ref()) {
            Ok(p) => {
                print!("{}", p.report(json));
                exit::OK
            }
            Err(e) => {
                vramfork::logging::say(&format!("app: cannot measure the model's GPU memory: {e}"));
                exit::MODEL_LOAD
            }
        };
    }
    for w in &plan.warnings {
        tracing::warn!(event = "plan_warning", "{w}");
    }
    if cfg.simulated_gpus {
        tracing::warn!(
            event = "plan_warning",
            "--simulated-gpus: workers placed on GPUs run their model on the CPU (for tests with a simulated NVML only)"
        );
    }
    listen::raise_open_files_limit();
    let (listener, socket) = match inherited {
        Some(i) => {
            tracing::info!(
                event = "socket_activation",
                fd = i.fd,
                name = i.name,
                "serving on the socket systemd handed over (fd {}, name '{}')",
                i.fd,
                i.name
            );
            if cfg.address_given {
                tracing::warn!(
                    event = "address_unused",
                    host = cfg.host,
                    port = cfg.port,
                    "--host/--port ({}:{}) are unused: the socket handed over by systemd decides the address",
                    cfg.host,
                    cfg.port
                );
            }
            (i.listener, "systemd")
        }
        None => match listen::bind(&cfg.host, cfg.port) {
            Ok(l) => (l, "bound"),
            Err(e) => return fail(e),
        },
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let metrics_listener = match cfg.metrics_port {
        None => None,
        Some(port) => match listen::bind_plain(&cfg.host, port, "--metrics-port") {
            Ok(l) => {
                let maddr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                tracing::info!(
                    event = "metrics_listening",
                    addr = maddr,
                    "metrics at {scheme}://{maddr}/metrics"
                );
                Some(l)
            }
            Err(e) => return fail(e),
        },
    };
    if cfg.mode == Mode::Develop {
        tracing::info!(
            event = "listening",
            addr,
            socket,
            workers = 1,
            "listening on {scheme}://{addr} (development mode: one process)"
        );
        let e = develop::exec_worker(&cfg, &plan, listener, metrics_listener);
        return fail(ConfigError(format!(
            "cannot run the worker {}: {e}",
            cfg.worker_binary.display()
        )));
    }
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return fail(ConfigError(format!("cannot install signal handlers: {e}"))),
    };
    // Bound and listening (so a port in use is said before any model loads): plan from
    // measured memory when asked.
    let (plan, footprint_file) = match measured_plan(&mut cfg, &res, plan, gpus.as_ref()) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    tracing::info!(
        event = "listening",
        addr,
        socket,
        workers = plan.workers,
        "listening on {scheme}://{addr} with {} workers ({})",
        plan.workers,
        plan.source
    );
    let metrics = match metrics_listener {
        None => None,
        Some(l) => {
            let m = MasterMetrics::new(&plan, cfg.nvml_library.clone());
            // From what the configuration read and checked (`vramfork::secrets`).
            let (tls, keys) = match (
                cfg.secrets.tls(cfg.tls.as_ref()),
                cfg.secrets.metrics_keys(),
            ) {
                (Ok(t), Ok(k)) => (t.map(std::sync::Arc::new), k),
                (Err(e), _) | (_, Err(e)) => return fail(ConfigError(format!("TLS: {e}"))),
            };
            if let Err(e) = metrics::endpoint::spawn_thread(
                l,
                m.source(),
                metrics::endpoint::MetricsAuth::new(cfg.metrics_api_key_file.clone(), keys),
                tls,
            ) {
                return fail(ConfigError(format!(
                    "cannot start the metrics listener: {e}"
                )));
            }
            Some(m)
        }
    };
    // Learning needs something to compare with: GPU workers planned from a footprint.
    let learner = (plan.device == vramfork::protocol::Device::Cuda
        && gpus.is_some()
        && plan.planned_typ_mb > 0)
        .then(|| Learner::new(plan.planned_typ_mb, footprint_file));
    Supervisor::new(cfg, plan, listener, signals, gpus, metrics)
        .with_learner(learner)
        .run()
}

/// The plan from a footprint recorded by `--footprint-file`, else from profiling one worker
/// (`--profile-memory`), else the estimate's; and the footprint file, when given.
fn measured_plan(
    cfg: &mut Config,
    res: &resources::Resources,
    plan: plan::Plan,
    gpus: Option<&resources::NvmlProbe>,
) -> Result<(plan::Plan, Option<FootprintFile>), ConfigError> {
    let file_error = |e: String| ConfigError(format!("--footprint-file: {e}"));
    let footprint_file = match (&cfg.footprint_file, &cfg.model_path) {
        (Some(f), Some(model)) => Some(FootprintFile::new(f, model).map_err(file_error)?),
        _ => None,
    };
    let remembered = match &footprint_file {
        Some(ff) => ff.recorded_mb().map_err(file_error)?,
        None => None,
    };
    let on_gpu = plan.placement.iter().any(|p| p.gpu.is_some());
    let profiled = match remembered {
        // Experience beats a new measurement: plan from the recorded high-water mark.
        Some(mb) if on_gpu && cfg.profile_memory != Some(false) => {
            Some(measured::remembered(cfg, res, &plan, mb))
        }
        _ if measured::wanted(cfg, &plan) => {
            match measured::measure_and_plan(cfg, res, &plan, gpus) {
                Ok(p) => {
                    if let Some(ff) = &footprint_file {
                        if let Err(e) = ff.record(p.measured.footprint_mb) {
                            tracing::warn!(event = "footprint_file_error", "--footprint-file: {e}");
                        }
                    }
                    Some(p)
                }
                Err(e) => {
                    tracing::warn!(
                        event = "memory_profile_failed",
                        "could not measure a worker's GPU memory ({e}); planning from est_gpu_mem_typ ({} MB) as declared",
                        cfg.metadata.est_gpu_mem_typ
                    );
                    None
                }
            }
        }
        _ => None,
    };
    let Some(p) = profiled else {
        return Ok((plan, footprint_file));
    };
    p.log();
    for w in p
        .plan
        .warnings
        .iter()
        .filter(|w| !plan.warnings.contains(w))
    {
        tracing::warn!(event = "plan_warning", "{w}");
    }
    Ok((p.plan, footprint_file))
}
