//! Where a server's processes unpack AOTInductor packages: one directory per server under
//! the temporary directory, named by the master's pid and a random suffix ([`fresh`]: no
//! other user can guess it, so none can make it first), told to every child in [`ENV`];
//! the first process that unpacks a package makes it, `0700`, and each unpacks into
//! `<pid>/` under it. The master sweeps it (`master::host::unpack`); the worker writes into it
//! (`worker/src/exported/aoti.rs`).

use std::path::{Path, PathBuf};

/// Environment: the server's directory ([`dir`] of the master's pid).
pub const ENV: &str = "VRAMFORK_UNPACK_DIR";

/// Every server's directory is this, then the master's pid.
pub const PREFIX: &str = "vramfork-unpack-";

/// A new directory name for the server whose master is `pid`, under the temporary directory
/// `base`: `vramfork-unpack-<pid>-<16 random hex digits>` (not made yet).
pub fn fresh(base: &Path, pid: u32) -> PathBuf {
    base.join(format!("{PREFIX}{pid}-{:016x}", random()))
}

/// The pid a server directory's name carries (`vramfork-unpack-<pid>-<hex>`, or the
/// `vramfork-unpack-<pid>` of earlier versions); `None` for any other name.
pub fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, suffix) = rest.split_once('-').unwrap_or((rest, "0"));
    let hex = !suffix.is_empty() && suffix.chars().all(|c| c.is_ascii_hexdigit());
    hex.then(|| pid.parse().ok()).flatten()
}

/// Whether `root` is a directory of the process `pid` itself (its name carries that pid):
/// a worker run alone, or development mode's, where the master became the worker.
pub fn is_own(root: &Path, pid: u32) -> bool {
    root.file_name()
        .and_then(|n| n.to_str())
        .and_then(owner_pid)
        == Some(pid)
}

/// 64 bits from the kernel's random source.
fn random() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is valid for 8 bytes; getrandom(2) writes at most that many.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == 8 {
        return u64::from_ne_bytes(buf);
    }
    // Without getrandom (a kernel before 3.17): the clock's nanoseconds and the pid, less
    // unpredictable, still never an existing directory's name reused (made with mkdir).
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

/// Makes sure `path` is a directory only this user can enter (created `0700` when absent):
/// the unpacked libraries are loaded into the server, so a directory another user made or
/// can write to (a name guessed in a shared `/tmp`, a symbolic link) is refused.
pub fn private_dir(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => return Ok(()),
        // Made before (by this server's other processes, or by someone else: checked).
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
    }
    match std::fs::symlink_metadata(path) {
        Err(e) => Err(format!("{}: {e}", path.display())),
        Ok(m) => {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let me = unsafe { libc::geteuid() };
            if m.is_dir() && m.uid() == me && m.mode() & 0o077 == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{} is not a directory of this user's alone (mode 0700): it is not used to unpack a package into; remove it",
                    path.display()
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn server_directories_are_unpredictable_and_carry_their_pid() {
        let base = Path::new("/tmp");
        let (a, b) = (fresh(base, 42), fresh(base, 42));
        assert_ne!(a, b, "two names for the same pid");
        let name = a.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("vramfork-unpack-42-") && name.len() == PREFIX.len() + 3 + 16);
        assert_eq!(owner_pid(name), Some(42));
        assert_eq!(
            owner_pid("vramfork-unpack-42"),
            Some(42),
            "an earlier version's"
        );
        assert_eq!(owner_pid("vramfork-unpack-notapid"), None);
        assert_eq!(owner_pid("vramfork-unpack-42-x"), None);
        assert!(is_own(&a, 42) && !is_own(&a, 43));
    }

    #[test]
    fn only_a_private_directory_of_ours_is_used() {
        let base = tempfile::tempdir().unwrap();
        let fresh = base.path().join("fresh");
        assert_eq!(private_dir(&fresh), Ok(()));
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(private_dir(&fresh), Ok(()), "ours already: used");
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_dir(&open).unwrap_err().contains("remove it"));
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        assert!(private_dir(&link).is_err(), "a symbolic link is refused");
    }
}
