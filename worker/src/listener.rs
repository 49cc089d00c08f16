//! The inherited listening socket (fd 3, systemd's `LISTEN_FDS` convention): checks that it
//! really is a listening TCP socket, marks it close-on-exec and non-blocking, and hands it
//! to tokio. Also the small fd helpers the control channel shares.

use std::io;
use std::os::fd::{FromRawFd, RawFd};

use vramfork::protocol::{ENV_LISTEN_FDS, LISTEN_FD, METRICS_FD};

/// Takes over fd 3 as the worker's listener (hand it to tokio inside the runtime).
pub fn inherit() -> Result<std::net::TcpListener, String> {
    match std::env::var(ENV_LISTEN_FDS) {
        Ok(v) if v.trim() == "1" => {}
        Ok(v) => return Err(format!("{ENV_LISTEN_FDS} is \"{v}\"; the worker takes exactly one listening socket (1)")),
        Err(_) => return Err(format!("{ENV_LISTEN_FDS} is not set; the worker expects its listening socket on fd {LISTEN_FD} with {ENV_LISTEN_FDS}=1")),
    }
    let domain =
        socket_domain(LISTEN_FD).map_err(|e| format!("listening socket fd {LISTEN_FD}: {e}"))?;
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(format!("fd {LISTEN_FD} is not a TCP socket"));
    }
    check_socket(LISTEN_FD, domain, true)
        .map_err(|e| format!("listening socket fd {LISTEN_FD}: {e}"))?;
    set_cloexec(LISTEN_FD).map_err(|e| format!("listening socket fd {LISTEN_FD}: {e}"))?;
    // SAFETY: fd 3 was checked above to be an open, listening TCP stream socket inherited
    // for this purpose; from here on the listener owns it and nothing else uses the number.
    let std_listener = unsafe { std::net::TcpListener::from_raw_fd(LISTEN_FD) };
    std_listener.set_nonblocking(true).map_err(|e| {
        format!("listening socket fd {LISTEN_FD}: cannot make it non-blocking: {e}")
    })?;
    Ok(std_listener)
}

/// Takes over fd 5 as the `/metrics` listener of a development-mode worker.
pub fn inherit_metrics() -> Result<std::net::TcpListener, String> {
    let fd = METRICS_FD;
    let domain = socket_domain(fd).map_err(|e| format!("metrics socket fd {fd}: {e}"))?;
    check_socket(fd, domain, true).map_err(|e| format!("metrics socket fd {fd}: {e}"))?;
    set_cloexec(fd).map_err(|e| format!("metrics socket fd {fd}: {e}"))?;
    // SAFETY: fd 5 was checked above to be an open, listening stream socket inherited for
    // this purpose; from here on the listener owns it.
    Ok(unsafe { std::net::TcpListener::from_raw_fd(fd) })
}

fn getsockopt_int(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    vramfork::sockopt::socket_option(fd, opt)
}

fn socket_domain(fd: RawFd) -> io::Result<libc::c_int> {
    getsockopt_int(fd, libc::SO_DOMAIN)
}

/// Checks that `fd` is a stream socket of `domain`, and listening when `listening`.
pub fn check_socket(fd: RawFd, domain: libc::c_int, listening: bool) -> Result<(), String> {
    let d = socket_domain(fd).map_err(|e| e.to_string())?;
    if d != domain {
        return Err(format!(
            "socket has the wrong address family ({d}, expected {domain})"
        ));
    }
    let ty = getsockopt_int(fd, libc::SO_TYPE).map_err(|e| e.to_string())?;
    if ty != libc::SOCK_STREAM {
        return Err("not a stream socket".into());
    }
    if listening && getsockopt_int(fd, libc::SO_ACCEPTCONN).map_err(|e| e.to_string())? == 0 {
        return Err("the socket is not listening (listen() was not called)".into());
    }
    Ok(())
}

pub fn set_cloexec(fd: RawFd) -> Result<(), String> {
    // SAFETY: F_GETFD/F_SETFD on an fd only reads and sets its descriptor flags; an invalid
    // fd returns -1 and is reported.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(format!(
            "cannot set close-on-exec: {}",
            io::Error::last_os_error()
        ));
    }
    Ok(())
}
