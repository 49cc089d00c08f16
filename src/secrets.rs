//! What a worker serves with that comes from files an operator may change while the server
//! runs — the API keys (`--api-key-file`, `--metrics-api-key-file`) and the TLS material
//! (`--tls-cert`, `--tls-key`, `--tls-client-ca`) — **as the master last accepted them**:
//! read and checked at start and at every accepted HUP (`master::config`), and handed to each
//! worker as it boots, so that a file emptied, half-written, deleted or swapped between
//! reloads never reaches a worker that recycling or a crash starts (such a file
//! made every replacement exit 2 and took the pool down).
//!
//! The hand-over is a sealed `memfd` (never on disk, never in the environment, never in a
//! log) on [`crate::protocol::SECRETS_FD`]: the master writes it once per accepted
//! configuration and every worker of that configuration gets a descriptor of it (exec'd
//! workers inherit it, forked ones receive it with their request to the template). Sealed
//! against writes, so no worker can change what its siblings read; read with `pread`, so
//! workers sharing the open file never share an offset.
//!
//! Where no memfd can be made (a kernel without `memfd_create`), workers read the files
//! themselves, as before, and the master says so once.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::auth::ApiKeys;
use crate::files::Stamp;
use crate::tls::{Reloading, TlsFiles, TlsMaterial};

/// The material, as read and checked.
#[derive(Default, Serialize, Deserialize)]
pub struct Secrets {
    /// The `--api-key-file`'s text (checked by `auth::ApiKeys::parse`).
    pub api_keys: Option<String>,
    /// The `--metrics-api-key-file`'s text.
    pub metrics_api_keys: Option<String>,
    /// The TLS files' bytes and their stamp when read.
    pub tls: Option<TlsMaterial>,
    #[serde(skip)]
    sealed: OnceLock<Option<OwnedFd>>,
    /// Each key file (option, path) with its stamp when it was read, and the stamp last
    /// reported as changed ([`Secrets::changed_key_files`]).
    #[serde(skip)]
    key_files: Vec<KeyFile>,
}

/// A key file as read for this material.
struct KeyFile {
    flag: &'static str,
    path: PathBuf,
    read_at: Option<Stamp>,
    reported: Mutex<Option<Stamp>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Secrets(api keys: {}, metrics keys: {}, tls: {})",
            self.api_keys.is_some(),
            self.metrics_api_keys.is_some(),
            self.tls.is_some()
        )
    }
}

impl Secrets {
    pub fn new(
        api_keys: Option<String>,
        metrics_api_keys: Option<String>,
        tls: Option<TlsMaterial>,
    ) -> Secrets {
        Secrets {
            api_keys,
            metrics_api_keys,
            tls,
            sealed: OnceLock::new(),
            key_files: Vec::new(),
        }
    }

    /// Records that the key file of `flag` was read at `path` with `stamp` (taken before
    /// the read), so that a later change can be told ([`Secrets::changed_key_files`]).
    pub fn with_key_file(mut self, flag: &'static str, path: &Path, stamp: Option<Stamp>) -> Self {
        self.key_files.push(KeyFile {
            flag,
            path: path.to_path_buf(),
            read_at: stamp,
            reported: Mutex::new(None),
        });
        self
    }

    /// The key files that changed on disk since they were read, each once per change,
    /// with whether the file as it is now loads (else why not): the workers keep the keys
    /// read then (this material) until a HUP reads the file again. The master asks as it
    /// starts a worker (and logs `key_file_changed`), so the operator hears of a broken
    /// file before a HUP refuses it.
    pub fn changed_key_files(&self) -> Vec<(&'static str, &Path, Result<(), String>)> {
        let mut out = Vec::new();
        for k in &self.key_files {
            let now = crate::files::stamp(&k.path);
            let mut reported = k.reported.lock().unwrap_or_else(|p| p.into_inner());
            if now == k.read_at || now == *reported {
                continue;
            }
            *reported = now;
            out.push((k.flag, k.path.as_path(), ApiKeys::load(&k.path).map(drop)));
        }
        out
    }

    /// Whether there is anything to hand over.
    pub fn is_empty(&self) -> bool {
        self.api_keys.is_none() && self.metrics_api_keys.is_none() && self.tls.is_none()
    }

