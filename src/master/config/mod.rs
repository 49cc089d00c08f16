//! `Config::from_cli`: turns the command line and the environment into one validated
//! configuration. This is the only module that reads the environment. Every invalid value is
//! an error naming the option (and the variable it came from), the value and what is allowed;
//! nothing is silently replaced by a default.
//!
//! | file | checks |
//! |---|---|
//! | `mod.rs` | [`Config`], the mode, the metadata and model; the order of the checks; a reload |
//! | `checker.rs` | how a value is read and an error names its option |
//! | `serving.rs` | the address, the per-worker limits and timeouts, the body limit |
//! | `access.rs` | API key files and TLS, read once into the workers' secrets |
//! | `batching.rs` | batching and warm-up passes |
//! | `devices.rs` | the device, GPU memory, NVML, measuring the footprint |
//! | `host_memory.rs` | host memory: recycling on a worker's own memory, the memory cgroup |
//! | `workers.rs` | the worker-count override and torch threads (precedence through other programs' variables) |

mod access;
mod batching;
mod checker;
mod devices;
mod host_memory;
mod serving;
mod workers;

use std::path::{Path, PathBuf};
use std::time::Duration;

use access::{read_secrets, Access};
use batching::{batching, Batch};
use checker::{absolute, Checker};
use devices::GpuMemory;
use host_memory::HostMemory;
use serving::{Address, Limits};
use workers::{torch_threads, worker_override};

use crate::master::cli::{Cli, Command, OPTION_ENV};
use crate::master::plan::{Policy, TorchThreads, WorkerOverride};
use crate::master::resources::mps::ClientLimit;
use crate::metadata::AppMetadata;
use crate::protocol::Device;

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
    /// `--model-name`: the model's v2 name, instead of the metadata's `name`.
    pub model_name: Option<String>,
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
    /// `--inline-passes`: `true` (auto) lets small CPU passes run on the event loop.
    pub inline_passes: bool,
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
    /// `--max-worker-memory-mb`: recycle a worker whose own host memory grew past this.
    pub max_worker_memory_mb: Option<u64>,
    /// `--memory-cgroup`: where the memory limit, usage and OOM kills are read (checked to
    /// be a cgroup's directory); `None`: this process's own cgroup.
    pub memory_cgroup: Option<PathBuf>,
    /// The GPU-memory ledger's directory (`--ledger`); `None`: off.
    pub ledger: Option<PathBuf>,
    /// `--idle-release`: retire the workers on GPUs after this long without a request
    /// (`master::supervisor::idle`); `None`: never.
    pub idle_release: Option<std::time::Duration>,
    pub nvml_library: Option<PathBuf>,
    /// `--mps`: `None` auto (detect the MPS control daemon), on or off.
    pub mps: Option<bool>,
    /// Where the MPS control daemon's socket would be (`CUDA_MPS_PIPE_DIRECTORY`).
    pub mps_pipe_directory: PathBuf,
    /// Whether MPS serves the GPUs: `--mps on`, or `auto` and the daemon was found
    /// (`resources::mps`, set by the bootstrap after probing). What the plan assumes.
    pub mps_on: bool,
    /// The inherited `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: under MPS it bounds the plan, and
    /// each worker's own limit is at most it.
    pub mps_client_limit: Option<ClientLimit>,
    /// The operator's allocator settings that bear on the cap.
    pub allocator: devices::AllocatorEnv,
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

/// A configuration error: printed as one line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// A variable of an option that is set but empty is an error, not "unset".
fn no_empty_variables(env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    for (flag, var) in OPTION_ENV {
        if let Some(v) = env(var) {
            if v.trim().is_empty() {
                return Err(ConfigError(format!(
                    "{var} (for {flag}) is set but empty: unset it or give a value"
                )));
            }
        }
    }
    Ok(())
}

