//! The workers: how many (the override `--workers` > `VRAMFORK_WORKERS` >
//! `CLAMS_GUNICORN_WORKERS`), how many torch threads each (`--torch-threads` >
//! `VRAMFORK_TORCH_THREADS` > `MKL_NUM_THREADS` > `OMP_NUM_THREADS`: the two settings whose
//! precedence runs through other programs' variables), and which binary
//! (`--worker-binary`).

use std::path::{Path, PathBuf};

use super::checker::{absolute, Checker};
use super::{ConfigError, Mode};
use crate::master::cli::Cli;
use crate::master::plan::{TorchThreads, WorkerOverride};

/// How many workers, their threads and their binary.
#[derive(Debug, Clone)]
pub struct Workers {
    /// A fixed worker count instead of the plan's.
    pub count: Option<WorkerOverride>,
    pub torch_threads: Option<TorchThreads>,
    pub binary: PathBuf,
}

impl Workers {
    /// `exe_dir`: where `app` is (its `app-worker` is the default binary).
    pub(super) fn check(
        cli: &Cli,
        mode: Mode,
        exe_dir: Option<&Path>,
        c: &Checker<'_>,
    ) -> Result<Workers, ConfigError> {
        Ok(Workers {
            count: worker_override(&cli.workers, c.env, c)?,
            torch_threads: torch_threads(&cli.torch_threads, c.env, c)?,
            binary: worker_binary(cli.worker_binary.as_deref(), exe_dir, mode)?,
        })
    }
}

/// The worker binary: `--worker-binary`, else `app-worker` beside `app`; it must exist
/// unless only the plan is printed.
fn worker_binary(
    flag: Option<&std::ffi::OsStr>,
    exe_dir: Option<&Path>,
    mode: Mode,
) -> Result<PathBuf, ConfigError> {
    let worker_binary = match flag {
        Some(p) => absolute(Path::new(p)),
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
        let count = c.uint_given("--torch-threads", v, 1)? as usize;
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
