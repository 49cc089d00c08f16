//! `Config::from_cli`: turns the command line and the environment into one validated
//! configuration. This is the only module that reads the environment. Every invalid value is
//! an error naming the option (and the variable it came from), the value and what is allowed;
//! nothing is silently replaced by a default.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::master::cli::{Cli, Command, OPTION_ENV};
use crate::master::plan::{Policy, TorchThreads, WorkerOverride};
use crate::metadata::{AppMetadata, MAX_BATCH_SIZE_LIMIT};
use crate::protocol::{Device, DEFAULT_WARMUP_PASSES};

/// What `app` was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One process serves (no forking, no recycling).
    Develop,
    /// Master + pre-forked workers.
    Production,
    /// Print the plan and exit (`measure`: after profiling one worker).
    Plan { json: bool, measure: bool },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub metadata: AppMetadata,
    /// Absolute path of the TorchScript file (`--model`, else the metadata's `model`).
    pub model_path: Option<PathBuf>,
    /// `--model`, when given: a reload keeps it instead of the metadata's `model`.
    pub model_override: Option<PathBuf>,
    pub host: String,
    pub port: u16,
    /// `--metrics-port`: serve `/metrics` there (0 = any free port); `None` = no metrics.
    pub metrics_port: Option<u16>,
    /// `--host` or `--port` was given (flag or environment): worth a word in the log when a
    /// socket handed over by systemd makes them unused.
    pub address_given: bool,
    pub workers_override: Option<WorkerOverride>,
    pub max_requests: u64,
    pub max_requests_jitter: u64,
    pub timeout: Duration,
    pub boot_timeout: Duration,
    pub graceful_timeout: Duration,
    pub request_timeout: Duration,
    /// `None`: requests wait without bound (`--max-queue-wait 0`).
    pub max_queue_wait: Option<Duration>,
    /// Rows per forward pass (`--max-batch-size`, else the metadata's); 0 = no batching.
    pub max_batch_size: u32,
    /// `--max-batch-size`, when given: a reload keeps it instead of the metadata's.
    pub max_batch_size_override: Option<u32>,
    /// How long the model thread may wait to fill a batch.
    pub batch_timeout: Duration,
    /// `--warmup-passes`: forward passes before a process that loads the model serves.
    pub warmup_passes: u32,
    /// `--profile-memory`: `None` = auto.
    pub profile_memory: Option<bool>,
    /// `--memory-headroom`: the plan assumes measured footprint × this.
    pub memory_headroom: f64,
    /// `--adapt-workers`: retire workers when their observed footprint outgrows the plan.
    pub adapt_workers: bool,
    /// `--footprint-file`.
    pub footprint_file: Option<PathBuf>,
    pub device: Device,
    pub max_body_bytes: u64,
    pub gpu_memory_utilization: Option<f64>,
    pub gpu_reserve_mb: u64,
    pub max_worker_gpu_mb: Option<u64>,
    pub nvml_library: Option<PathBuf>,
    /// `--simulated-gpus`: GPU workers run on the CPU (tests with tests/nvml-mock).
    pub simulated_gpus: bool,
    /// The operator's `CUDA_VISIBLE_DEVICES`, when set: only those GPUs are planned
    /// (`resources::visible`).
    pub cuda_visible_devices: Option<String>,
    pub torch_threads: Option<TorchThreads>,
    pub worker_binary: PathBuf,
    pub log_json: bool,
    /// `--access-log`: one line per answered request.
    pub access_log: bool,
    /// `--api-key-file` (absolute), checked: the serving port requires a key from it.
    pub api_key_file: Option<PathBuf>,
    /// `--metrics-api-key-file` (absolute), checked: `/metrics` requires a key from it.
    pub metrics_api_key_file: Option<PathBuf>,
    /// `--tls-cert`, `--tls-key`, `--tls-client-ca` (absolute), checked: both ports serve
    /// HTTPS.
    pub tls: Option<crate::tls::TlsFiles>,
    /// The key and TLS files as read and checked for this configuration: what its workers
    /// get (`crate::secrets`), never the files as they are later.
    pub secrets: std::sync::Arc<crate::secrets::Secrets>,
}

/// The most `--warmup-passes` accepted: more passes than this buy nothing and delay every
/// worker's boot.
const MAX_WARMUP_PASSES: u32 = 100;

/// A configuration error: printed as one line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Where a value came from, for messages: `--port` or `VRAMFORK_PORT`.
fn origin(flag: &str, env: &dyn Fn(&str) -> Option<String>, from_cli_args: bool) -> String {
    let var = OPTION_ENV
        .iter()
        .find(|(f, _)| *f == flag)
        .map(|(_, v)| *v)
        .unwrap_or("");
    if !from_cli_args && env(var).is_some() {
        format!("{var} (for {flag})")
    } else {
        flag.to_string()
    }
}

struct Checker<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    args: &'a [String],
}

