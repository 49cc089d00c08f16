//! Who may call and over what: the API key files (`--api-key-file`,
//! `--metrics-api-key-file`) and TLS (`--tls-cert`, `--tls-key`, `--tls-client-ca`),
//! read once and checked into the [`crate::secrets::Secrets`] this configuration's workers
//! get.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checker::{absolute, Checker};
use super::ConfigError;
use crate::master::cli::Cli;

/// The key and TLS files as given, and what they held when checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Access {
    /// `--api-key-file` (absolute), checked: the serving port requires a key from it.
    pub api_key_file: Option<PathBuf>,
    /// `--metrics-api-key-file` (absolute), checked: `/metrics` requires a key from it.
    pub metrics_api_key_file: Option<PathBuf>,
    /// `--tls-cert`, `--tls-key`, `--tls-client-ca` (absolute), checked: both ports serve
    /// HTTPS.
    pub tls: Option<crate::tls::TlsFiles>,
    /// The key and TLS files as read and checked for this configuration: what its workers
    /// get (`crate::secrets`), never the files as they are later. Never in a worker's
    /// configuration: a worker gets it on its own descriptor.
    #[serde(skip)]
    pub secrets: std::sync::Arc<crate::secrets::Secrets>,
}

impl Access {
    /// Checks the options (`metrics_port`: `--metrics-port`, which a metrics key protects).
    pub(super) fn check(
        cli: &Cli,
        metrics_port: Option<u16>,
        c: &Checker<'_>,
    ) -> Result<Access, ConfigError> {
        let api_key_file = key_file(cli.api_key_file.as_deref());
        let metrics_api_key_file = key_file(cli.metrics_api_key_file.as_deref());
        if metrics_api_key_file.is_some() && metrics_port.is_none() {
            return Err(ConfigError(
                "--metrics-api-key-file protects --metrics-port's /metrics: give --metrics-port too"
                    .into(),
            ));
        }
        let tls = tls_files(
            c,
            cli.tls_cert.as_deref(),
            cli.tls_key.as_deref(),
            cli.tls_client_ca.as_deref(),
        )?;
        let secrets = read_secrets(c, &api_key_file, &metrics_api_key_file, &tls)?;
        Ok(Access {
            api_key_file,
            metrics_api_key_file,
            tls,
            secrets: std::sync::Arc::new(secrets),
        })
    }

    /// The same files read again (SIGHUP): a HUP is how new keys are rolled out, and what
    /// it accepts is what the workers it starts get (`crate::secrets`).
    pub(super) fn reloaded(&self, c: &Checker<'_>) -> Result<Access, ConfigError> {
        let secrets = read_secrets(c, &self.api_key_file, &self.metrics_api_key_file, &self.tls)?;
        Ok(Access {
            secrets: std::sync::Arc::new(secrets),
            ..self.clone()
        })
    }
}

/// A key file option's path (read by [`read_secrets`]).
fn key_file(v: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    v.map(|v| absolute(Path::new(v)))
}

/// Reads the key and TLS files once and checks them: the keys must be valid and the TLS
/// files make a working server configuration. What this returns is what the workers of
/// this configuration serve with (`crate::secrets`), whatever the files become later.
fn read_secrets(
    c: &Checker,
    api_key_file: &Option<PathBuf>,
    metrics_api_key_file: &Option<PathBuf>,
    tls: &Option<crate::tls::TlsFiles>,
) -> Result<crate::secrets::Secrets, ConfigError> {
    let mut stamps = Vec::new();
    let mut keys = |flag: &'static str, f: &Option<PathBuf>| {
        let Some(f) = f else { return Ok(None) };
        let named = |e: String| ConfigError(format!("{}: {e}", c.name(flag)));
        stamps.push((flag, f.clone(), crate::files::stamp(f)));
        let text = crate::auth::ApiKeys::read(f).map_err(named)?;
        crate::auth::ApiKeys::parse(&text)
            .map_err(|e| named(format!("API key file {}: {e}", f.display())))?;
        Ok::<_, ConfigError>(Some(text))
    };
    let api = keys("--api-key-file", api_key_file)?;
    let metrics = keys("--metrics-api-key-file", metrics_api_key_file)?;
    let tls = tls.as_ref().map(|t| check_tls(c, t)).transpose()?;
    Ok(stamps.into_iter().fold(
        crate::secrets::Secrets::new(api, metrics, tls),
        |s, (flag, path, stamp)| s.with_key_file(flag, &path, stamp),
    ))
}

/// `--tls-cert`, `--tls-key`, `--tls-client-ca`: all or nothing (the CA only with the
/// other two), and the files must make a working server configuration.
fn tls_files(
    c: &Checker,
    cert: Option<&std::ffi::OsStr>,
    key: Option<&std::ffi::OsStr>,
    client_ca: Option<&std::ffi::OsStr>,
) -> Result<Option<crate::tls::TlsFiles>, ConfigError> {
    let files = match (cert, key) {
        (None, None) => {
            if client_ca.is_some() {
                return Err(ConfigError(format!(
                    "{} asks for client certificates over TLS: give {} and {} too",
                    c.name("--tls-client-ca"),
                    c.name("--tls-cert"),
                    c.name("--tls-key")
                )));
            }
            return Ok(None);
        }
        (Some(_), None) => {
            return Err(ConfigError(format!(
                "{} needs {} (its private key)",
                c.name("--tls-cert"),
                c.name("--tls-key")
            )))
        }
        (None, Some(_)) => {
            return Err(ConfigError(format!(
                "{} needs {} (the certificate it is the key of)",
                c.name("--tls-key"),
                c.name("--tls-cert")
            )))
        }
        (Some(cert), Some(key)) => crate::tls::TlsFiles {
            cert: absolute(Path::new(cert)),
            key: absolute(Path::new(key)),
            client_ca: client_ca.map(|p| absolute(Path::new(p))),
        },
    };
    Ok(Some(files))
}

fn check_tls(
    c: &Checker,
    files: &crate::tls::TlsFiles,
) -> Result<crate::tls::TlsMaterial, ConfigError> {
    files.read().map_err(|e| {
        ConfigError(format!(
            "TLS ({}, {}{}): {e}",
            c.name("--tls-cert"),
            c.name("--tls-key"),
            if files.client_ca.is_some() {
                format!(", {}", c.name("--tls-client-ca"))
            } else {
                String::new()
            }
        ))
    })
}
