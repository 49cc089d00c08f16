//! systemd socket activation: when the service manager hands this process a listening socket
//! (`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`, `sd_listen_fds(3)`), the master serves on it
//! instead of binding one, so connections that arrive while the service restarts wait in the
//! socket's queue instead of being refused. The socket must be one listening TCP stream; any
//! other hand-over is a configuration error (exit 2).

use std::net::TcpListener;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};

use crate::master::config::ConfigError;

/// A listening socket handed over by the service manager.
pub struct Inherited {
    pub listener: TcpListener,
    /// Its descriptor number and name (`LISTEN_FDNAMES`, "unknown" when unnamed).
    pub fd: RawFd,
    pub name: String,
}

/// Takes the socket systemd handed over, if any. Removes `LISTEN_PID`, `LISTEN_FDS` and
/// `LISTEN_FDNAMES` from the environment so that no child takes them for its own, and marks
/// the descriptor close-on-exec (workers get it through their own hand-over).
///
/// Must be called before this process starts a thread (it changes the environment).
pub fn inherited() -> Result<Option<Inherited>, ConfigError> {
    // SAFETY: called from `main` before any thread exists (see above), so nothing reads the
    // environment while it changes.
    let fds: Vec<(RawFd, String)> = unsafe { sd_notify::listen_fds_with_names_and_unset_env() }
        .map_err(|e| ConfigError(format!("socket activation: {e}")))?
        .collect();
    match fds.len() {
        0 => Ok(None),
        1 => {
            let (fd, name) = fds.into_iter().next().expect("one descriptor");
            // SAFETY: systemd handed this descriptor to this process (LISTEN_PID matched) and
            // nothing else in it has taken it.
            let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
            check(borrowed).map_err(|why| {
                ConfigError(format!(
                    "socket activation: the socket handed over by systemd (fd {fd}, name \
                     '{name}') is {why}; vramfork serves HTTP on a listening TCP stream socket \
                     (ListenStream= with an address and port in the .socket unit)"
                ))
            })?;
            // SAFETY: as above; from here on the TcpListener owns the descriptor.
            let listener = unsafe { TcpListener::from_raw_fd(fd) };
            crate::master::listen::defer_accept(&listener);
            Ok(Some(Inherited { listener, fd, name }))
        }
        n => Err(ConfigError(format!(
            "socket activation: systemd handed over {n} sockets ({}); vramfork serves one: give \
             the .socket unit a single ListenStream=",
            fds.iter()
                .map(|(fd, name)| format!("fd {fd} '{name}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Why `fd` is not a listening TCP stream socket, if it is not one.
pub fn check(fd: BorrowedFd<'_>) -> Result<(), String> {
    let int_opt = |opt: i32| -> Result<i32, String> {
        crate::sockopt::socket_option(fd.as_raw_fd(), opt).map_err(|e| e.to_string())
    };
    let domain = int_opt(libc::SO_DOMAIN)?;
    let kind = int_opt(libc::SO_TYPE)?;
    let listening = int_opt(libc::SO_ACCEPTCONN)? != 0;
    let family = match domain {
        libc::AF_INET => "IPv4",
        libc::AF_INET6 => "IPv6",
        libc::AF_UNIX => "a Unix socket",
        _ => "a socket of another family",
    };
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(family.to_string());
    }
    match kind {
        libc::SOCK_STREAM if listening => Ok(()),
        libc::SOCK_STREAM => Err(format!("an {family} stream socket that is not listening")),
        libc::SOCK_DGRAM => Err(format!("an {family} datagram (UDP) socket")),
        _ => Err(format!("an {family} socket of another type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_listening_tcp_socket_is_accepted() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(check(l.as_fd()), Ok(()));
    }

    #[test]
    fn other_sockets_are_refused_with_what_they_are() {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            check(udp.as_fd()),
            Err("an IPv4 datagram (UDP) socket".to_string())
        );

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(
            check(client.as_fd()),
            Err("an IPv4 stream socket that is not listening".to_string())
        );

        let dir = tempfile::tempdir().unwrap();
        let unix = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        assert_eq!(check(unix.as_fd()), Err("a Unix socket".to_string()));

        let file = std::fs::File::open("/dev/null").unwrap();
        let e = check(file.as_fd()).unwrap_err();
        assert!(e.starts_with("not a socket"), "{e}");
    }
}
