//! `Config::from_cli`: turns the command line and the environment into one validated
//! configuration, grouped by concern: each group is checked by the file that owns it, which
//! also writes its options' defaults (`DEFAULTS`, rendered into `--help` by [`command`]).
//! This is the only module that reads the environment. Every invalid value is an error
//! naming the option (and the variable it came from), the value and what is allowed;
//! nothing is silently replaced by a default.
//!
//! | file | group ([`Config`]'s field) | options |
//! |---|---|---|
//! | `mod.rs` | [`Config`], the mode; the order of the checks; a reload; the defaults' registry | |
//! | `checker.rs` | how a value is read (given, else its default) and how an error names its option | |
//! | `app.rs` | `app`: what is served | `--metadata`, `--model`, `--model-name` |
//! | `serving.rs` | `address`, `limits`: where, and the per-worker limits and timeouts | `--host`, `--port`, `--metrics-port`, `--max-requests`…, `--max-body-mb` |
//! | `batching.rs` | `batch`: how the model thread runs passes | `--max-batch-size`, `--batch-timeout-ms`, `--warmup-passes`, `--inline-passes` |
//! | `workers.rs` | `workers`: how many, their threads, their binary | `--workers`, `--torch-threads`, `--worker-binary` |
//! | `devices.rs` | `gpu`: the device, GPU memory, the ledger, NVML, the allocator's settings | `--device`, `--gpu-*`, `--max-worker-gpu-mb`, `--ledger`, `--nvml-library`, `--simulated-gpus` |
//! | `mps.rs` | `mps`: NVIDIA MPS | `--mps` |
//! | `footprint.rs` | `footprint`: measuring and following a worker's GPU footprint | `--profile-memory`, `--memory-headroom`, `--adapt-workers`, `--footprint-file` |
//! | `host_memory.rs` | `host_memory`: recycling on a worker's own memory, the memory cgroup | `--max-worker-memory-mb`, `--memory-cgroup` |
//! | `lending.rs` | `lending`: giving GPU room to a neighbour that asks, and keeping it | `--evictable-after`, `--pin` |
//! | `access.rs` | `access`: API key files and TLS, read once into the workers' secrets | `--api-key-file`, `--metrics-api-key-file`, `--tls-*` |
//! | `logging.rs` | `log`: the log format and the access log | `--log-format`, `--access-log` |
//! | `tracing.rs` | `tracing`: the trace export (`crate::otel`) | `OTEL_*` variables |
//!
//! Adding an option touches three files: its flag in `cli.rs` (the variable comes with it),
//! its check, default and field in the group's file here, and its row in docs/options.md.
//! A worker reads it the same way when its group is one the workers get as it is
//! (`limits`, `batch`, `host_memory`, `access`, `log`, `tracing`:
//! `crate::master::worker_config`).

mod access;
mod app;
mod archive;
mod batching;
mod checker;
mod devices;
mod footprint;
mod host_memory;
mod lending;
mod logging;
mod mps;
mod serving;
mod tracing;
mod workers;

use std::path::Path;

pub use access::Access;
pub use app::App;
pub use batching::Batch;
use checker::Checker;
pub use devices::{AllocatorEnv, Gpu};
pub use footprint::Footprint;
pub use host_memory::HostMemory;
pub use lending::Lending;
pub use logging::Log;
pub use mps::Mps;
pub use serving::{Address, Limits};
pub use tracing::Tracing;
pub use workers::Workers;

use crate::master::cli::{option_env, Cli, Command};
use crate::master::plan::Policy;

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

/// The validated configuration, one field per concern.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub app: App,
    pub address: Address,
    pub limits: Limits,
    pub batch: Batch,
    pub workers: Workers,
    pub gpu: Gpu,
    pub mps: Mps,
    pub footprint: Footprint,
    pub host_memory: HostMemory,
    pub lending: Lending,
    pub access: Access,
    pub log: Log,
    pub tracing: Tracing,
}

/// A configuration error: printed as one line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Every group's defaults: the one place each is written.
const DEFAULTS: &[&[(&str, &str)]] = &[
    app::DEFAULTS,
    serving::DEFAULTS,
    batching::DEFAULTS,
    devices::DEFAULTS,
    mps::DEFAULTS,
    footprint::DEFAULTS,
    logging::DEFAULTS,
    lending::DEFAULTS,
];

