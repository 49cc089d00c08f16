//! What the server writes about itself: the log format (`--log-format`) and the access
//! log (`--access-log`).

use serde::{Deserialize, Serialize};

use super::checker::Checker;
use super::ConfigError;
use crate::master::cli::Cli;

/// This group's defaults (rendered into `--help` by `config::command`).
pub(super) const DEFAULTS: &[(&str, &str)] = &[("--log-format", "text")];

/// The log's format and the access log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Log {
    /// `--log-format json`: JSON lines instead of text.
    pub json: bool,
    /// `--access-log`: one line per answered request.
    pub access_log: bool,
}

impl Log {
    pub(super) fn check(cli: &Cli, c: &Checker<'_>) -> Result<Log, ConfigError> {
        let json = match c.value("--log-format", cli.log_format.as_deref()) {
            "text" => false,
            "json" => true,
            v => return Err(c.bad("--log-format", v, "expected text or json")),
        };
        Ok(Log {
            json,
            access_log: cli.access_log,
        })
    }
}
