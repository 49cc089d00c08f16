//! Measuring and following a worker's GPU footprint: `--profile-memory`,
//! `--memory-headroom`, `--adapt-workers` and `--footprint-file`.

use std::path::{Path, PathBuf};

use super::checker::{absolute, Checker};
use super::ConfigError;
use crate::master::cli::Cli;

/// This group's defaults (rendered into `--help` by `config::command`).
pub(super) const DEFAULTS: &[(&str, &str)] =
    &[("--profile-memory", "auto"), ("--memory-headroom", "1.2")];

/// How the footprint is measured and what is done with it.
#[derive(Debug, Clone)]
pub struct Footprint {
    /// `--profile-memory`: `None` = auto.
    pub profile_memory: Option<bool>,
    /// `--memory-headroom`: the plan assumes measured footprint × this.
    pub memory_headroom: f64,
    /// `--adapt-workers`: retire workers when their observed footprint outgrows the plan.
    pub adapt_workers: bool,
    /// `--footprint-file`.
    pub footprint_file: Option<PathBuf>,
}

impl Footprint {
    pub(super) fn check(cli: &Cli, c: &Checker<'_>) -> Result<Footprint, ConfigError> {
        let profile_memory = match c
            .value("--profile-memory", cli.profile_memory.as_deref())
            .trim()
        {
            "auto" => None,
            "on" => Some(true),
            "off" => Some(false),
            v => return Err(c.bad("--profile-memory", v, "expected auto, on or off")),
        };
        let v = c.value("--memory-headroom", cli.memory_headroom.as_deref());
        let memory_headroom = match v.trim().parse::<f64>() {
            Ok(f) if (1.0..=10.0).contains(&f) => f,
            _ => {
                return Err(c.bad(
                    "--memory-headroom",
                    v,
                    "expected a factor from 1 to 10 (e.g. 1.2)",
                ))
            }
        };
        Ok(Footprint {
            profile_memory,
            memory_headroom,
            adapt_workers: cli.adapt_workers,
            footprint_file: cli
                .footprint_file
                .as_deref()
                .map(|p| absolute(Path::new(p))),
        })
    }
}
