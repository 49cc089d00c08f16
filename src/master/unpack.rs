//! The server's directory for unpacked AOTInductor packages
//! ([`crate::unpacked::dir`] under the temporary directory, named by the master's
//! pid, made by the first child that unpacks one): every child is told it
//! ([`crate::unpacked::ENV`]) and unpacks into
//! `<pid>/` under it, removing that as soon as the package is loaded. What a killed child
//! leaves is removed when it is reaped ([`child_exited`]); the directory itself at the
//! master's end ([`Sweep`]'s drop), and any of a server that is gone at the next start.

use std::path::PathBuf;

use crate::unpacked::{dir as unpack_dir, PREFIX as UNPACK_PREFIX};

/// This server's directory.
pub fn own() -> PathBuf {
    unpack_dir(&std::env::temp_dir(), std::process::id())
}

/// Removes what the child `pid` unpacked and left (it was killed while loading).
pub fn child_exited(pid: u32) {
    let _ = std::fs::remove_dir_all(own().join(pid.to_string()));
}

/// Sweeps the directories of servers that are gone at start, and removes this server's own
/// when dropped.
pub struct Sweep;

impl Sweep {
    /// Sweeps, this server's own name included (a process that had this pid before): the
    /// first child that unpacks a package makes the directory, private (`0700`), so a
    /// server of TorchScript models never makes one.
    pub fn start() -> Sweep {
        sweep_dead(&std::env::temp_dir());
        let own = own();
        let _ = std::fs::remove_dir_all(&own);
        let _ = std::fs::remove_file(&own);
        Sweep
    }
}

impl Drop for Sweep {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(own());
    }
}

/// Removes every `vramfork-unpack-<pid>` under `base` whose process is gone.
fn sweep_dead(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(UNPACK_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
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
        let gone = base.path().join(format!("{UNPACK_PREFIX}4999999"));
        let live = base
            .path()
            .join(format!("{UNPACK_PREFIX}{}", std::process::id()));
        let other = base.path().join("vramfork-unpack-notapid");
        for d in [&gone, &live, &other] {
            std::fs::create_dir_all(d.join("123")).unwrap();
        }
        sweep_dead(base.path());
        assert!(!gone.exists());
        assert!(live.exists() && other.exists());
    }
}
