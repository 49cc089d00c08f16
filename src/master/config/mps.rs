//! NVIDIA MPS: `--mps` (auto, on, off), where its control daemon would be
//! (`CUDA_MPS_PIPE_DIRECTORY`), and each client's memory limit and share of the SMs the
//! server inherits (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`).

use std::path::PathBuf;

use super::checker::Checker;
use super::ConfigError;
use crate::master::cli::Cli;
use crate::master::resources::mps::ClientLimit;

/// This group's defaults (rendered into `--help` by `config::command`).
pub(super) const DEFAULTS: &[(&str, &str)] = &[("--mps", "auto")];

/// What MPS the server asks for, and what it found.
#[derive(Debug, Clone)]
pub struct Mps {
    /// `--mps`: `None` auto (detect the MPS control daemon), on or off.
    pub setting: Option<bool>,
    /// Where the MPS control daemon's socket would be (`CUDA_MPS_PIPE_DIRECTORY`).
    pub pipe_directory: PathBuf,
    /// Whether MPS serves the GPUs: `--mps on`, or `auto` and the daemon was found
    /// (`resources::mps`, set by the bootstrap after probing). What the plan assumes.
    pub on: bool,
    /// The inherited `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: under MPS it bounds the plan, and
    /// each worker's own limit is at most it.
    pub client_limit: Option<ClientLimit>,
    /// The inherited `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: each MPS client's share of a GPU's
    /// SMs, in percent; every worker is one client, so N workers take N times it.
    pub thread_percentage: Option<f64>,
}

impl Mps {
    pub(super) fn check(cli: &Cli, c: &Checker<'_>) -> Result<Mps, ConfigError> {
        let setting = match c.value("--mps", cli.mps.as_deref()).trim() {
            "auto" => None,
            "on" => Some(true),
            "off" => Some(false),
            v => return Err(c.bad("--mps", v, "expected auto, on or off")),
        };
        Ok(Mps {
            setting,
            pipe_directory: pipe_directory(c.env),
            on: setting == Some(true),
            client_limit: client_limit(c.env)?,
            thread_percentage: thread_percentage(c.env)?,
        })
    }
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` as the server inherits it: each MPS client's limit,
/// which bounds the plan under MPS (`resources::mps::ClientLimit`). A value MPS would not
/// read is refused, naming the variable and its forms.
fn client_limit(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<ClientLimit>, ConfigError> {
    let var = crate::protocol::ENV_MPS_MEM_LIMIT;
    env(var)
        .map(|v| {
            ClientLimit::parse(&v).map_err(|e| {
                ConfigError(format!(
                    "invalid value '{v}' for {var} (each MPS client's device memory limit): {e}"
                ))
            })
        })
        .transpose()
}

/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` as the server inherits it: a percentage in (0, 100]
/// (MPS reads a number; a client's value can only lower the daemon's). Anything else is
/// refused, naming the variable.
fn thread_percentage(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<f64>, ConfigError> {
    const VAR: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
    let Some(v) = env(VAR) else { return Ok(None) };
    match v.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(Some(p)),
        _ => Err(ConfigError(format!(
            "invalid value '{v}' for {VAR} (each MPS client's share of a GPU's SMs): expected a percentage greater than 0 and at most 100"
        ))),
    }
}

/// Where the MPS control daemon's socket would be: `CUDA_MPS_PIPE_DIRECTORY`, else
/// `/tmp/nvidia-mps` (NVIDIA's MPS documentation), as the CUDA driver looks for it.
fn pipe_directory(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    env("CUDA_MPS_PIPE_DIRECTORY").map_or_else(|| PathBuf::from("/tmp/nvidia-mps"), PathBuf::from)
}
