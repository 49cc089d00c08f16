//! What the kernel knows about the listen queue, which a pre-fork server cannot otherwise
//! see: whether connections are waiting in it, and how long an accepted connection's request
//! sat there before this worker took it.
//!
//! The wait is read from `TCP_INFO` on the accepted socket: `tcpi_last_data_recv` is the
//! time since the last data arrived, so for a connection whose request arrived and then
//! waited in the queue it is that wait. A connection that has sent nothing yet has no
//! request waiting (its request will be timed from its first byte instead).

use std::mem::size_of;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Whether `fd` has something to take, without waiting (a zero-timeout `poll`): for a
/// listening socket, connections waiting in its queue; for a connection, bytes (or its end)
/// not read yet.
pub fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one valid pollfd that lives on the stack, timeout 0.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLIN != 0
}

/// Takes one connection from the listen queue, non-blocking and close-on-exec in one call
/// (`WouldBlock` when none is waiting).
pub fn accept(listener: &std::net::TcpListener) -> std::io::Result<std::net::TcpStream> {
    // SAFETY: accept4 on the listening socket with no address buffers; the result is
    // checked and, when valid, a new descriptor that nothing else owns.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is the connected socket accept4 just returned.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// How long the request on a just-accepted connection has been waiting: `None` when the
/// client has sent nothing yet, or when the kernel cannot tell.
pub fn waited(stream: &impl AsRawFd) -> Option<Duration> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is that large.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    // Kernels older than 4.1 return a shorter struct without tcpi_bytes_received: then
    // trust last_data_recv only when it is shorter than the connection's life, i.e. always.
    let has_bytes_field = len as usize
        >= std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + size_of::<u64>();
    if has_bytes_field && info.tcpi_bytes_received == 0 {
        return None;
    }
    Some(Duration::from_millis(info.tcpi_last_data_recv.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn the_queue_and_a_requests_wait_are_seen() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!readable(l.as_raw_fd()));
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(readable(l.as_raw_fd()));
        let silent = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let wait = Duration::from_millis(300);
        std::thread::sleep(wait);
        let (a, _) = l.accept().unwrap();
        let (b, _) = l.accept().unwrap();
        assert!(!readable(l.as_raw_fd()));
        // The connection with a request has waited at least as long as the test slept (the
        // kernel counts in jiffies: allow one of them).
        let w = waited(&a).expect("a request was waiting");
        assert!(w + Duration::from_millis(10) >= wait, "{w:?}");
        assert_eq!(waited(&b), None, "the silent one has no request waiting");
        drop(silent);
    }
}
