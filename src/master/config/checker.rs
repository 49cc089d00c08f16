//! [`Checker`]: how a value of an option is read (what was given, else the option's
//! default from its group's `DEFAULTS`) and how an error names it (the flag, or the
//! environment variable it came from), the value and what is allowed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{default_of, ConfigError};
use crate::master::cli::option_env;

/// Where a value came from, for messages: `--port` or `VRAMFORK_PORT`.
fn origin(flag: &str, env: &dyn Fn(&str) -> Option<String>, from_cli_args: bool) -> String {
    let var = option_env()
        .into_iter()
        .find(|(f, _)| f == flag)
        .map(|(_, v)| v)
        .unwrap_or_default();
    if !from_cli_args && env(&var).is_some() {
        format!("{var} (for {flag})")
    } else {
        flag.to_string()
    }
}

/// Reads values of options and names them in errors: `--port`, or `VRAMFORK_PORT (for
/// --port)` when the value came from the variable.
pub(super) struct Checker<'a> {
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
    pub(super) args: &'a [String],
}

impl Checker<'_> {
    pub(super) fn name(&self, flag: &str) -> String {
        let on_cli = self
            .args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        origin(flag, self.env, on_cli)
    }

    pub(super) fn bad(&self, flag: &str, value: &str, allowed: &str) -> ConfigError {
        ConfigError(format!(
            "invalid value '{value}' for {}: {allowed}",
            self.name(flag)
        ))
    }

    /// The value given, else the option's default (its group's `DEFAULTS`; an option read
    /// through this without one is a defect the defaults test finds).
    pub(super) fn value<'v>(&self, flag: &str, v: Option<&'v str>) -> &'v str {
        match v {
            Some(v) => v,
            None => default_of(flag).unwrap_or_else(|| panic!("{flag} has no default")),
        }
    }

    /// A whole number ≥ `min`: the value given, else the option's default.
    pub(super) fn uint(&self, flag: &str, v: Option<&str>, min: u64) -> Result<u64, ConfigError> {
        self.uint_given(flag, self.value(flag, v), min)
    }

    /// A whole number ≥ `min` (an option without a default, given).
    pub(super) fn uint_given(&self, flag: &str, v: &str, min: u64) -> Result<u64, ConfigError> {
        match v.trim().parse::<u64>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(self.bad(flag, v, &format!("expected a whole number ≥ {min}"))),
        }
    }

    /// Seconds > 0: the value given, else the option's default.
    pub(super) fn seconds(&self, flag: &str, v: Option<&str>) -> Result<Duration, ConfigError> {
        let v = self.value(flag, v);
        match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s <= 1e7 => Ok(Duration::from_secs_f64(s)),
            _ => Err(self.bad(flag, v, "expected a number of seconds > 0 (e.g. 30 or 0.5)")),
        }
    }
}

impl Checker<'_> {
    /// Seconds ≥ 0, where 0 turns the limit off.
    pub(super) fn seconds_or_off(
        &self,
        flag: &str,
        v: Option<&str>,
    ) -> Result<Option<Duration>, ConfigError> {
        let v = self.value(flag, v);
        match v.trim() {
            "0" => Ok(None),
            s if s.parse::<f64>() == Ok(0.0) => Ok(None),
            _ => self.seconds(flag, Some(v)).map(Some).map_err(|_| {
                self.bad(
                    flag,
                    v,
                    "expected a number of seconds ≥ 0 (e.g. 10 or 0.5; 0 = no limit)",
                )
            }),
        }
    }
}

/// `p` made absolute against the working directory (as given when that fails).
pub(super) fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}
