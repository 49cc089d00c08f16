//! Lending GPU room between the servers of one host (`master::host::lending`):
//! `--evictable-after` (how long a server must go without a request before it gives its
//! workers' room to a neighbour that asks) and `--pin` (a server that never gives its room).

use std::time::Duration;

use super::checker::Checker;
use super::ConfigError;
use crate::master::cli::Cli;

/// This group's defaults (rendered into `--help` by `config::command`). Five minutes: what
/// an interactive app's user pauses between two requests (Ollama's `keep_alive` default),
/// so a model in use is never taken, and one left for longer is.
pub(super) const DEFAULTS: &[(&str, &str)] = &[("--evictable-after", "300")];

/// Whether and when this server lends its room.
#[derive(Debug, Clone, PartialEq)]
pub struct Lending {
    /// `--evictable-after`: idle this long, the server gives its workers' room to a
    /// neighbour that asks; `None` (0 or off): never.
    pub evictable_after: Option<Duration>,
    /// `--pin` (or the metadata's `"pin": true`): the server keeps its room whatever
    /// happens.
    pub pin: bool,
}

impl Lending {
    pub(super) fn check(
        cli: &Cli,
        pin_in_metadata: bool,
        c: &Checker<'_>,
    ) -> Result<Lending, ConfigError> {
        let evictable_after = match cli.evictable_after.as_deref().map(str::trim) {
            Some("off") => None,
            v => c.seconds_or_off("--evictable-after", v)?,
        };
        Ok(Lending {
            evictable_after,
            pin: cli.pin || pin_in_metadata,
        })
    }
}
