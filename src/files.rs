//! Reading an operator's file (key files, TLS material, the app metadata) without ever
//! blocking the thread that reads it: the master's loop on a HUP, a metrics scrape, a
//! connection's TLS set-up. Only a regular file is read, at most a given size: a FIFO
//! (whose `open` waits for a writer, and whose `read` waits for data), a device
//! (`/dev/zero`, endless) or a socket is refused with a message naming what it is.
//!
//! The file is opened with `O_NONBLOCK` — which makes opening a FIFO return at once instead
//! of waiting for a writer (open(2)), and has no effect on a regular file's reads — then
//! checked with `fstat` on the open descriptor (so a file swapped after the check is not
//! the one read). Symbolic links are followed: Kubernetes mounts secrets through them.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// When a file last changed: its modification time, size and inode (a file replaced by a
/// rename, as Kubernetes updates a mounted secret, has another inode); `None` when it
/// cannot be looked at. Symbolic links are followed.
pub type Stamp = (std::time::SystemTime, u64, u64);

pub fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Reads `path` whole when it is a regular file of at most `max` bytes; the error says
/// what `path` is when it is not, and never quotes its content.
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO (named pipe)"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {what}, not a regular file"),
        ));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it has {} bytes, more than the {max} allowed", meta.len()),
        ));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    // A file that grows while it is read is cut at the limit (and refused): `take` keeps a
    // writer appending forever from holding this thread.
    file.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it grew past the {max} bytes allowed while it was read"),
        ));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_are_read_and_everything_else_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys");
        std::fs::write(&f, b"0123456789abcdef\n").unwrap();
        assert_eq!(read_regular(&f, 100).unwrap(), b"0123456789abcdef\n");
        let e = read_regular(&f, 10).unwrap_err().to_string();
        assert!(e.contains("17 bytes, more than the 10 allowed"), "{e}");
        // A FIFO nobody writes to: refused at once (a plain open would wait for a writer).
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_regular(&fifo, 100).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");
        let e = read_regular(Path::new("/dev/zero"), 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a device"), "{e}");
        let e = read_regular(dir.path(), 100).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        // Through a symbolic link (how Kubernetes mounts secrets).
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(read_regular(&link, 100).unwrap(), b"0123456789abcdef\n");
    }
}