/// The app metadata (`--metadata`) and the model to serve: `--model` (kept by a reload),
/// else the metadata's `model`; none is an error unless only the plan is printed.
fn metadata_and_model(
    metadata: Option<&std::ffi::OsStr>,
    model: Option<&std::ffi::OsStr>,
    mode: Mode,
) -> Result<(AppMetadata, Option<PathBuf>, Option<PathBuf>), ConfigError> {
    let metadata_path = metadata
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("app-metadata.json"));
    let metadata_path = absolute(&metadata_path);
    let metadata = AppMetadata::load(&metadata_path).map_err(|e| ConfigError(e.to_string()))?;
    let model_override = model.map(|m| absolute(Path::new(m)));
    let model_path = model_override.clone().or_else(|| metadata.model.clone());
    if model_path.is_none() && !matches!(mode, Mode::Plan { measure: false, .. }) {
        return Err(ConfigError(format!(
            "no model to serve: set `model` in {} or pass --model FILE",
            metadata_path.display()
        )));
    }
    Ok((metadata, model_override, model_path))
}

/// The longest `--model-name`: Kubernetes object names (an InferenceService's) have at most
/// 253 characters.
const MODEL_NAME_MAX: usize = 253;

/// `--model-name`: a v2 path segment (`/v2/models/NAME`), so no `/`, no control characters,
/// not blank, at most [`MODEL_NAME_MAX`] characters.
fn model_name(v: Option<String>, c: &Checker<'_>) -> Result<Option<String>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let ok = !v.trim().is_empty()
        && v.chars().count() <= MODEL_NAME_MAX
        && !v.chars().any(|ch| ch == '/' || ch.is_control());
    if !ok {
        return Err(c.bad(
            "--model-name",
            &v,
            &format!("expected a name of 1 to {MODEL_NAME_MAX} characters without '/' or control characters (such as an InferenceService's name)"),
        ));
    }
    Ok(Some(v))
}

