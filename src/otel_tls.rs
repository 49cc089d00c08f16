//! The trace export over `https://`: the rustls client configuration built from
//! what [`crate::otel::OtelTls`] names, as the OTLP exporter specification's "Certificate
//! File", "Client Certificate File" and "Client Key File" options say
//! (<https://opentelemetry.io/docs/specs/otel/protocol/exporter/#configuration-options>).
//!
//! - The collector's certificate is verified (chain, validity, and the endpoint's host as a
//!   DNS name or IP address in its subject alternative names) against the PEM certificates
//!   of `OTEL_EXPORTER_OTLP_(TRACES_)CERTIFICATE` when set, else of `SSL_CERT_FILE` and of
//!   the directories of `SSL_CERT_DIR` (one, or several separated by `:`; either or both
//!   variables, as OpenSSL reads them; a directory's
//!   files named `HASH.N` as `openssl rehash` makes them, or `*.pem`, `*.crt`, not its
//!   subdirectories), else of the system's bundle (`crate::otel::SYSTEM_BUNDLES`: read from
//!   the file the distribution keeps, as OpenSSL and curl do, so no crate beyond rustls is
//!   needed and the roots are the ones the operator's `update-ca-certificates` manages).
//! - A client certificate and key (mutual TLS) are sent when both are set.
//!
//! Every file is read as the serving TLS files are: a regular file (links followed) of
//! bounded size, opened without waiting; a FIFO, a device or an oversized file is refused
//! naming the variable. The master builds it once at start to check the files (a file or
//! directory that cannot be read, holds no certificate, or a key that does not parse: exit 2
//! naming the variable); each worker
//! builds it on its exporter thread. rustls with the *ring* provider; TLS 1.2 and 1.3.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::otel::{OtelTls, PemFile, CERT_DIR};

/// The largest PEM file read (a system bundle is about 200 KiB).
const MAX_PEM_BYTES: u64 = 4 << 20;
/// The most bytes of a CA directory's certificate files read in all (Debian's
/// `/etc/ssl/certs`, its bundle included, is under 1 MiB): a directory of thousands of
/// large files is refused rather than held in memory.
const MAX_DIR_BYTES: u64 = 32 << 20;

/// How a file is named in messages: `VAR=path`, or `the system's CA bundle (path)`.
fn named((var, path): &PemFile) -> String {
    if var.starts_with("OTEL_") || var.starts_with("SSL_") {
        format!("{var}={}", path.display())
    } else {
        format!("{var} ({})", path.display())
    }
}

/// A PEM file's bytes, read as the serving TLS files are ([`crate::files::read_regular`]):
/// a regular file of at most [`MAX_PEM_BYTES`], opened without waiting, so that a FIFO
/// (whose open waits for a writer) or a device (`/dev/zero`, endless) named by a variable is
/// refused at once instead of holding the start or growing the master without bound.
fn read(file: &PemFile) -> Result<Vec<u8>, String> {
    crate::files::read_regular(&file.1, MAX_PEM_BYTES)
        .map_err(|e| format!("{}: cannot be read: {e}", named(file)))
}

/// The PEM certificates of `file` (at least one).
fn certificates(file: &PemFile) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(&read(file)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", named(file)))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            named(file)
        ));
    }
    Ok(certs)
}

/// Whether a directory entry is one of the certificates a CA directory holds: `HASH.N`
/// (eight hex digits, a dot, a digit: `openssl rehash`'s links), or `*.pem`, `*.crt`.
fn is_certificate_name(name: &str) -> bool {
    let hashed = name.len() == 10
        && name[..8].chars().all(|c| c.is_ascii_hexdigit())
        && name[8..9] == *"."
        && name[9..].chars().all(|c| c.is_ascii_digit());
    hashed || name.ends_with(".pem") || name.ends_with(".crt")
}

