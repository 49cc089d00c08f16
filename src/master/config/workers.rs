//! How many workers and how many threads each: the worker-count override (`--workers` >
//! `VRAMFORK_WORKERS` > `CLAMS_GUNICORN_WORKERS`) and torch's intra-op threads
//! (`--torch-threads` > `VRAMFORK_TORCH_THREADS` > `MKL_NUM_THREADS` > `OMP_NUM_THREADS`),
//! the two settings whose precedence runs through other programs' variables.

use super::checker::Checker;
use super::ConfigError;
use crate::master::plan::{TorchThreads, WorkerOverride};

/// `--workers` > `VRAMFORK_WORKERS` > `CLAMS_GUNICORN_WORKERS` > the plan. Zero, negative,
/// empty or non-numeric values are errors, whichever form they came in.
pub(super) fn worker_override(
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
pub(super) fn torch_threads(
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
