//! Where a server's processes unpack AOTInductor packages: one directory per server under
//! the temporary directory, named by the master's pid ([`dir`]), told to every child in
//! [`ENV`]; each process unpacks into `<pid>/` under it. The master sweeps it
//! (`master::unpack`); the worker writes into it (`worker/src/exported/aoti.rs`).

use std::path::{Path, PathBuf};

/// Environment: the server's directory ([`dir`] of the master's pid).
pub const ENV: &str = "VRAMFORK_UNPACK_DIR";

/// Every server's directory is this, then the master's pid.
pub const PREFIX: &str = "vramfork-unpack-";

/// The directory of the server whose master is `pid`, under the temporary directory `base`.
pub fn dir(base: &Path, pid: u32) -> PathBuf {
    base.join(format!("{PREFIX}{pid}"))
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
