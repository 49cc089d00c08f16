//! Where and how long the server serves: the address (`--host`, `--port`,
//! `--metrics-port`), the per-worker limits (`--max-requests` and its jitter, the
//! timeouts, `--max-queue-wait`) and the body limit (`--max-body-mb`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::checker::Checker;
use super::ConfigError;
use crate::master::cli::Cli;

/// This group's defaults (rendered into `--help` by `config::command`).
pub(super) const DEFAULTS: &[(&str, &str)] = &[
    ("--host", "127.0.0.1"),
    ("--port", "5000"),
    ("--max-requests", "0"),
    ("--max-requests-jitter", "0"),
    ("--timeout", "30"),
    ("--boot-timeout", "300"),
    ("--graceful-timeout", "30"),
    ("--request-timeout", "120"),
    ("--max-queue-wait", "10"),
    ("--max-body-mb", "64"),
];

/// `--host`, `--port`, `--metrics-port`.
#[derive(Debug, Clone)]
pub struct Address {
    pub host: String,
    pub port: u16,
    pub metrics_port: Option<u16>,
    /// `--host` or `--port` was given (flag or environment).
    pub address_given: bool,
}

impl Address {
    pub(super) fn check(cli: &Cli, c: &Checker<'_>) -> Result<Address, ConfigError> {
        let address_given = cli.host.is_some() || cli.port.is_some();
        let host = c.value("--host", cli.host.as_deref()).to_string();
        if host.trim().is_empty() || host.contains(char::is_whitespace) {
            return Err(c.bad(
                "--host",
                &host,
                "expected an address such as 127.0.0.1 or 0.0.0.0",
            ));
        }
        let p = c.value("--port", cli.port.as_deref());
        let port = p.trim().parse::<u16>().map_err(|_| {
            c.bad(
                "--port",
                p,
                "expected a port number 0..65535 (0 = any free port)",
            )
        })?;
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
        Ok(Address {
            host,
            port,
            metrics_port,
            address_given,
        })
    }
}

/// `--max-requests` (and its jitter), the timeouts, `--max-queue-wait` and `--max-body-mb`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub max_requests: u64,
    pub max_requests_jitter: u64,
    pub timeout: Duration,
    pub boot_timeout: Duration,
    pub graceful_timeout: Duration,
    pub request_timeout: Duration,
    /// `None`: requests wait without bound (`--max-queue-wait 0`).
    pub max_queue_wait: Option<Duration>,
    /// `--max-body-mb`, in bytes.
    pub max_body_bytes: u64,
}

impl Limits {
    pub(super) fn check(cli: &Cli, c: &Checker<'_>) -> Result<Limits, ConfigError> {
        Ok(Limits {
            max_requests: c.uint("--max-requests", cli.max_requests.as_deref(), 0)?,
            max_requests_jitter: c.uint(
                "--max-requests-jitter",
                cli.max_requests_jitter.as_deref(),
                0,
            )?,
            timeout: c.seconds("--timeout", cli.timeout.as_deref())?,
            boot_timeout: c.seconds("--boot-timeout", cli.boot_timeout.as_deref())?,
            graceful_timeout: c.seconds("--graceful-timeout", cli.graceful_timeout.as_deref())?,
            request_timeout: c.seconds("--request-timeout", cli.request_timeout.as_deref())?,
            max_queue_wait: c.seconds_or_off("--max-queue-wait", cli.max_queue_wait.as_deref())?,
            max_body_bytes: max_body_bytes(cli.max_body_mb.as_deref(), c)?,
        })
    }
}

/// `--max-body-mb`, in bytes.
fn max_body_bytes(v: Option<&str>, c: &Checker<'_>) -> Result<u64, ConfigError> {
    let max_body_mb = c.uint("--max-body-mb", v, 1)?;
    if max_body_mb > 1 << 20 {
        return Err(c.bad(
            "--max-body-mb",
            &max_body_mb.to_string(),
            "at most 1048576 MB",
        ));
    }
    Ok(max_body_mb << 20)
}