/// The certificates of a CA directory (`SSL_CERT_DIR`): those of each of its files
/// [`is_certificate_name`] takes (links followed; a dangling link, a subdirectory or a file
/// without a certificate is passed over); at least one.
fn directory(dir: &PemFile) -> Result<Vec<CertificateDer<'static>>, String> {
    let cannot = |e: std::io::Error| format!("{}: cannot be read: {e}", named(dir));
    let mut certs = Vec::new();
    let mut read_bytes = 0u64;
    for entry in std::fs::read_dir(&dir.1).map_err(cannot)? {
        let path = entry.map_err(cannot)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let is_file = std::fs::metadata(&path).is_ok_and(|m| m.is_file());
        if !is_file || !is_certificate_name(name) {
            continue;
        }
        let file = (dir.0, path.clone());
        let pem = read(&file)?;
        read_bytes += pem.len() as u64;
        if read_bytes > MAX_DIR_BYTES {
            return Err(format!(
                "{}: its certificate files hold more than {MAX_DIR_BYTES} bytes in all",
                named(dir)
            ));
        }
        let found = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {}: {e}", named(dir), path.display()))?;
        certs.extend(found);
    }
    if certs.is_empty() {
        return Err(format!(
            "{}: holds no PEM certificate (files named HASH.0 as `openssl rehash` makes them, or *.pem, *.crt)",
            named(dir)
        ));
    }
    Ok(certs)
}

/// The client configuration for an `https://` endpoint, or why it cannot be made.
pub fn client_config(tls: &OtelTls) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut anchors = Vec::new();
    for source in &tls.roots {
        anchors.extend(if source.0 == CERT_DIR {
            directory(source)?
        } else {
            certificates(source)?
        });
    }
    anchors.sort_by(|a, b| a.as_ref().cmp(b.as_ref()));
    anchors.dedup();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(anchors);
    if added == 0 {
        let names: Vec<String> = tls.roots.iter().map(named).collect();
        return Err(format!(
            "{}: none of its certificates can be used as a trust anchor",
            names.join(" and ")
        ));
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS for the trace export: {e}"))?
    .with_root_certificates(roots);
    let mut config = match &tls.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = certificates(cert)?;
            let key_der = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| {
                format!(
                    "{}: holds no usable PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC): {e}",
                    named(key)
                )
            })?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                format!(
                    "{} and {}: not a certificate and its key: {e}",
                    named(cert),
                    named(key)
                )
            })?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(roots: &std::path::Path) -> OtelTls {
        OtelTls {
            host: "localhost".into(),
            roots: vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", roots.to_path_buf())],
            client: None,
        }
    }

    #[test]
    fn a_ca_file_missing_or_without_a_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = client_config(&tls(&missing)).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "OTEL_EXPORTER_OTLP_CERTIFICATE={}: cannot be read",
                missing.display()
            )),
            "{e}"
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = client_config(&tls(&junk)).unwrap_err();
        assert!(e.contains("junk.pem: holds no PEM certificate"), "{e}");
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_at_once_naming_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("ca.fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = client_config(&tls(&fifo)).unwrap_err();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_CERTIFICATE=") && e.contains("a FIFO"),
            "{e}"
        );
        let e = client_config(&tls(std::path::Path::new("/dev/zero"))).unwrap_err();
        assert!(
            e.starts_with(
                "OTEL_EXPORTER_OTLP_CERTIFICATE=/dev/zero: cannot be read: it is a device"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_ca_directory_takes_hashed_pem_and_crt_names_only() {
        for yes in ["0123abcd.0", "ABCDEF01.9", "ca.pem", "corp.crt"] {
            assert!(is_certificate_name(yes), "{yes}");
        }
        for no in ["0123abcd.a", "0123abc.0", "ca.key", "README", "0123abcdx0"] {
            assert!(!is_certificate_name(no), "{no}");
        }
    }

    #[test]
    fn a_ca_directory_missing_or_without_a_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let named_dir = |p: &std::path::Path| OtelTls {
            host: "localhost".into(),
            roots: vec![(CERT_DIR, p.to_path_buf())],
            client: None,
        };
        let missing = dir.path().join("missing");
        let e = client_config(&named_dir(&missing)).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "SSL_CERT_DIR={}: cannot be read",
                missing.display()
            )),
            "{e}"
        );
        // Empty, then only files that are not certificates (by name or by content).
        let e = client_config(&named_dir(dir.path())).unwrap_err();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        std::fs::write(dir.path().join("README"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        std::fs::write(dir.path().join("empty.pem"), "").unwrap();
        std::fs::create_dir(dir.path().join("sub.pem")).unwrap();
        let e = client_config(&named_dir(dir.path())).unwrap_err();
        assert!(
            e == format!("SSL_CERT_DIR={}: holds no PEM certificate (files named HASH.0 as `openssl rehash` makes them, or *.pem, *.crt)", dir.path().display()),
            "{e}"
        );
    }
}
