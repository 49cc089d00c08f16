//! What the ledger may open, and how: its directory is checked as sshd checks a user's
//! files before trusting them (owner and mode), and every file in it is opened without
//! following a symbolic link, without blocking (a FIFO never stalls an `open`), close-on-exec,
//! and used only if it is a regular file — read through a bound, so that a huge file (or a
//! device behind a link) can never make a server read without end. Files this server makes
//! get their mode with `fchmod` after `open`, so that no umask can widen it.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the ledger cannot be used.
#[derive(Debug)]
pub enum Unusable {
    /// No directory there, and it could not be made: no server can be using it.
    Missing(PathBuf, std::io::Error),
    /// It is there but cannot be used safely or at all (the message names what and why).
    Refused(String),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::Missing(dir, e) => {
                write!(
                    f,
                    "{} does not exist and cannot be made ({e})",
                    dir.display()
                )
            }
            Unusable::Refused(why) => f.write_str(why),
        }
    }
}

/// The mode of the files servers share: the lock (opened for writing by each server) and
/// each server's entry (read by every other): the owner and the directory's group, never
/// other users.
pub const LOCK_MODE: u32 = 0o660;
pub const ENTRY_MODE: u32 = 0o640;
/// A directory a server makes itself: its user and group (set-group-ID, so that the files in
/// it take the directory's group), no other users.
const DIR_MODE: u32 = 0o2770;

/// What the directory check found.
#[derive(Debug, Clone, Copy)]
pub struct DirState {
    /// Writable by every user (then sticky, and owned by root or this user): any local user
    /// may put files there (see docs/security.md, "The GPU ledger").
    pub world_writable: bool,
}

fn euid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether this process is in group `gid` (its effective or a supplementary one).
fn in_group(gid: u32) -> bool {
    // SAFETY: getegid(2) has no preconditions.
    if unsafe { libc::getegid() } == gid {
        return true;
    }
    let mut groups = vec![0 as libc::gid_t; 256];
    // SAFETY: the buffer holds `groups.len()` gid_t; getgroups writes at most that many.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

/// The fix a refusal names.
const SET_UP: &str = "make it as the shipped tmpfiles.d line does (deploy/systemd/vramfork-tmpfiles.conf: `d /run/vramfork 2770 root vramfork -`, the servers' users in group vramfork), or give this server a ledger of its own with --ledger DIR, or plan alone with --ledger off";

/// Checks the ledger's directory (made when `create` and missing): a directory, not writable
/// by other users unless sticky and owned by root or this user, owned by root, this user or
/// shared with this user through its group (group-writable, this user in the group), and
/// usable by this user (`write`: to reserve; else to read).
pub fn check_dir(dir: &Path, create: bool, write: bool) -> Result<Option<DirState>, Unusable> {
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            make_dir(dir).map_err(|e| Unusable::Missing(dir.to_path_buf(), e))?;
            std::fs::metadata(dir).map_err(|e| Unusable::Missing(dir.to_path_buf(), e))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(Unusable::Missing(dir.to_path_buf(), e))
        }
        Err(e) => return Err(refused(dir, &format!("cannot be read ({e})"))),
    };
    if !meta.is_dir() {
        return Err(refused(dir, "is not a directory"));
    }
    let (mode, uid, gid) = (meta.mode(), meta.uid(), meta.gid());
    let me = euid();
    let world_writable = mode & 0o002 != 0;
    if world_writable && (mode & 0o1000 == 0 || (uid != 0 && uid != me)) {
        return Err(refused(
            dir,
            &format!("is writable by every user (mode {:o}) without being a sticky directory of root's or this user's: any user could replace what the servers read", mode & 0o7777),
        ));
    }
    let shared = mode & 0o020 != 0 && in_group(gid);
    if uid != 0 && uid != me && !shared && !world_writable {
        return Err(refused(
            dir,
            &format!("belongs to uid {uid}, not to root, this user (uid {me}) or a group this user shares it through"),
        ));
    }
    let want = if write {
        libc::R_OK | libc::W_OK | libc::X_OK
    } else {
        libc::R_OK | libc::X_OK
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| refused(dir, "has a NUL in its name"))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), want, libc::AT_EACCESS) } != 0 {
        let e = std::io::Error::last_os_error();
        let what = if write { "read and write" } else { "read" };
        return Err(refused(
            dir,
            &format!("cannot be used: this user (uid {me}) may not {what} it ({e}; mode {:o}, owner uid {uid}, group {gid}); other servers may be reserving there, so this one does not plan alone", mode & 0o7777),
        ));
    }
    Ok(Some(DirState { world_writable }))
}

fn refused(dir: &Path, why: &str) -> Unusable {
    Unusable::Refused(format!(
        "the GPU-memory ledger's directory {} {why}: {SET_UP}",
        dir.display()
    ))
}

/// Makes the directory (its parents as usual) with [`DIR_MODE`], set after `mkdir` so that no
/// umask narrows or widens it (without set-group-ID where the system refuses it).
fn make_dir(dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        // Another server made it meanwhile: it is checked as found.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        r => r?,
    }
    let set = |m| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(m));
    set(DIR_MODE).or_else(|_| set(DIR_MODE & 0o777))
}

/// What a file that is not a regular file is, in words.
fn kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        _ => "not a regular file",
    }
}

/// Opens `path` (for reading; with `create_mode`, for writing, made with that mode when
/// missing) without following a link or blocking, and only if it is a regular file; a file
/// this user owns gets `create_mode` again by `fchmod`. `Ok(None)`: no such file (reading).
pub fn open_regular(path: &Path, create_mode: Option<u32>) -> std::io::Result<Option<File>> {
    let mut o = std::fs::OpenOptions::new();
    o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    match create_mode {
        Some(m) => o.read(true).write(true).create(true).mode(m),
        None => o.read(true),
    };
    let f = match o.open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create_mode.is_none() => {
            return Ok(None)
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(not_regular(path, libc::S_IFLNK))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            // O_WRONLY|O_NONBLOCK on a FIFO with no reader.
            return Err(not_regular(path, libc::S_IFIFO));
        }
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", path.display()),
            ))
        }
    };
    let meta = f.metadata()?;
    if !meta.file_type().is_file() {
        return Err(not_regular(path, meta.mode()));
    }
    if let Some(m) = create_mode.filter(|_| meta.uid() == euid()) {
        if meta.mode() & 0o7777 != m {
            // SAFETY: fchmod(2) on a descriptor this function owns.
            if unsafe { libc::fchmod(f.as_raw_fd(), m) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(Some(f))
}

fn not_regular(path: &Path, mode: u32) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{} is {}, not a regular file: refused (someone made it there; remove it)",
            path.display(),
            kind(mode)
        ),
    )
}

/// The whole of `f`, at most `limit` bytes: a larger file is not what the ledger writes.
pub fn read_bounded(f: File, path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    f.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is larger than {limit} bytes: not what a server writes",
                path.display()
            ),
        ));
    }
    Ok(bytes)
}

/// Replaces `dir/name` with `bytes` (a new file, made exclusively without following a link,
/// then renamed over it: a reader never sees half of one, and the rename replaces a link
/// rather than writing through it).
pub fn replace(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    // SAFETY: fchmod(2) on a descriptor this function owns.
    if unsafe { libc::fchmod(f.as_raw_fd(), mode) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    std::io::Write::write_all(&mut f, bytes)?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))
}