impl Checker<'_> {
    fn name(&self, flag: &str) -> String {
        let on_cli = self
            .args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        origin(flag, self.env, on_cli)
    }

    fn bad(&self, flag: &str, value: &str, allowed: &str) -> ConfigError {
        ConfigError(format!(
            "invalid value '{value}' for {}: {allowed}",
            self.name(flag)
        ))
    }

    fn uint(
        &self,
        flag: &str,
        v: Option<&str>,
        default: u64,
        min: u64,
    ) -> Result<u64, ConfigError> {
        let Some(v) = v else { return Ok(default) };
        match v.trim().parse::<u64>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(self.bad(flag, v, &format!("expected a whole number ≥ {min}"))),
        }
    }

    fn seconds(&self, flag: &str, v: Option<&str>, default: f64) -> Result<Duration, ConfigError> {
        let Some(v) = v else {
            return Ok(Duration::from_secs_f64(default));
        };
        match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s <= 1e7 => Ok(Duration::from_secs_f64(s)),
            _ => Err(self.bad(flag, v, "expected a number of seconds > 0 (e.g. 30 or 0.5)")),
        }
    }
}

impl Checker<'_> {
    /// Seconds ≥ 0, where 0 turns the limit off.
    fn seconds_or_off(
        &self,
        flag: &str,
        v: Option<&str>,
        default: f64,
    ) -> Result<Option<Duration>, ConfigError> {
        match v.map(str::trim) {
            Some("0") => Ok(None),
            Some(s) if s.parse::<f64>() == Ok(0.0) => Ok(None),
            _ => self.seconds(flag, v, default).map(Some).map_err(|_| {
                self.bad(
                    flag,
                    v.unwrap_or_default(),
                    "expected a number of seconds ≥ 0 (e.g. 10 or 0.5; 0 = no limit)",
                )
            }),
        }
    }
}

