//! Binding the listening socket that every worker inherits. A port in use is a
//! configuration error (exit 2) reported before any worker starts.

use std::net::{TcpListener, ToSocketAddrs};
use std::os::fd::AsRawFd;

use crate::config::ConfigError;

/// Connections the kernel queues while every worker is busy or recycling.
pub const BACKLOG: i32 = 1024;

pub fn bind(host: &str, port: u16) -> Result<TcpListener, ConfigError> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| ConfigError(format!("cannot resolve --host '{host}': {e}")))?
        .collect();
    let mut last = None;
    for addr in addrs {
        match TcpListener::bind(addr) {
            Ok(l) => {
                // SAFETY: `l` owns a valid listening socket; listen() on it again only
                // raises the backlog.
                unsafe { libc::listen(l.as_raw_fd(), BACKLOG) };
                return Ok(l);
            }
            Err(e) => last = Some((addr, e)),
        }
    }
    Err(match last {
        Some((addr, e)) if e.kind() == std::io::ErrorKind::AddrInUse => ConfigError(format!(
            "cannot listen on {addr}: the port is already in use (choose another with --port)"
        )),
        Some((addr, e)) => ConfigError(format!("cannot listen on {addr}: {e}")),
        None => ConfigError(format!("--host '{host}' resolved to no address")),
    })
}
