//! Batching (`--max-batch-size` over the metadata's `max_batch_size`,
//! `--batch-timeout-ms`) and the warm-up passes (`--warmup-passes`): how the model thread
//! runs passes.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::checker::Checker;
use super::ConfigError;
use crate::master::cli::Cli;
use crate::metadata::{AppMetadata, MAX_BATCH_SIZE_LIMIT};

/// This group's defaults (rendered into `--help` by `config::command`).
pub(super) const DEFAULTS: &[(&str, &str)] = &[
    ("--batch-timeout-ms", "0"),
    ("--warmup-passes", "2"),
    ("--inline-passes", "auto"),
];

/// The most `--warmup-passes` accepted: more passes than this buy nothing and delay every
/// worker's boot.
const MAX_WARMUP_PASSES: u32 = 100;

/// `--max-batch-size`, `--batch-timeout-ms` and the rows per pass they give;
/// `--warmup-passes` and `--inline-passes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
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
}

impl Batch {
    pub(super) fn check(
        cli: &Cli,
        metadata: &AppMetadata,
        c: &Checker<'_>,
    ) -> Result<Batch, ConfigError> {
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
        let batch_timeout_ms = c.uint("--batch-timeout-ms", cli.batch_timeout_ms.as_deref(), 0)?;
        if batch_timeout_ms > 60_000 {
            return Err(c.bad(
                "--batch-timeout-ms",
                &batch_timeout_ms.to_string(),
                "at most 60000 ms",
            ));
        }
        let batch_timeout = Duration::from_millis(batch_timeout_ms);
        let max_batch_size = batching(metadata, max_batch_size_override, batch_timeout, c)?;
        Ok(Batch {
            max_batch_size,
            max_batch_size_override,
            batch_timeout,
            warmup_passes: warmup_passes(cli.warmup_passes.as_deref(), c)?,
            inline_passes: inline_passes(cli.inline_passes.as_deref(), c)?,
        })
    }

    /// A batch timeout that is not shorter than `--max-queue-wait` would refuse (503) a
    /// request waiting for its batch to fill before it ran.
    pub(super) fn check_queue_wait(
        &self,
        max_queue_wait: Option<Duration>,
        c: &Checker<'_>,
    ) -> Result<(), ConfigError> {
        let (max_batch_size, batch_timeout) = (self.max_batch_size, self.batch_timeout);
        if let Some(wait) = max_queue_wait.filter(|w| max_batch_size > 0 && batch_timeout >= *w) {
            return Err(ConfigError(format!(
                "{} {} is not shorter than {} ({} s): a request waiting for its batch to fill would be refused (503) before it ran",
                c.name("--batch-timeout-ms"),
                batch_timeout.as_millis(),
                c.name("--max-queue-wait"),
                wait.as_secs_f64()
            )));
        }
        Ok(())
    }
}

/// `--warmup-passes`.
fn warmup_passes(v: Option<&str>, c: &Checker<'_>) -> Result<u32, ConfigError> {
    let v = c.value("--warmup-passes", v);
    match v.trim().parse::<u32>() {
        Ok(n) if n <= MAX_WARMUP_PASSES => Ok(n),
        _ => Err(c.bad(
            "--warmup-passes",
            v,
            &format!("expected a whole number 0..={MAX_WARMUP_PASSES} (0 = no warm-up pass)"),
        )),
    }
}

/// `--inline-passes`: `true` auto, `false` off.
fn inline_passes(v: Option<&str>, c: &Checker<'_>) -> Result<bool, ConfigError> {
    match c.value("--inline-passes", v).trim() {
        "auto" => Ok(true),
        "off" => Ok(false),
        v => Err(c.bad("--inline-passes", v, "expected auto or off")),
    }
}

/// The rows per forward pass: `--max-batch-size` over the metadata's `max_batch_size`,
/// checked against the declared inputs and `--batch-timeout-ms`.
pub(super) fn batching(
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