    /// The sealed memfd holding this material (made at the first call); `None` when there
    /// is nothing to hand over or no memfd can be made (then workers read the files).
    pub fn fd(&self) -> Option<RawFd> {
        self.sealed
            .get_or_init(|| {
                if self.is_empty() {
                    return None;
                }
                seal(&serde_json::to_vec(self).expect("secrets serialize"))
                    .map_err(|e| {
                        tracing::warn!(
                            "cannot hand the key and certificate files' contents to workers in a memfd ({e}): \
                             workers read the files themselves when they boot"
                        )
                    })
                    .ok()
            })
            .as_ref()
            .map(|fd| fd.as_raw_fd())
    }

    /// The `--api-key-file` keys (`None`: no key file).
    pub fn api_keys(&self) -> Result<Option<ApiKeys>, String> {
        self.api_keys.as_deref().map(ApiKeys::parse).transpose()
    }

    /// The `--metrics-api-key-file` keys (`None`: no key file).
    pub fn metrics_keys(&self) -> Result<Option<ApiKeys>, String> {
        self.metrics_api_keys
            .as_deref()
            .map(ApiKeys::parse)
            .transpose()
    }

    /// TLS for `files`, from this material (read from the files when there is none).
    pub fn tls(&self, files: Option<&TlsFiles>) -> Result<Option<Reloading>, String> {
        let Some(files) = files else { return Ok(None) };
        match &self.tls {
            Some(m) => Reloading::from_material(files.clone(), m),
            None => Reloading::new(files.clone()),
        }
        .map(Some)
    }

    /// What a worker serves with: the material handed over on
    /// [`crate::protocol::SECRETS_FD`] when `handed` (the master's), else the files as they
    /// are now (a worker started by hand).
    pub fn for_worker(
        handed: bool,
        api_key_file: Option<&str>,
        metrics_api_key_file: Option<&str>,
        tls: Option<&TlsFiles>,
    ) -> Result<Secrets, String> {
        if handed {
            return Secrets::from_fd(crate::protocol::SECRETS_FD);
        }
        let read = |f: Option<&str>| {
            f.map(|f| ApiKeys::read(std::path::Path::new(f)))
                .transpose()
        };
        Ok(Secrets::new(
            read(api_key_file)?,
            read(metrics_api_key_file)?,
            tls.map(TlsFiles::read)
                .transpose()
                .map_err(|e| format!("TLS: {e}"))?,
        ))
    }

    /// Reads the material a worker was handed on `fd` (and closes it).
    pub fn from_fd(fd: RawFd) -> Result<Secrets, String> {
        // SAFETY: `fd` is the descriptor this process inherited for exactly this (the
        // worker's configuration says it has one); nothing else owns it.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let len = file
            .metadata()
            .map_err(|e| format!("the key and certificate hand-over (fd {fd}): {e}"))?
            .len() as usize;
        let mut buf = vec![0u8; len];
        let mut at = 0;
        while at < len {
            match file.read_at(&mut buf[at..], at as u64) {
                Ok(0) => break,
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("the key and certificate hand-over: {e}")),
            }
        }
        serde_json::from_slice(&buf[..at])
            .map_err(|e| format!("the key and certificate hand-over is not readable: {e}"))
    }
}

/// A memfd holding `data`, sealed against any change.
fn seal(data: &[u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: memfd_create reads a NUL-terminated name; the flags are valid.
    let raw = unsafe {
        libc::memfd_create(
            c"vramfork-secrets".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor memfd_create just returned, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let file = std::fs::File::from(fd.try_clone()?);
    file.write_all_at(data, 0)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS on our own memfd with valid seal flags.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_master_seals_is_what_a_worker_reads_and_nobody_can_change_it() {
        let s = Secrets::new(Some("0123456789abcdef\n".into()), None, None);
        let fd = s.fd().expect("a memfd");
        assert_eq!(s.fd(), Some(fd), "made once");
        // Two workers read it (each its own descriptor of the one file), whole, twice.
        for _ in 0..2 {
            // SAFETY: dup of a descriptor we own.
            let dup = unsafe { libc::dup(fd) };
            let got = Secrets::from_fd(dup).unwrap();
            assert_eq!(got.api_keys.as_deref(), Some("0123456789abcdef\n"));
            assert!(got.tls.is_none() && got.metrics_api_keys.is_none());
        }
        // SAFETY: borrowing our own open descriptor for one write attempt.
        let f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        assert!(f.write_all_at(b"x", 0).is_err(), "sealed against writes");
        assert!(Secrets::default().fd().is_none(), "nothing to hand over");
    }
}
