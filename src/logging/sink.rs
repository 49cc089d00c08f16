//! Where this process's lines go: stderr, written without ever waiting on its reader.
//!
//! stderr is one open file description shared by the master, the template and every worker
//! (they inherit it), so setting `O_NONBLOCK` on it would change it for all of them — and
//! for whatever else shares it (a shell, a supervisor). Instead each process writes through
//! a description of its own where it can:
//!
//! | stderr is | written through |
//! |---|---|
//! | a pipe or FIFO, a terminal, a character device | a new description of the same file, opened `O_NONBLOCK` through `/proc/self/fd/2` |
//! | a socket (systemd's journal stream) | fd 2 itself, with `send(MSG_DONTWAIT)`: non-blocking for that call only |
//! | a regular file | fd 2 itself (a file never waits on a reader) |
//! | anything that cannot be reopened | fd 2, written only when `poll` says it is writable (which a race can still make wait) |
//!
//! A write of at most `PIPE_BUF` bytes to a pipe is atomic (POSIX), so whole lines of at
//! most that size never mix with other processes' lines, and a non-blocking one writes all
//! of it or nothing.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// Our own non-blocking description.
    Own,
    /// A socket: `send` with `MSG_DONTWAIT`.
    Socket,
    /// The shared descriptor, written when `poll` says it is writable.
    Plain,
    /// No stderr at all (fd 2 closed).
    Closed,
}

/// A descriptor to write lines to and how.
#[derive(Debug, Clone, Copy)]
pub struct Sink {
    fd: RawFd,
    how: How,
}

impl Sink {
    /// This process's stderr.
    pub fn stderr() -> Sink {
        Sink::open(libc::STDERR_FILENO)
    }

    /// `fd`, reopened when it is a pipe, FIFO or device.
    pub fn open(fd: RawFd) -> Sink {
        // SAFETY: stat is plain old data; all-zero is a valid value for fstat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes one stat into `st`; a bad descriptor is an error, not UB.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Sink {
                fd,
                how: How::Closed,
            };
        }
        let how = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => How::Plain,
            libc::S_IFSOCK => How::Socket,
            _ => match reopen(fd) {
                Some(own) => {
                    return Sink {
                        fd: own,
                        how: How::Own,
                    }
                }
                None => How::Plain,
            },
        };
        Sink { fd, how }
    }

    /// Writes what it can of `buf` now; `WouldBlock` when nothing can be written yet.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        let n = match self.how {
            How::Closed => return Err(io::ErrorKind::BrokenPipe.into()),
            // SAFETY: send(2) reads `buf.len()` bytes from a live slice.
            How::Socket => unsafe {
                libc::send(
                    self.fd,
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            },
            How::Plain if !self.wait_writable(Duration::ZERO) => {
                return Err(io::ErrorKind::WouldBlock.into())
            }
            // SAFETY: write(2) reads `buf.len()` bytes from a live slice.
            How::Own | How::Plain => unsafe {
                libc::write(self.fd, buf.as_ptr().cast(), buf.len())
            },
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Waits at most `timeout` for room to write; whether there is (an error on the
    /// descriptor counts as room: the write will say what it is).
    pub fn wait_writable(&self, timeout: Duration) -> bool {
        if self.how == How::Closed {
            return true;
        }
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: poll(2) on one pollfd that lives across the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        n > 0
    }
}

/// A description of our own of the file `fd` refers to, non-blocking and close-on-exec.
fn reopen(fd: RawFd) -> Option<RawFd> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).ok()?;
    let flags = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: open(2) with a NUL-terminated path; the descriptor it returns is ours.
    let own = unsafe { libc::open(path.as_ptr(), flags) };
    (own >= 0).then_some(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (RawFd, RawFd) {
        let mut fds = [0; 2];
        // SAFETY: a 2-int array for the kernel to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        (fds[0], fds[1])
    }

    fn nonblocking(fd: RawFd) -> bool {
        // SAFETY: F_GETFL on a descriptor this test owns.
        unsafe { libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0 }
    }

    #[test]
    fn a_full_pipe_refuses_whole_writes_and_leaves_the_shared_descriptor_blocking() {
        let (r, w) = pipe();
        let sink = Sink::open(w);
        assert_eq!(sink.how, How::Own);
        assert!(!nonblocking(w), "the shared description is left as it was");
        let line = [b'x'; 4096];
        let mut written = 0;
        loop {
            match sink.write(&line) {
                Ok(n) => {
                    assert_eq!(n, line.len(), "all of it or nothing");
                    written += n;
                }
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    break;
                }
            }
        }
        assert!(written >= 4096);
        assert!(!sink.wait_writable(Duration::from_millis(10)));
        let mut buf = vec![0u8; 8192];
        // SAFETY: reading into a live buffer from our own read end.
        let n = unsafe { libc::read(r, buf.as_mut_ptr().cast(), buf.len()) };
        assert!(n > 0);
        assert!(sink.wait_writable(Duration::from_millis(10)));
        assert_eq!(sink.write(&line).unwrap(), line.len());
        // SAFETY: closing descriptors this test owns.
        unsafe {
            libc::close(sink.fd);
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn a_regular_file_is_written_as_it_is() {
        let f = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        let sink = Sink::open(fd);
        assert_eq!((sink.how, sink.fd), (How::Plain, fd));
        assert_eq!(sink.write(b"line\n").unwrap(), 5);
    }

    #[test]
    fn a_closed_descriptor_drops_lines() {
        let sink = Sink::open(-1);
        assert_eq!(sink.how, How::Closed);
        assert!(sink.write(b"x\n").is_err());
    }
}