/// The default of `flag` (`--port`), where it has one that is a value.
pub fn default_of(flag: &str) -> Option<&'static str> {
    DEFAULTS
        .iter()
        .flat_map(|group| group.iter())
        .find(|(f, _)| *f == flag)
        .map(|(_, d)| *d)
}

/// The command line with each default rendered into its option's help (`[default: …]`):
/// what `app` parses and `app --help` prints.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    DEFAULTS
        .iter()
        .flat_map(|group| group.iter())
        .fold(Cli::command(), |cmd, (flag, default)| {
            let id = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(&flag[2..]))
                .map(|a| a.get_id().clone())
                .unwrap_or_else(|| panic!("a default for {flag}, which is no option"));
            cmd.mut_arg(id, |a| {
                let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                a.help(format!("{help} [default: {default}]"))
            })
        })
}

/// A variable of an option that is set but empty is an error, not "unset".
fn no_empty_variables(env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    for (flag, var) in option_env() {
        if let Some(v) = env(&var) {
            if v.trim().is_empty() {
                return Err(ConfigError(format!(
                    "{var} (for {flag}) is set but empty: unset it or give a value"
                )));
            }
        }
    }
    Ok(())
}

impl Config {
    /// Validates the parsed command line. `env` reads environment variables (the process
    /// environment in `app`, a map in tests); `args` are the raw arguments, used only to say
    /// whether a bad value came from a flag or a variable. The groups are checked in one
    /// order (so that of two bad values the same one is named first), then what spans
    /// groups.
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
            // Read before any configuration is made (`master::host::view`).
            Some(Command::Ledger { .. }) => {
                return Err(ConfigError("`app ledger` takes only --ledger".into()))
            }
            None if cli.production => Mode::Production,
            None => Mode::Develop,
        };
        let app = App::check(&cli, mode, &c)?;
        let mut cli = cli;
        archive::defaults(&mut cli, &app.metadata);
        let address = Address::check(&cli, &c)?;
        let access = Access::check(&cli, address.metrics_port, &c)?;
        let limits = Limits::check(&cli, &c)?;
        let batch = Batch::check(&cli, &app.metadata, &c)?;
        let footprint = Footprint::check(&cli, &c)?;
        batch.check_queue_wait(limits.max_queue_wait, &c)?;
        let gpu = Gpu::check(&cli, &c)?;
        let host_memory = HostMemory::check(&cli, &c)?;
        let lending = Lending::check(&cli, app.metadata.pin, &c)?;
        let mps = Mps::check(&cli, &c)?;
        let log = Log::check(&cli, &c)?;
        let workers = Workers::check(&cli, mode, exe_dir, &c)?;
        let tracing = Tracing::check(&c)?;
        Ok(Config {
            mode,
            app,
            address,
            limits,
            batch,
            workers,
            gpu,
            mps,
            footprint,
            host_memory,
            lending,
            access,
            log,
            tracing,
        })
    }

    /// This configuration with the metadata read again (SIGHUP). Errors leave `self` as is.
    pub fn reloaded(&self) -> Result<Config, ConfigError> {
        let c = Checker {
            env: &|_| None,
            args: &[],
        };
        let app = self.app.reloaded()?;
        let access = self.access.reloaded(&c)?;
        let max_batch_size = batching::batching(
            &app.metadata,
            self.batch.max_batch_size_override,
            self.batch.batch_timeout,
            &c,
        )?;
        Ok(Config {
            app,
            access,
            batch: Batch {
                max_batch_size,
                ..self.batch.clone()
            },
            ..self.clone()
        })
    }

    /// The model's path as text (empty when there is none), for messages and workers.
    pub fn model_display(&self) -> String {
        self.app.model_display()
    }

    /// The planning policy this configuration asks for.
    pub fn policy(&self) -> Policy {
        Policy {
            workers_override: self.workers.count,
            device: self.gpu.device,
            gpu_memory_utilization: self.gpu.gpu_memory_utilization,
            gpu_reserve_mb: self.gpu.gpu_reserve_mb,
            torch_threads: self.workers.torch_threads,
            mps: self.mps.on,
            mps_client_limit: self.mps.client_limit.clone().filter(|_| self.mps.on),
            mps_thread_percentage: self.mps.thread_percentage.filter(|_| self.mps.on),
            allocator_fraction: self.gpu.allocator.fraction.map(|f| f.0),
            uncached_allocator: self.gpu.allocator.uncached,
        }
    }
}

#[cfg(test)]
mod tests;
