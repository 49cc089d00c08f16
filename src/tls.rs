//! TLS (`--tls-cert`, `--tls-key`, `--tls-client-ca`), opt-in: the PEM files checked and
//! turned into a rustls server configuration, and that configuration kept current when the
//! files change. Used by the workers (the serving port) and by whoever serves the metrics
//! port (the master, or the one worker in development mode). rustls with the *ring*
//! provider: no OpenSSL.
//!
//! - `--tls-cert`: the server's certificate chain, leaf first (PEM `CERTIFICATE` blocks).
//! - `--tls-key`: its private key (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC); it must match the
//!   leaf certificate.
//! - `--tls-client-ca`: CA certificates (PEM); given, every client must present a
//!   certificate signed by one of them (mutual TLS), else the handshake fails.
//!
//! Only HTTP/1.1 is offered (ALPN `http/1.1`), TLS 1.2 and 1.3 with rustls's safe defaults.
//! [`Reloading`] stats the files at each new connection (three `stat` calls, against a
//! handshake's milliseconds) and builds a new configuration when one changed, so a rotated
//! certificate is used from the next connection on and open connections keep theirs; a
//! half-rotated or broken set is logged and the last good configuration stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use serde::{Deserialize, Serialize};

/// The PEM files of `--tls-cert`, `--tls-key` and `--tls-client-ca` (absolute paths).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// When each file last changed, with its length (`None`: cannot be read now).
type Stamp = Vec<Option<(SystemTime, u64)>>;

/// The ALPN protocol offered: hyper serves HTTP/1.1 only.
const ALPN_HTTP11: &[u8] = b"http/1.1";

impl TlsFiles {
    /// Reads the files and builds the server configuration; the message names the file and
    /// what is wrong with it, never key material.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = read_certs(&self.cert, "certificate")?;
        let key = read_key(&self.key)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in read_certs(ca, "client CA")? {
                    roots
                        .add(c)
                        .map_err(|e| format!("the client CA file {}: {e}", ca.display()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| format!("the client CA file {}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => format!(
                "the private key in {} is not the key of the certificate in {}",
                self.key.display(),
                self.cert.display()
            ),
            e => format!(
                "the certificate in {} with the private key in {}: {e}",
                self.cert.display(),
                self.key.display()
            ),
        })?;
        config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        Ok(Arc::new(config))
    }

    /// When each file last changed (with its length), to notice a rotation.
    fn stamp(&self) -> Stamp {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())))
            })
            .collect()
    }
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read the {what} file {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the {what} file {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "the {what} file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read the private key file {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        format!(
            "the private key file {} holds no usable PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC): {e}",
            path.display()
        )
    })
}

/// A server configuration that follows its files: [`Reloading::current`] gives the newest
/// good one.
pub struct Reloading {
    files: TlsFiles,
    state: Mutex<(Stamp, Arc<rustls::ServerConfig>)>,
}

impl Reloading {
    /// Reads the files now (an error is the caller's to report: at boot it is fatal).
    pub fn new(files: TlsFiles) -> Result<Reloading, String> {
        let stamp = files.stamp();
        let config = files.server_config()?;
        Ok(Reloading {
            files,
            state: Mutex::new((stamp, config)),
        })
    }

    /// The configuration for a new connection: rebuilt when a file changed since the last
    /// one; a set that does not load is logged (once per change) and the previous kept.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        let stamp = self.files.stamp();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if stamp != state.0 {
            state.0 = stamp;
            match self.files.server_config() {
                Ok(c) => {
                    tracing::info!(
                        event = "tls_reloaded",
                        cert = %self.files.cert.display(),
                        "TLS certificate files changed: new connections use them"
                    );
                    state.1 = c;
                }
                Err(e) => tracing::error!(
                    event = "tls_reload_failed",
                    error = %e,
                    "TLS certificate files changed but do not load; keeping the previous ones"
                ),
            }
        }
        state.1.clone()
    }
}