impl Config {
    /// The model's path as text (empty when there is none), for messages and workers.
    pub fn model_display(&self) -> String {
        self.model_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    /// Validates the parsed command line. `env` reads environment variables (the process
    /// environment in `app`, a map in tests); `args` are the raw arguments, used only to say
    /// whether a bad value came from a flag or a variable.
    pub fn from_cli(
        cli: Cli,
        env: &dyn Fn(&str) -> Option<String>,
        args: &[String],
        exe_dir: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        for (flag, var) in OPTION_ENV {
            if let Some(v) = env(var) {
                if v.trim().is_empty() {
                    return Err(ConfigError(format!(
                        "{var} (for {flag}) is set but empty: unset it or give a value"
                    )));
                }
            }
        }
        let c = Checker { env, args };
        let mode = match cli.command {
            Some(Command::Plan { json, measure }) => Mode::Plan { json, measure },
            None if cli.production => Mode::Production,
            None => Mode::Develop,
        };

        let metadata_path = cli
            .metadata
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("app-metadata.json"));
        let metadata_path = absolute(&metadata_path);
        let metadata = AppMetadata::load(&metadata_path).map_err(|e| ConfigError(e.to_string()))?;
        let model_override = cli.model.map(|m| absolute(Path::new(&m)));
        let model_path = model_override.clone().or_else(|| metadata.model.clone());
        if model_path.is_none() && !matches!(mode, Mode::Plan { measure: false, .. }) {
            return Err(ConfigError(format!(
                "no model to serve: set `model` in {} or pass --model FILE",
                metadata_path.display()
            )));
        }

        let address_given = cli.host.is_some() || cli.port.is_some();
        let host = cli.host.unwrap_or_else(|| "127.0.0.1".to_string());
        if host.trim().is_empty() || host.contains(char::is_whitespace) {
            return Err(c.bad(
                "--host",
                &host,
                "expected an address such as 127.0.0.1 or 0.0.0.0",
            ));
        }
        let port = match cli.port.as_deref() {
            None => 5000,
            Some(p) => p.trim().parse::<u16>().map_err(|_| {
                c.bad(
                    "--port",
                    p,
                    "expected a port number 0..65535 (0 = any free port)",
                )
            })?,
        };

        let metrics_port = match cli.metrics_port.as_deref() {
            None => None,
            Some(p) => Some(p.trim().parse::<u16>().map_err(|_| {
                c.bad(
                    "--metrics-port",
                    p,
                    "expected a port number 0..65535 (0 = any free port)",
                )
            })?),
        };
        if metrics_port.is_some_and(|m| m != 0 && m == port) {
            return Err(ConfigError(format!(
                "--metrics-port {port} is the serving port (--port): give metrics a port of their own"
            )));
        }
        let api_key_file = key_file(cli.api_key_file.as_deref());
        let metrics_api_key_file = key_file(cli.metrics_api_key_file.as_deref());
        if metrics_api_key_file.is_some() && metrics_port.is_none() {
            return Err(ConfigError(
                "--metrics-api-key-file protects --metrics-port's /metrics: give --metrics-port too"
                    .into(),
            ));
        }
        let tls = tls_files(
            &c,
            cli.tls_cert.as_deref(),
            cli.tls_key.as_deref(),
            cli.tls_client_ca.as_deref(),
        )?;
        let secrets = read_secrets(&c, &api_key_file, &metrics_api_key_file, &tls)?;
        let workers_override = worker_override(&cli.workers, env, &c)?;
        let max_requests = c.uint("--max-requests", cli.max_requests.as_deref(), 0, 0)?;
        let max_requests_jitter = c.uint(
            "--max-requests-jitter",
            cli.max_requests_jitter.as_deref(),
            0,
            0,
        )?;
        let timeout = c.seconds("--timeout", cli.timeout.as_deref(), 30.0)?;
        let boot_timeout = c.seconds("--boot-timeout", cli.boot_timeout.as_deref(), 300.0)?;
        let graceful_timeout =
            c.seconds("--graceful-timeout", cli.graceful_timeout.as_deref(), 30.0)?;
        let request_timeout =
            c.seconds("--request-timeout", cli.request_timeout.as_deref(), 120.0)?;
        let max_queue_wait =
            c.seconds_or_off("--max-queue-wait", cli.max_queue_wait.as_deref(), 10.0)?;
        let max_batch_size_override = match cli.max_batch_size.as_deref() {
            None => None,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if n <= MAX_BATCH_SIZE_LIMIT => Some(n),
                _ => {
                    return Err(c.bad(
                        "--max-batch-size",
                        v,
                        &format!(
                            "expected a whole number 0..={MAX_BATCH_SIZE_LIMIT} (0 = no batching)"
                        ),
                    ))
                }
            },
        };
        let batch_timeout_ms =
            c.uint("--batch-timeout-ms", cli.batch_timeout_ms.as_deref(), 0, 0)?;
        if batch_timeout_ms > 60_000 {
            return Err(c.bad(
                "--batch-timeout-ms",
                &batch_timeout_ms.to_string(),
                "at most 60000 ms",
            ));
        }
        let batch_timeout = Duration::from_millis(batch_timeout_ms);
        let max_batch_size = batching(&metadata, max_batch_size_override, batch_timeout, &c)?;
        let warmup_passes = match cli.warmup_passes.as_deref() {
            None => DEFAULT_WARMUP_PASSES,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if n <= MAX_WARMUP_PASSES => n,
                _ => {
                    return Err(c.bad(
                        "--warmup-passes",
                        v,
                        &format!(
                            "expected a whole number 0..={MAX_WARMUP_PASSES} (0 = no warm-up pass)"
                        ),
                    ))
                }
            },
        };
        let profile_memory = match cli.profile_memory.as_deref().map(str::trim) {
            None | Some("auto") => None,
            Some("on") => Some(true),
            Some("off") => Some(false),
            Some(v) => return Err(c.bad("--profile-memory", v, "expected auto, on or off")),
        };
        let memory_headroom = match cli.memory_headroom.as_deref() {
            None => 1.2,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(f) if (1.0..=10.0).contains(&f) => f,
                _ => {
                    return Err(c.bad(
                        "--memory-headroom",
                        v,
                        "expected a factor from 1 to 10 (e.g. 1.2)",
                    ))
                }
            },
        };
        if let Some(wait) = max_queue_wait.filter(|w| max_batch_size > 0 && batch_timeout >= *w) {
            return Err(ConfigError(format!(
                "{} {} is not shorter than {} ({} s): a request waiting for its batch to fill would be refused (503) before it ran",
                c.name("--batch-timeout-ms"),
                batch_timeout.as_millis(),
                c.name("--max-queue-wait"),
                wait.as_secs_f64()
            )));
        }
        let device = match cli.device.as_deref() {
            None | Some("auto") => Device::Auto,
            Some("cpu") => Device::Cpu,
            Some("cuda") => Device::Cuda,
            Some(d) => return Err(c.bad("--device", d, "expected auto, cpu or cuda")),
        };
        let max_body_mb = c.uint("--max-body-mb", cli.max_body_mb.as_deref(), 64, 1)?;
        if max_body_mb > 1 << 20 {
            return Err(c.bad(
                "--max-body-mb",
                &max_body_mb.to_string(),
                "at most 1048576 MB",
            ));
        }
        let gpu_memory_utilization = match cli.gpu_memory_utilization.as_deref() {
            None => None,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(f) if f > 0.0 && f <= 1.0 => Some(f),
                _ => {
                    return Err(c.bad(
                        "--gpu-memory-utilization",
                        v,
                        "expected a fraction greater than 0 and at most 1 (e.g. 0.9)",
                    ))
                }
            },
        };
        let gpu_reserve_mb = c.uint("--gpu-reserve-mb", cli.gpu_reserve_mb.as_deref(), 500, 0)?;
        let max_worker_gpu_mb = match cli.max_worker_gpu_mb.as_deref() {
            None => None,
            Some(v) => Some(c.uint("--max-worker-gpu-mb", Some(v), 0, 1)?),
        };
        let torch_threads = torch_threads(&cli.torch_threads, env, &c)?;
        let nvml_library = cli.nvml_library.map(|p| absolute(Path::new(&p)));
        if let Some(p) = &nvml_library {
            if !p.is_file() {
                return Err(c.bad(
                    "--nvml-library",
                    &p.display().to_string(),
                    "no such file (expected the path of libnvidia-ml.so.1 or a compatible library)",
                ));
            }
        }
        if cli.simulated_gpus && nvml_library.is_none() {
            return Err(c.bad(
                "--simulated-gpus",
                "true",
                "it is for tests with a simulated NVML: give --nvml-library too (on real GPUs it would serve on the CPU)",
            ));
        }
        let log_json = match cli.log_format.as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(v) => return Err(c.bad("--log-format", v, "expected text or json")),
        };
        let worker_binary = match cli.worker_binary {
            Some(p) => absolute(Path::new(&p)),
            None => exe_dir
                .map(|d| d.join("app-worker"))
                .unwrap_or_else(|| PathBuf::from("app-worker")),
        };
        if !matches!(mode, Mode::Plan { measure: false, .. }) && !worker_binary.is_file() {
            return Err(ConfigError(format!(
                "worker binary {} not found: build it (cargo build --workspace) or pass --worker-binary FILE",
                worker_binary.display()
            )));
        }

        Ok(Config {
            mode,
            metadata,
            model_path,
            model_override,
            host,
            port,
            metrics_port,
            address_given,
            workers_override,
            max_requests,
            max_requests_jitter,
            timeout,
            boot_timeout,
            graceful_timeout,
            request_timeout,
            max_queue_wait,
            max_batch_size,
            max_batch_size_override,
            batch_timeout,
            warmup_passes,
            profile_memory,
            memory_headroom,
            adapt_workers: cli.adapt_workers,
            footprint_file: cli.footprint_file.map(|p| absolute(Path::new(&p))),
            device,
            max_body_bytes: max_body_mb << 20,
            gpu_memory_utilization,
            gpu_reserve_mb,
            max_worker_gpu_mb,
            nvml_library,
            simulated_gpus: cli.simulated_gpus,
            cuda_visible_devices: env("CUDA_VISIBLE_DEVICES"),
            torch_threads,
            worker_binary,
            log_json,
            access_log: cli.access_log,
            api_key_file,
            metrics_api_key_file,
            tls,
            secrets: std::sync::Arc::new(secrets),
        })
    }

    /// This configuration with the metadata read again (SIGHUP). Errors leave `self` as is.
    pub fn reloaded(&self) -> Result<Config, ConfigError> {
        let metadata =
            AppMetadata::load(&self.metadata.path).map_err(|e| ConfigError(e.to_string()))?;
        let model_path = self
            .model_override
            .clone()
            .or_else(|| metadata.model.clone());
        if model_path.is_none() {
            return Err(ConfigError(format!(
                "no model to serve: {} has no `model`",
                self.metadata.path.display()
            )));
        }
        let c = Checker {
            env: &|_| None,
            args: &[],
        };
        // The key and TLS files are read again: a HUP is how new keys are rolled out, and
        // what it accepts is what the workers it starts get (`crate::secrets`).
        let secrets = read_secrets(
            &c,
            &self.api_key_file,
            &self.metrics_api_key_file,
            &self.tls,
        )?;
        let max_batch_size = batching(
            &metadata,
            self.max_batch_size_override,
            self.batch_timeout,
            &c,
        )?;
        Ok(Config {
            metadata,
            model_path,
            max_batch_size,
            secrets: std::sync::Arc::new(secrets),
            ..self.clone()
        })
    }

    /// The planning policy this configuration asks for.
    pub fn policy(&self) -> Policy {
        Policy {
            workers_override: self.workers_override,
            device: self.device,
            gpu_memory_utilization: self.gpu_memory_utilization,
            gpu_reserve_mb: self.gpu_reserve_mb,
            torch_threads: self.torch_threads,
        }
    }
}

