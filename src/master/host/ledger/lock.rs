//! The ledger's lock (`flock` on `gpu-ledger.lock`), which serialises what must not
//! interleave between servers: reading the others' reservations, planning, and writing one's
//! own. It is only ever tried (`LOCK_NB`), for a bounded time: a holder — another server, or
//! anyone who could open the file — can delay a start by that bound, never freeze a master.
//! When the lock is busy, the holder's pid is looked up in `/proc/locks` for the message.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::files;

/// The lock, held until this is dropped (closing the descriptor lets it go).
#[derive(Debug)]
pub struct Held {
    _file: File,
}

/// Why the lock was not taken.
#[derive(Debug)]
pub enum NotTaken {
    /// Another open file holds it: the holder's pid as this process sees it (`None`: not
    /// found in `/proc/locks`, e.g. a process of another pid namespace).
    Busy(Option<u32>),
    /// The lock file cannot be opened or locked (the message names it).
    Failed(std::io::Error),
}

impl std::fmt::Display for NotTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTaken::Busy(Some(pid)) => write!(f, "the lock is held by pid {pid}"),
            NotTaken::Busy(None) => f.write_str(
                "the lock is held by a process this one cannot see (another pid namespace)",
            ),
            NotTaken::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Tries to take the lock at `path` for up to `within` (at once, then every 10 ms); calls
/// `waiting(holder)` once when the first try finds it busy.
pub fn take(
    path: &Path,
    within: Duration,
    waiting: impl FnOnce(Option<u32>),
) -> Result<Held, NotTaken> {
    let file = files::open_regular(path, Some(files::LOCK_MODE))
        .map_err(NotTaken::Failed)?
        .expect("opened for writing");
    let deadline = Instant::now() + within;
    let mut waiting = Some(waiting);
    loop {
        // SAFETY: flock(2) on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Held { _file: file });
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(NotTaken::Failed(e));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(NotTaken::Busy(holder(&file)));
        }
        if let Some(w) = waiting.take() {
            w(holder(&file));
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}

/// The pid holding an flock on `file`'s inode, from `/proc/locks` (lines such as
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF`; `->` marks a waiter, not a holder).
fn holder(file: &File) -> Option<u32> {
    let meta = file.metadata().ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&locks, meta.dev(), meta.ino())
}

fn holder_in(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    // glibc's encoding of a device number (what `stat` returns and the kernel prints).
    let maj = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let min = (dev & 0xff) | ((dev >> 12) & !0xff);
    let id = format!("{maj:02x}:{min:02x}:{ino}");
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&id.as_str()))
            .then(|| f[4].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_proc_locks_and_waiters_are_not_holders() {
        let dev = 0xfd01;
        let locks = "1: POSIX  ADVISORY  WRITE 11 fd:01:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 5151 fd:01:1234 0 EOF\n";
        assert_eq!(holder_in(locks, dev, 1234), Some(4242));
        assert_eq!(
            holder_in(locks, dev, 77),
            None,
            "a POSIX lock is not the flock"
        );
        assert_eq!(holder_in(locks, dev, 9), None);
    }

    #[test]
    fn a_busy_lock_is_tried_for_the_bound_then_named_busy_with_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let held = take(&path, Duration::ZERO, |_| {}).unwrap();
        let start = Instant::now();
        let mut said = None;
        let e = take(&path, Duration::from_millis(200), |h| said = Some(h)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(start.elapsed() >= Duration::from_millis(200));
        let me = std::process::id();
        assert!(matches!(e, NotTaken::Busy(Some(p)) if p == me), "{e:?}");
        assert_eq!(said, Some(Some(me)));
        drop(held);
        assert!(take(&path, Duration::ZERO, |_| {}).is_ok());
    }
}
