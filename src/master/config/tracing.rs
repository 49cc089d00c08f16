//! The trace export: the standard `OTEL_*` variables, read by `crate::otel` (here only:
//! each worker is handed the result in its configuration), and for an `https://` endpoint
//! its certificate files (`crate::otel_tls`). An error stops the start (exit 2);
//! the standard's warnings are logged at start (`Tracing::warn`).

use serde::{Deserialize, Serialize};

use super::checker::Checker;
use super::ConfigError;
use crate::otel::OtelConfig;

/// Whether and where the workers export spans.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tracing {
    /// `None`: export off (the default).
    pub export: Option<OtelConfig>,
    /// What the variables said that the standard makes a warning, not an error (logged by
    /// the master at start, so not handed to the workers).
    #[serde(skip)]
    pub warnings: Vec<String>,
}

impl Tracing {
    pub(super) fn check(c: &Checker<'_>) -> Result<Tracing, ConfigError> {
        let (export, warnings) = crate::otel::from_env(c.env).map_err(ConfigError)?;
        // An https endpoint's certificate files are read now, so a bad one stops the start
        // (each worker reads them again on its exporter thread).
        if let Some(tls) = export.as_ref().and_then(|e| e.tls.as_ref()) {
            crate::otel_tls::client_config(tls).map_err(ConfigError)?;
        }
        Ok(Tracing { export, warnings })
    }

    /// Logs the warnings and where spans go (once logging is set up).
    pub fn log(&self) {
        for w in &self.warnings {
            tracing::warn!(event = "trace_export_setting_ignored", "{w}");
        }
        if let Some(e) = &self.export {
            let trust = match &e.tls {
                None => String::new(),
                Some(t) => format!(
                    ", verifying its certificate against {}",
                    t.roots
                        .iter()
                        .map(|(var, path)| format!("{} ({var})", path.display()))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            };
            tracing::info!(
                event = "trace_export",
                endpoint = %e.endpoint,
                service_name = %e.service_name,
                sampler = ?e.sampler,
                "workers export their spans over OTLP/HTTP to {}{trust}",
                e.endpoint
            );
        }
    }
}