/// The rows per forward pass: `--max-batch-size` over the metadata's `max_batch_size`,
/// checked against the declared inputs and `--batch-timeout-ms`.
fn batching(
    metadata: &AppMetadata,
    flag: Option<u32>,
    timeout: Duration,
    c: &Checker<'_>,
) -> Result<u32, ConfigError> {
    let size = flag.unwrap_or(metadata.max_batch_size);
    if let Some(msg) = crate::metadata::unbatchable_input(metadata.inputs.as_deref(), size) {
        return Err(ConfigError(format!(
            "{}: {msg}",
            c.name("--max-batch-size")
        )));
    }
    if size == 0 && !timeout.is_zero() {
        return Err(ConfigError(format!(
            "{} {} has no effect without batching: set `max_batch_size` in {} or pass --max-batch-size N",
            c.name("--batch-timeout-ms"),
            timeout.as_millis(),
            metadata.path.display()
        )));
    }
    Ok(size)
}

/// `--workers` > `VRAMFORK_WORKERS` > `CLAMS_GUNICORN_WORKERS` > the plan. Zero, negative,
/// empty or non-numeric values are errors, whichever form they came in.
fn worker_override(
    cli_value: &Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
    c: &Checker<'_>,
) -> Result<Option<WorkerOverride>, ConfigError> {
    let allowed = "expected a whole number of workers ≥ 1";
    let parse = |v: &str| v.trim().parse::<u32>().ok().filter(|n| *n >= 1);
    if let Some(v) = cli_value {
        let on_cli = c
            .args
            .iter()
            .any(|a| a == "--workers" || a.starts_with("--workers="));
        let source = if on_cli {
            "--workers"
        } else {
            "VRAMFORK_WORKERS"
        };
        return match parse(v) {
            Some(count) => Ok(Some(WorkerOverride { count, source })),
            None => Err(c.bad("--workers", v, allowed)),
        };
    }
    match env("CLAMS_GUNICORN_WORKERS") {
        None => Ok(None),
        Some(v) => match parse(&v) {
            Some(count) => Ok(Some(WorkerOverride {
                count,
                source: "CLAMS_GUNICORN_WORKERS",
            })),
            None => Err(ConfigError(format!(
                "invalid value '{v}' for CLAMS_GUNICORN_WORKERS (worker count): {allowed}"
            ))),
        },
    }
}

