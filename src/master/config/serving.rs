//! Where and how long the server serves: the address (`--host`, `--port`,
//! `--metrics-port`), the per-worker limits (`--max-requests` and its jitter, the
//! timeouts, `--max-queue-wait`) and the body limit (`--max-body-mb`).

use std::time::Duration;

use super::checker::Checker;
use super::ConfigError;

/// `--host`, `--port`, `--metrics-port`.
pub(super) struct Address {
    pub host: String,
    pub port: u16,
    pub metrics_port: Option<u16>,
    /// `--host` or `--port` was given (flag or environment).
    pub address_given: bool,
}

impl Address {
    pub(super) fn check(
        host: Option<String>,
        port: Option<String>,
        metrics_port: Option<String>,
        c: &Checker<'_>,
    ) -> Result<Address, ConfigError> {
        let address_given = host.is_some() || port.is_some();
        let host = host.unwrap_or_else(|| "127.0.0.1".to_string());
        if host.trim().is_empty() || host.contains(char::is_whitespace) {
            return Err(c.bad(
                "--host",
                &host,
                "expected an address such as 127.0.0.1 or 0.0.0.0",
            ));
        }
        let port = match port.as_deref() {
            None => 5000,
            Some(p) => p.trim().parse::<u16>().map_err(|_| {
                c.bad(
                    "--port",
                    p,
                    "expected a port number 0..65535 (0 = any free port)",
                )
            })?,
        };

        let metrics_port = match metrics_port.as_deref() {
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

/// `--max-requests` (and its jitter), the timeouts and `--max-queue-wait`.
pub(super) struct Limits {
    pub max_requests: u64,
    pub max_requests_jitter: u64,
    pub timeout: Duration,
    pub boot_timeout: Duration,
    pub graceful_timeout: Duration,
    pub request_timeout: Duration,
    pub max_queue_wait: Option<Duration>,
}

impl Limits {
    pub(super) fn check(
        cli: &crate::master::cli::Cli,
        c: &Checker<'_>,
    ) -> Result<Limits, ConfigError> {
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
        Ok(Limits {
            max_requests,
            max_requests_jitter,
            timeout,
            boot_timeout,
            graceful_timeout,
            request_timeout,
            max_queue_wait,
        })
    }
}

/// `--max-body-mb`, in bytes.
pub(super) fn max_body_bytes(v: Option<&str>, c: &Checker<'_>) -> Result<u64, ConfigError> {
    let max_body_mb = c.uint("--max-body-mb", v, 64, 1)?;
    if max_body_mb > 1 << 20 {
        return Err(c.bad(
            "--max-body-mb",
            &max_body_mb.to_string(),
            "at most 1048576 MB",
        ));
    }
    Ok(max_body_mb << 20)
}