/// The worker binary: `--worker-binary`, else `app-worker` beside `app`; it must exist
/// unless only the plan is printed.
fn worker_binary(
    flag: Option<std::ffi::OsString>,
    exe_dir: Option<&Path>,
    mode: Mode,
) -> Result<PathBuf, ConfigError> {
    let worker_binary = match flag {
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

    Ok(worker_binary)
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
    /// whether a bad value came from a flag or a variable. The options are checked in one
    /// order (so that of two bad values the same one is named first), each group by the file
    /// that owns it.
    pub fn from_cli(
        cli: Cli,
        env: &dyn Fn(&str) -> Option<String>,
        args: &[String],
        exe_dir: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        no_empty_variables(env)?;
        let c = Checker { env, args };
        let mode = match cli.command {
            Some(Command::Plan { json, measure }) => Mode::Plan { json, measure },
            None if cli.production => Mode::Production,
            None => Mode::Develop,
        };

        let (metadata, model_override, model_path) =
            metadata_and_model(cli.metadata.as_deref(), cli.model.as_deref(), mode)?;
        let model_name = model_name(cli.model_name.clone(), &c)?;
        let Address {
            host,
            port,
            metrics_port,
            address_given,
        } = Address::check(
            cli.host.clone(),
            cli.port.clone(),
            cli.metrics_port.clone(),
            &c,
        )?;
        let access = Access::check(&cli, metrics_port, &c)?;
        let workers_override = worker_override(&cli.workers, env, &c)?;
        let limits = Limits::check(&cli, &c)?;
        let batch = Batch::check(&cli, &metadata, &c)?;
        let (profile_memory, memory_headroom) = devices::profiling(&cli, &c)?;
        batch.check_queue_wait(limits.max_queue_wait, &c)?;
        let device = devices::device(cli.device.as_deref(), &c)?;
        let max_body_bytes = serving::max_body_bytes(cli.max_body_mb.as_deref(), &c)?;
        let gpu = GpuMemory::check(&cli, &c)?;
        let host_memory = HostMemory::check(&cli, &c)?;
        let torch_threads = torch_threads(&cli.torch_threads, env, &c)?;
        let nvml_library = devices::nvml_library(cli.nvml_library.clone(), cli.simulated_gpus, &c)?;
        let mps = devices::mps(cli.mps.as_deref(), &c)?;
        let allocator = devices::AllocatorEnv::read(env)?;
        let log_json = log_json(cli.log_format.as_deref(), &c)?;
        let worker_binary = worker_binary(cli.worker_binary, exe_dir, mode)?;
        Ok(Config {
            mode,
            metadata,
            model_path,
            model_override,
            model_name,
            host,
            port,
            metrics_port,
            address_given,
            workers_override,
            max_requests: limits.max_requests,
            max_requests_jitter: limits.max_requests_jitter,
            timeout: limits.timeout,
            boot_timeout: limits.boot_timeout,
            graceful_timeout: limits.graceful_timeout,
            request_timeout: limits.request_timeout,
            max_queue_wait: limits.max_queue_wait,
            max_batch_size: batch.max_batch_size,
            max_batch_size_override: batch.max_batch_size_override,
            batch_timeout: batch.batch_timeout,
            warmup_passes: batch.warmup_passes,
            inline_passes: batch.inline_passes,
            profile_memory,
            memory_headroom,
            adapt_workers: cli.adapt_workers,
            footprint_file: cli.footprint_file.map(|p| absolute(Path::new(&p))),
            device,
            max_body_bytes,
            gpu_memory_utilization: gpu.gpu_memory_utilization,
            gpu_reserve_mb: gpu.gpu_reserve_mb,
            max_worker_gpu_mb: gpu.max_worker_gpu_mb,
            ledger: gpu.ledger,
            idle_release: gpu.idle_release,
            max_worker_memory_mb: host_memory.max_worker_memory_mb,
            memory_cgroup: host_memory.memory_cgroup,
            nvml_library,
            mps,
            mps_pipe_directory: devices::mps_pipe_directory(env),
            mps_on: mps == Some(true),
            mps_client_limit: devices::mps_client_limit(env)?,
            allocator,
            simulated_gpus: cli.simulated_gpus,
            cuda_visible_devices: env("CUDA_VISIBLE_DEVICES"),
            torch_threads,
            worker_binary,
            log_json,
            access_log: cli.access_log,
            api_key_file: access.api_key_file,
            metrics_api_key_file: access.metrics_api_key_file,
            tls: access.tls,
            secrets: std::sync::Arc::new(access.secrets),
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
            mps: self.mps_on,
            mps_client_limit: self.mps_client_limit.clone().filter(|_| self.mps_on),
            allocator_fraction: self.allocator.fraction.map(|f| f.0),
            uncached_allocator: self.allocator.uncached,
        }
    }
}

/// `--log-format`: JSON lines (`json`) or text.
fn log_json(v: Option<&str>, c: &Checker<'_>) -> Result<bool, ConfigError> {
    match v {
        None | Some("text") => Ok(false),
        Some("json") => Ok(true),
        Some(v) => Err(c.bad("--log-format", v, "expected text or json")),
    }
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
            "--model-name" => cli.model_name = Some(v),
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
    fn the_model_name_is_a_path_segment() {
        let e = Env::new();
        assert_eq!(e.run(&[]).unwrap().model_name, None, "the metadata's name");
        let c = e.run(&["--model-name", "cifar10-cnn"]).unwrap();
        assert_eq!(c.model_name.as_deref(), Some("cifar10-cnn"));
        let c = Env::new()
            .var("VRAMFORK_MODEL_NAME", "from-env")
            .run(&[])
            .unwrap();
        assert_eq!(c.model_name.as_deref(), Some("from-env"));
        let long = "n".repeat(254);
        for bad in ["a/b", "tab\there", " ", long.as_str()] {
            let err = e.run(&["--model-name", bad]).unwrap_err();
            assert!(
                err.starts_with(&format!("invalid value '{bad}' for --model-name: expected a name of 1 to 253 characters")),
                "{err}"
            );
        }
        let err = Env::new()
            .var("VRAMFORK_MODEL_NAME", "x/y")
            .run(&[])
            .unwrap_err();
        assert!(
            err.contains("VRAMFORK_MODEL_NAME (for --model-name)"),
            "{err}"
        );
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
    fn inline_passes_are_auto_by_default_off_when_asked_and_bad_ones_are_named() {
        let e = Env::new();
        assert!(e.run(&[]).unwrap().inline_passes);
        assert!(e.run(&["--inline-passes", "auto"]).unwrap().inline_passes);
        assert!(!e.run(&["--inline-passes", "off"]).unwrap().inline_passes);
        for v in ["on", "no", ""] {
            let err = e.run(&["--inline-passes", v]).unwrap_err();
            assert!(
                err.contains(&format!(
                    "invalid value '{v}' for --inline-passes: expected auto or off"
                )),
                "{v}: {err}"
            );
        }
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
