//! The server's directory for unpacked AOTInductor packages
//! ([`crate::unpacked::fresh`] under the temporary directory: the master's pid and a
//! random suffix, chosen once; made, `0700`, by the first child that unpacks one): every
//! child is told it ([`crate::unpacked::ENV`]) and unpacks into `<pid>/` under it, removing
//! a CPU package's files as soon as it is loaded (a CUDA package's stay while its worker
//! runs). What a child leaves is removed when it is reaped ([`child_exited`]); the directory
//! itself at the master's end ([`Sweep`]'s drop), and any of a server that is gone at the
//! next start.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::unpacked::{fresh, owner_pid};

/// This server's directory (its name chosen at the first call).
pub fn own() -> PathBuf {
    static OWN: OnceLock<PathBuf> = OnceLock::new();
    OWN.get_or_init(|| fresh(&std::env::temp_dir(), std::process::id()))
        .clone()
}

/// Removes what the child `pid` unpacked and left (it was killed while loading).
pub fn child_exited(pid: u32) {
    let _ = std::fs::remove_dir_all(own().join(pid.to_string()));
}

/// Sweeps the directories of servers that are gone at start, and removes this server's own
/// when dropped.
pub struct Sweep;

impl Sweep {
    /// Sweeps, and chooses this server's directory's name: the first child that unpacks a
    /// package makes the directory, private (`0700`), so a server of TorchScript models
    /// never makes one.
    pub fn start() -> Sweep {
        sweep_dead(&std::env::temp_dir());
        let _ = own();
        Sweep
    }
}

impl Drop for Sweep {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(own());
    }
}

/// Removes every `vramfork-unpack-<pid>[-<hex>]` under `base` whose process is gone (one of
/// another user's cannot be removed from a sticky `/tmp`, and is left).
fn sweep_dead(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(owner_pid) else {
            continue;
        };
        if pid != std::process::id() && !alive(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Whether a process `pid` exists (one of another user counts as alive: not ours to sweep).
fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_directories_of_servers_that_are_gone_are_swept() {
        let base = tempfile::tempdir().unwrap();
        // A pid no process has (above the kernel's pid_max of 2^22).
        let gone = fresh(base.path(), 4_999_999);
        let gone_old = base.path().join("vramfork-unpack-4999999");
        let live = fresh(base.path(), std::process::id());
        let other = base.path().join("vramfork-unpack-notapid");
        for d in [&gone, &gone_old, &live, &other] {
            std::fs::create_dir_all(d.join("123")).unwrap();
        }
        sweep_dead(base.path());
        assert!(!gone.exists() && !gone_old.exists());
        assert!(live.exists() && other.exists());
    }

    /// The name is chosen once per server, and differs from one server to the next (so no
    /// other user can make it first and keep the server's workers from unpacking).
    #[test]
    fn a_servers_directory_is_named_once_and_unpredictably() {
        assert_eq!(own(), own());
        let name = own().file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(owner_pid(&name), Some(std::process::id()));
        assert_ne!(own(), fresh(&std::env::temp_dir(), std::process::id()));
        let guessable =
            std::env::temp_dir().join(format!("vramfork-unpack-{}", std::process::id()));
        assert_ne!(own(), guessable);
    }
}
