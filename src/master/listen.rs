//! Binding the listening socket that every worker inherits. A port in use is a
//! configuration error (exit 2) reported before any worker starts.
//!
//! The socket takes a connection into its accept queue only once the client has sent
//! something (`TCP_DEFER_ACCEPT`, up to [`DEFER_ACCEPT_S`]): a worker that accepts has the
//! request in hand, so it counts as busy at once and an idle sibling takes the next
//! connection; a client that connects and stays silent costs no worker anything until then.

use std::mem::size_of;
use std::net::{TcpListener, ToSocketAddrs};
use std::os::fd::AsRawFd;

use crate::master::config::ConfigError;

/// Connections the kernel queues while every worker is busy or recycling (capped by
/// `net.core.somaxconn`, 4096 by default).
pub const BACKLOG: i32 = 4096;
/// Seconds a connection that has sent nothing stays out of the accept queue.
pub const DEFER_ACCEPT_S: i32 = 1;

/// Raises this process's soft limit on open files to its hard limit (inherited by the
/// workers), so that a worker can hold many slow or idle connections. Best effort.
pub fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct on the stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

pub fn bind(host: &str, port: u16) -> Result<TcpListener, ConfigError> {
    let l = bind_plain(host, port, "--port")?;
    // SAFETY: `l` owns a valid listening socket; listen() on it again only raises the
    // backlog.
    unsafe { libc::listen(l.as_raw_fd(), BACKLOG) };
    defer_accept(&l);
    Ok(l)
}

/// Binds `host:port` with the standard library's defaults; errors name `flag` (the option
/// that chose the port).
pub fn bind_plain(host: &str, port: u16, flag: &str) -> Result<TcpListener, ConfigError> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| ConfigError(format!("cannot resolve --host '{host}': {e}")))?
        .collect();
    let mut last = None;
    for addr in addrs {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some((addr, e)),
        }
    }
    Err(match last {
        Some((addr, e)) if e.kind() == std::io::ErrorKind::AddrInUse => ConfigError(format!(
            "cannot listen on {addr}: the port is already in use (choose another with {flag})"
        )),
        Some((addr, e)) => ConfigError(format!("cannot listen on {addr} ({flag}): {e}")),
        None => ConfigError(format!("--host '{host}' resolved to no address")),
    })
}

/// Sets `TCP_DEFER_ACCEPT` ([`DEFER_ACCEPT_S`]) on a listening TCP socket: on the one this
/// process bound, and on one handed over by systemd, so both behave the same. Best effort.
pub fn defer_accept(l: &TcpListener) {
    // SAFETY: setsockopt on a descriptor `l` owns reads one int from the stack.
    unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&DEFER_ACCEPT_S as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        );
    }
}
