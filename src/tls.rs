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
//! HTTP/1.1 is offered (ALPN `http/1.1`), and on the serving port HTTP/2 first (`h2`, for
//! gRPC: [`Reloading::offering_h2`]); TLS 1.2 and 1.3 with rustls's safe defaults.
//! [`Reloading`] stats the files at each new connection (three `stat` calls, against a
//! handshake's milliseconds) and builds a new configuration when one changed, so a rotated
//! certificate is used from the next connection on and open connections keep theirs; a
//! half-rotated or broken set is logged and the last good configuration stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// When each file last changed (`None`: cannot be looked at now).
pub type Stamp = Vec<Option<crate::files::Stamp>>;

/// The largest PEM file read (a chain of certificates, a CA bundle).
const MAX_PEM_BYTES: u64 = 4 << 20;

/// The ALPN protocol offered everywhere: HTTP/1.1.
const ALPN_HTTP11: &[u8] = b"http/1.1";
/// Offered first on the serving port, which speaks HTTP/2 too (gRPC).
const ALPN_H2: &[u8] = b"h2";

/// The files' bytes as they were read together, and their stamp just before: what the
/// master last accepted and hands to booting workers (`crate::secrets`).
#[derive(Clone, Serialize, Deserialize)]
pub struct TlsMaterial {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Option<Vec<u8>>,
    pub stamp: Stamp,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsMaterial(..)")
    }
}

impl TlsFiles {
    /// Reads the files (regular files only: `crate::files`) and checks that they make a
    /// server configuration; the message names the file and what is wrong with it, never
    /// key material.
    pub fn read(&self) -> Result<TlsMaterial, String> {
        self.load().map(|(m, _)| m)
    }

    /// [`TlsFiles::read`], with the configuration it made.
    fn load(&self) -> Result<(TlsMaterial, Arc<rustls::ServerConfig>), String> {
        let stamp = self.stamp();
        let read = |p: &Path, what: &str| {
            crate::files::read_regular(p, MAX_PEM_BYTES)
                .map_err(|e| format!("cannot read the {what} file {}: {e}", p.display()))
        };
        let m = TlsMaterial {
            cert: read(&self.cert, "certificate")?,
            key: read(&self.key, "private key")?,
            client_ca: match &self.client_ca {
                Some(p) => Some(read(p, "client CA")?),
                None => None,
            },
            stamp,
        };
        let config = self.server_config(&m)?;
        Ok((m, config))
    }

    /// Builds the server configuration from `m` (read from these files).
    pub fn server_config(&self, m: &TlsMaterial) -> Result<Arc<rustls::ServerConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = parse_certs(&m.cert, &self.cert, "certificate")?;
        let key = parse_key(&m.key, &self.key)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match (&self.client_ca, &m.client_ca) {
            (Some(ca), Some(pem)) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in parse_certs(pem, ca, "client CA")? {
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
            _ => builder.with_no_client_auth(),
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
            .map(|p| crate::files::stamp(p))
            .collect()
    }
}

fn parse_certs(
    bytes: &[u8],
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(bytes)
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

fn parse_key(bytes: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| {
        format!(
            "the private key file {} holds no usable PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC): {e}",
            path.display()
        )
    })
}

/// A failed handshake's error, worded so an operator can act on it. rustls 0.23 passes some
/// of webpki's refusals through only as `Other(…)` (`rustls::webpki::pki_error`): among
/// them an X.509 version 1 client certificate (`UnsupportedCertVersion`), which webpki never
/// accepts, and which `openssl x509 -req` makes when no extensions are given.
pub fn handshake_failure(e: &str) -> String {
    if e.contains("UnsupportedCertVersion") {
        format!(
            "{e}: the client's certificate is X.509 version 1, and only version 3 certificates are accepted; issue it with extensions (openssl x509 -req … -extfile FILE, FILE holding extendedKeyUsage=clientAuth)"
        )
    } else {
        e.to_string()
    }
}

/// Whether a failed handshake's error is about the peer's certificate (worth the
/// operator's attention, unlike a client that hung up).
pub fn is_certificate_refusal(e: &str) -> bool {
    e.contains("certificate")
}

/// `config` offering `h2` before `http/1.1`.
fn with_h2(mut config: Arc<rustls::ServerConfig>) -> Arc<rustls::ServerConfig> {
    Arc::make_mut(&mut config).alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
    config
}

/// A server configuration that follows its files: [`Reloading::current`] gives the newest
/// good one.
pub struct Reloading {
    files: TlsFiles,
    state: Mutex<(Stamp, Arc<rustls::ServerConfig>)>,
    /// ALPN offers `h2` before `http/1.1` (the serving port; not the metrics port's).
    h2: bool,
}

impl Reloading {
    /// Reads the files now (an error is the caller's to report: at start it is fatal).
    pub fn new(files: TlsFiles) -> Result<Reloading, String> {
        let m = files.read()?;
        Reloading::from_material(files, &m)
    }

    /// Starts from material read earlier (the master's last accepted, handed to a booting
    /// worker) with the stamp it was read at: the first connection compares that stamp with
    /// the files on disk, so a rotation since then is taken up (when it loads) and a file
    /// broken since then is not (the material stays).
    pub fn from_material(files: TlsFiles, m: &TlsMaterial) -> Result<Reloading, String> {
        let config = files.server_config(m)?;
        Ok(Reloading {
            files,
            state: Mutex::new((m.stamp.clone(), config)),
            h2: false,
        })
    }

    /// Offers HTTP/2 (ALPN `h2`) before HTTP/1.1: for the serving port, whose connections
    /// speak either (gRPC needs HTTP/2).
    pub fn offering_h2(mut self) -> Reloading {
        self.h2 = true;
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        state.1 = with_h2(state.1.clone());
        self
    }

    /// The configuration for a new connection: rebuilt when a file changed since the last
    /// one; a set that does not load is logged (once per change) and the previous kept.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        let stamp = self.files.stamp();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if stamp != state.0 {
            state.0 = stamp;
            match self.files.load().map(|(_, c)| c) {
                Ok(c) => {
                    let c = if self.h2 { with_h2(c) } else { c };
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