/// Torch intra-op threads per worker: `--torch-threads` > `VRAMFORK_TORCH_THREADS` >
/// `MKL_NUM_THREADS` > `OMP_NUM_THREADS` > the plan (`max(1, cores / workers)`). The two
/// libraries' variables are read in libtorch's own order (`at::intraop_default_num_threads`
/// lets `MKL_NUM_THREADS` override `OMP_NUM_THREADS`), so an operator who set them for torch
/// gets what torch would have done; libgomp's list form (`4,2`: per nesting level) gives its
/// first number. Anything else in them is an error naming the variable, as for our own.
fn torch_threads(
    cli_value: &Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
    c: &Checker<'_>,
) -> Result<Option<TorchThreads>, ConfigError> {
    if let Some(v) = cli_value {
        let on_cli = c
            .args
            .iter()
            .any(|a| a == "--torch-threads" || a.starts_with("--torch-threads="));
        let source = if on_cli {
            "--torch-threads"
        } else {
            "VRAMFORK_TORCH_THREADS"
        };
        let count = c.uint("--torch-threads", Some(v), 0, 1)? as usize;
        return Ok(Some(TorchThreads { count, source }));
    }
    for source in ["MKL_NUM_THREADS", "OMP_NUM_THREADS"] {
        let Some(v) = env(source) else { continue };
        let first = v.split(',').next().unwrap_or("").trim();
        return match first.parse::<usize>() {
            Ok(count) if count >= 1 => Ok(Some(TorchThreads { count, source })),
            _ => Err(ConfigError(format!(
                "invalid value '{v}' for {source} (torch's intra-op threads per worker): \
                 expected a whole number ≥ 1 (or unset it and use --torch-threads)"
            ))),
        };
    }
    Ok(None)
}

/// A key file option's path (read by [`read_secrets`]).
fn key_file(v: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    v.map(|v| absolute(Path::new(v)))
}

/// Reads the key and TLS files once and checks them: the keys must be valid and the TLS
/// files make a working server configuration. What this returns is what the workers of
/// this configuration serve with (`crate::secrets`), whatever the files become later.
fn read_secrets(
    c: &Checker,
    api_key_file: &Option<PathBuf>,
    metrics_api_key_file: &Option<PathBuf>,
    tls: &Option<crate::tls::TlsFiles>,
) -> Result<crate::secrets::Secrets, ConfigError> {
    let mut stamps = Vec::new();
    let mut keys = |flag: &'static str, f: &Option<PathBuf>| {
        let Some(f) = f else { return Ok(None) };
        let named = |e: String| ConfigError(format!("{}: {e}", c.name(flag)));
        stamps.push((flag, f.clone(), crate::files::stamp(f)));
        let text = crate::auth::ApiKeys::read(f).map_err(named)?;
        crate::auth::ApiKeys::parse(&text)
            .map_err(|e| named(format!("API key file {}: {e}", f.display())))?;
        Ok::<_, ConfigError>(Some(text))
    };
    let api = keys("--api-key-file", api_key_file)?;
    let metrics = keys("--metrics-api-key-file", metrics_api_key_file)?;
    let tls = tls.as_ref().map(|t| check_tls(c, t)).transpose()?;
    Ok(stamps.into_iter().fold(
        crate::secrets::Secrets::new(api, metrics, tls),
        |s, (flag, path, stamp)| s.with_key_file(flag, &path, stamp),
    ))
}

/// `--tls-cert`, `--tls-key`, `--tls-client-ca`: all or nothing (the CA only with the
/// other two), and the files must make a working server configuration.
fn tls_files(
    c: &Checker,
    cert: Option<&std::ffi::OsStr>,
    key: Option<&std::ffi::OsStr>,
    client_ca: Option<&std::ffi::OsStr>,
) -> Result<Option<crate::tls::TlsFiles>, ConfigError> {
    let files = match (cert, key) {
        (None, None) => {
            if client_ca.is_some() {
                return Err(ConfigError(format!(
                    "{} asks for client certificates over TLS: give {} and {} too",
                    c.name("--tls-client-ca"),
                    c.name("--tls-cert"),
                    c.name("--tls-key")
                )));
            }
            return Ok(None);
        }
        (Some(_), None) => {
            return Err(ConfigError(format!(
                "{} needs {} (its private key)",
                c.name("--tls-cert"),
                c.name("--tls-key")
            )))
        }
        (None, Some(_)) => {
            return Err(ConfigError(format!(
                "{} needs {} (the certificate it is the key of)",
                c.name("--tls-key"),
                c.name("--tls-cert")
            )))
        }
        (Some(cert), Some(key)) => crate::tls::TlsFiles {
            cert: absolute(Path::new(cert)),
            key: absolute(Path::new(key)),
            client_ca: client_ca.map(|p| absolute(Path::new(p))),
        },
    };
    Ok(Some(files))
}

fn check_tls(
    c: &Checker,
    files: &crate::tls::TlsFiles,
) -> Result<crate::tls::TlsMaterial, ConfigError> {
    files.read().map_err(|e| {
        ConfigError(format!(
            "TLS ({}, {}{}): {e}",
            c.name("--tls-cert"),
            c.name("--tls-key"),
            if files.client_ca.is_some() {
                format!(", {}", c.name("--tls-client-ca"))
            } else {
                String::new()
            }
        ))
    })
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::collections::HashMap;

    struct Env {
        dir: tempfile::TempDir,
        vars: HashMap<String, String>,
    }

    impl Env {
        fn new() -> Env {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(
                dir.path().join("meta.json"),
                r#"{"name": "t", "model": "m.pt", "est_gpu_mem_typ": 10}"#,
            )
            .unwrap();
            std::fs::write(dir.path().join("app-worker"), "").unwrap();
            Env {
                dir,
                vars: HashMap::new(),
            }
        }

        fn var(mut self, k: &str, v: &str) -> Env {
            self.vars.insert(k.into(), v.into());
            self
        }

        fn run(&self, args: &[&str]) -> Result<Config, String> {
            let meta = self.dir.path().join("meta.json");
            let mut argv: Vec<String> = vec![
                "app".into(),
                "--metadata".into(),
                meta.display().to_string(),
            ];
            argv.extend(args.iter().map(|s| s.to_string()));
            // clap reads the real environment for `env = …`; tests pass variables by hand.
            let mut cli = Cli::try_parse_from(&argv).map_err(|e| e.to_string())?;
            let get = |k: &str| self.vars.get(k).cloned();
            for (flag, var) in OPTION_ENV {
                if let Some(v) = get(var) {
                    apply_env(&mut cli, flag, v, &argv);
                }
            }
            Config::from_cli(cli, &get, &argv, Some(self.dir.path())).map_err(|e| e.0)
        }
    }

    /// What clap's `env = …` does, for the few options these tests set through variables.
    fn apply_env(cli: &mut Cli, flag: &str, v: String, argv: &[String]) {
        if argv.iter().any(|a| a == flag) {
            return;
        }
        match flag {
            "--workers" => cli.workers = Some(v),
            "--port" => cli.port = Some(v),
            "--device" => cli.device = Some(v),
            "--timeout" => cli.timeout = Some(v),
            "--max-batch-size" => cli.max_batch_size = Some(v),
            "--profile-memory" => cli.profile_memory = Some(v),
            "--memory-headroom" => cli.memory_headroom = Some(v),
            "--batch-timeout-ms" => cli.batch_timeout_ms = Some(v),
            "--torch-threads" => cli.torch_threads = Some(v),
            _ => {}
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let c = Env::new().run(&[]).unwrap();
        assert_eq!(c.mode, Mode::Develop);
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 5000));
        assert_eq!(c.max_requests, 0);
        assert_eq!(c.timeout, Duration::from_secs(30));
        assert_eq!(c.boot_timeout, Duration::from_secs(300));
        assert_eq!(c.graceful_timeout, Duration::from_secs(30));
        assert_eq!(c.request_timeout, Duration::from_secs(120));
        assert_eq!(c.max_queue_wait, Some(Duration::from_secs(10)));
        assert_eq!(c.device, Device::Auto);
        assert_eq!(c.max_body_bytes, 64 << 20);
        assert_eq!(c.gpu_reserve_mb, 500);
        assert!(c.workers_override.is_none() && c.max_worker_gpu_mb.is_none());
        assert!(c.model_path.unwrap().ends_with("m.pt"));
    }

    #[test]
    fn profiling_options_are_checked() {
        let e = Env::new();
        let c = e.run(&[]).unwrap();
        assert_eq!((c.profile_memory, c.memory_headroom), (None, 1.2));
        let c = e
            .run(&["--profile-memory", "off", "--memory-headroom", "1.5"])
            .unwrap();
        assert_eq!((c.profile_memory, c.memory_headroom), (Some(false), 1.5));
        assert_eq!(
            e.run(&["--profile-memory", "on"]).unwrap().profile_memory,
            Some(true)
        );
        for (args, want) in [
            (
                &["--profile-memory", "yes"][..],
                "invalid value 'yes' for --profile-memory: expected auto, on or off",
            ),
            (
                &["--memory-headroom", "0.9"][..],
                "invalid value '0.9' for --memory-headroom: expected a factor from 1 to 10",
            ),
            (&["--memory-headroom", "x"][..], "'x' for --memory-headroom"),
        ] {
            let err = e.run(args).unwrap_err();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }

    #[test]
    fn batching_comes_from_the_metadata_or_the_flag() {
        let e = Env::new();
        let c = e.run(&[]).unwrap();
        assert_eq!((c.max_batch_size, c.batch_timeout), (0, Duration::ZERO));
        std::fs::write(
            e.dir.path().join("meta.json"),
            r#"{"name": "t", "model": "m.pt", "max_batch_size": 8, "input": {"shape": [-1, 4]}}"#,
        )
        .unwrap();
        assert_eq!(e.run(&[]).unwrap().max_batch_size, 8);
        let c = e
            .run(&["--max-batch-size", "32", "--batch-timeout-ms", "5"])
            .unwrap();
        assert_eq!(
            (c.max_batch_size, c.batch_timeout),
            (32, Duration::from_millis(5))
        );
        assert_eq!(e.run(&["--max-batch-size", "0"]).unwrap().max_batch_size, 0);
        for (args, want) in [
            (
                &["--max-batch-size", "-1"][..],
                "invalid value '-1' for --max-batch-size: expected a whole number 0..=4096",
            ),
            (
                &["--max-batch-size", "5000"][..],
                "'5000' for --max-batch-size",
            ),
            (
                &["--batch-timeout-ms", "0.5"][..],
                "invalid value '0.5' for --batch-timeout-ms",
            ),
            (
                &["--batch-timeout-ms", "60001"][..],
                "'60001' for --batch-timeout-ms: at most 60000 ms",
            ),
            (
                &["--max-batch-size", "0", "--batch-timeout-ms", "5"][..],
                "--batch-timeout-ms 5 has no effect without batching",
            ),
            (
                &["--batch-timeout-ms", "2000", "--max-queue-wait", "2"][..],
                "--batch-timeout-ms 2000 is not shorter than --max-queue-wait (2 s)",
            ),
        ] {
            let err = e.run(args).unwrap_err();
            assert!(err.contains(want), "{args:?}: {err}");
        }
        std::fs::write(
            e.dir.path().join("meta.json"),
            r#"{"name": "t", "model": "m.pt", "input": {"shape": []}}"#,
        )
        .unwrap();
        let err = e.run(&["--max-batch-size", "4"]).unwrap_err();
        assert!(
            err.contains(
                "--max-batch-size: batching (max_batch_size 4) needs a leading batch dimension"
            ),
            "{err}"
        );
    }

    #[test]
    fn warmup_passes_default_to_2_and_bad_ones_are_named() {
        let e = Env::new();
        assert_eq!(e.run(&[]).unwrap().warmup_passes, 2);
        assert_eq!(e.run(&["--warmup-passes", "0"]).unwrap().warmup_passes, 0);
        assert_eq!(
            e.run(&["--warmup-passes", "100"]).unwrap().warmup_passes,
            100
        );
        for v in ["-1", "101", "two", "1.5", ""] {
            let err = e.run(&["--warmup-passes", v]).unwrap_err();
            assert!(
                err.contains(&format!(
                    "invalid value '{v}' for --warmup-passes: expected a whole number 0..=100 (0 = no warm-up pass)"
                )),
                "{v}: {err}"
            );
        }
    }

    #[test]
    fn max_queue_wait_is_seconds_or_0_for_off() {
        let e = Env::new();
        let c = e.run(&["--max-queue-wait", "2.5"]).unwrap();
        assert_eq!(c.max_queue_wait, Some(Duration::from_millis(2500)));
        assert_eq!(
            e.run(&["--max-queue-wait", "0"]).unwrap().max_queue_wait,
            None
        );
        assert_eq!(
            e.run(&["--max-queue-wait", "0.0"]).unwrap().max_queue_wait,
            None
        );
        for bad in ["-1", "soon", "inf"] {
            let err = e.run(&["--max-queue-wait", bad]).unwrap_err();
            assert!(
                err.contains("--max-queue-wait")
                    && err.contains(bad)
                    && err.contains("0 = no limit"),
                "{err}"
            );
        }
    }

    #[test]
    fn modes() {
        let e = Env::new();
        assert_eq!(e.run(&["--production"]).unwrap().mode, Mode::Production);
        assert_eq!(
            e.run(&["plan", "--json"]).unwrap().mode,
            Mode::Plan {
                json: true,
                measure: false
            }
        );
        assert_eq!(
            e.run(&["plan"]).unwrap().mode,
            Mode::Plan {
                json: false,
                measure: false
            }
        );
    }

    #[test]
    fn worker_override_precedence() {
        let e = Env::new()
            .var("VRAMFORK_WORKERS", "3")
            .var("CLAMS_GUNICORN_WORKERS", "5");
        let o = e
            .run(&["--workers", "2"])
            .unwrap()
            .workers_override
            .unwrap();
        assert_eq!((o.count, o.source), (2, "--workers"));
        let o = e.run(&[]).unwrap().workers_override.unwrap();
        assert_eq!((o.count, o.source), (3, "VRAMFORK_WORKERS"));
        let e = Env::new().var("CLAMS_GUNICORN_WORKERS", "5");
        let o = e.run(&[]).unwrap().workers_override.unwrap();
        assert_eq!((o.count, o.source), (5, "CLAMS_GUNICORN_WORKERS"));
    }

    #[test]
    fn torch_threads_precedence_follows_the_flag_then_torchs_own_variables() {
        let t = |e: &Env, args: &[&str]| {
            e.run(args)
                .unwrap()
                .torch_threads
                .map(|t| (t.count, t.source))
        };
        let all = Env::new()
            .var("VRAMFORK_TORCH_THREADS", "3")
            .var("MKL_NUM_THREADS", "5")
            .var("OMP_NUM_THREADS", "7");
        assert_eq!(
            t(&all, &["--torch-threads", "2"]),
            Some((2, "--torch-threads"))
        );
        assert_eq!(t(&all, &[]), Some((3, "VRAMFORK_TORCH_THREADS")));
        let libs = Env::new()
            .var("MKL_NUM_THREADS", "5")
            .var("OMP_NUM_THREADS", "7");
        assert_eq!(t(&libs, &[]), Some((5, "MKL_NUM_THREADS")));
        let omp = Env::new().var("OMP_NUM_THREADS", "4,2");
        assert_eq!(t(&omp, &[]), Some((4, "OMP_NUM_THREADS")));
        assert_eq!(t(&Env::new(), &[]), None);
        for bad in ["0", "two", "", "-1"] {
            let e = Env::new().var("OMP_NUM_THREADS", bad).run(&[]).unwrap_err();
            assert!(
                e.contains("OMP_NUM_THREADS") && e.contains(&format!("'{bad}'")),
                "{e}"
            );
        }
    }

    #[test]
    fn invalid_worker_overrides_are_errors_naming_their_source() {
        for bad in ["0", "-1", "two", "1.5"] {
            let e = Env::new().run(&["--workers", bad]).unwrap_err();
            assert!(e.contains("--workers") && e.contains(bad), "{e}");
            let e = Env::new()
                .var("VRAMFORK_WORKERS", bad)
                .run(&[])
                .unwrap_err();
            assert!(e.contains("VRAMFORK_WORKERS") && e.contains(bad), "{e}");
            let e = Env::new()
                .var("CLAMS_GUNICORN_WORKERS", bad)
                .run(&[])
                .unwrap_err();
            assert!(
                e.contains("CLAMS_GUNICORN_WORKERS") && e.contains(bad),
                "{e}"
            );
        }
        let e = Env::new().var("VRAMFORK_WORKERS", "").run(&[]).unwrap_err();
        assert!(e.contains("VRAMFORK_WORKERS") && e.contains("empty"), "{e}");
        let e = Env::new()
            .var("CLAMS_GUNICORN_WORKERS", " ")
            .run(&[])
            .unwrap_err();
        assert!(e.contains("CLAMS_GUNICORN_WORKERS"), "{e}");
    }

    #[test]
    fn invalid_values_name_option_value_and_allowed() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--port", "70000"],
                "'70000' for --port: expected a port number",
            ),
            (&["--port", "http"], "'http' for --port"),
            (
                &["--timeout", "0"],
                "'0' for --timeout: expected a number of seconds > 0",
            ),
            (&["--boot-timeout", "-5"], "'-5' for --boot-timeout"),
            (
                &["--request-timeout", "soon"],
                "'soon' for --request-timeout",
            ),
            (
                &["--graceful-timeout", "inf"],
                "'inf' for --graceful-timeout",
            ),
            (
                &["--max-requests", "-1"],
                "'-1' for --max-requests: expected a whole number ≥ 0",
            ),
            (
                &["--max-requests-jitter", "x"],
                "'x' for --max-requests-jitter",
            ),
            (
                &["--device", "tpu"],
                "'tpu' for --device: expected auto, cpu or cuda",
            ),
            (
                &["--max-body-mb", "0"],
                "'0' for --max-body-mb: expected a whole number ≥ 1",
            ),
            (
                &["--gpu-memory-utilization", "1.5"],
                "'1.5' for --gpu-memory-utilization",
            ),
            (
                &["--gpu-memory-utilization", "0"],
                "'0' for --gpu-memory-utilization",
            ),
            (&["--gpu-reserve-mb", "lots"], "'lots' for --gpu-reserve-mb"),
            (&["--max-worker-gpu-mb", "0"], "'0' for --max-worker-gpu-mb"),
            (&["--torch-threads", "0"], "'0' for --torch-threads"),
            (
                &["--log-format", "xml"],
                "'xml' for --log-format: expected text or json",
            ),
            (
                &["--nvml-library", "/nonexistent/libnvml.so"],
                "for --nvml-library: no such file",
            ),
            (&["--host", ""], "for --host"),
        ];
        for (args, want) in cases {
            let e = Env::new().run(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: got {e:?}, want {want:?}");
        }
    }

    #[test]
    fn env_values_are_named_by_variable() {
        let e = Env::new().var("VRAMFORK_PORT", "x").run(&[]).unwrap_err();
        assert!(e.contains("VRAMFORK_PORT (for --port)"), "{e}");
        let e = Env::new()
            .var("VRAMFORK_DEVICE", "gpu")
            .run(&[])
            .unwrap_err();
        assert!(e.contains("VRAMFORK_DEVICE (for --device)"), "{e}");
        // a flag beats the variable
        let c = Env::new()
            .var("VRAMFORK_PORT", "x")
            .run(&["--port", "8080"])
            .unwrap();
        assert_eq!(c.port, 8080);
    }

    #[test]
    fn missing_model_and_worker_binary_are_errors() {
        let e = Env::new();
        std::fs::write(e.dir.path().join("meta.json"), r#"{"name": "t"}"#).unwrap();
        let err = e.run(&[]).unwrap_err();
        assert!(
            err.contains("no model to serve") && err.contains("--model"),
            "{err}"
        );
        assert!(e.run(&["plan"]).is_ok(), "plan needs no model");
        let e = Env::new();
        let err = e
            .run(&["--worker-binary", "/nonexistent/app-worker"])
            .unwrap_err();
        assert!(
            err.contains("worker binary /nonexistent/app-worker not found"),
            "{err}"
        );
    }

    #[test]
    fn metadata_errors_are_config_errors() {
        let e = Env::new();
        std::fs::write(e.dir.path().join("meta.json"), r#"{"name": 1}"#).unwrap();
        let err = e.run(&[]).unwrap_err();
        assert!(err.contains("field `name` must be a string"), "{err}");
        std::fs::remove_file(e.dir.path().join("meta.json")).unwrap();
        let err = e.run(&[]).unwrap_err();
        assert!(
            err.contains("cannot read app metadata") && err.contains("meta.json"),
            "{err}"
        );
    }
}
