//! The listening socket's accept queue as the kernel reports it: how many connections wait
//! for a worker to take them, and how many it may hold.
//!
//! For a socket in the `LISTEN` state, Linux's `tcp_get_info` (`net/ipv4/tcp.c`) fills two
//! fields of `TCP_INFO` with the listener's figures instead of a connection's:
//! `tcpi_unacked` = `sk_ack_backlog`, the connections ready for `accept()`, and
//! `tcpi_sacked` = `sk_max_ack_backlog`, the `listen()` backlog as the kernel capped it
//! (`net.core.somaxconn`). They are the Recv-Q and Send-Q that `ss -lt` shows for the socket
//! (sock_diag reads the same two fields), and what uWSGI's master reads for its `listen
//! queue` figure. Reading them is one `getsockopt` on any descriptor of the socket: no
//! connection is taken or touched, so the master (which never serves traffic) can ask, on
//! the socket it bound or the one systemd handed over alike.
//!
//! With `TCP_DEFER_ACCEPT` (`master::listen`) a connection enters the queue only once its
//! client has sent something, so every connection counted has a request waiting.

use std::mem::size_of;
use std::os::fd::RawFd;

/// `TCP_LISTEN` in the kernel's `tcp_states.h` (what `tcpi_state` says of a listener).
const TCP_LISTEN: u8 = 10;

/// A listening socket's accept queue, now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Connections waiting to be accepted.
    pub waiting: u32,
    /// How many it may hold (past that the kernel drops or defers new connections).
    pub limit: u32,
}

/// The accept queue of the listening TCP socket `fd`; `None` when `fd` is not one (closed,
/// not TCP, not listening).
pub fn read(fd: RawFd) -> Option<Backlog> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is that large, and
    // fails cleanly on a descriptor that is not a TCP socket.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    let has_fields =
        len as usize >= std::mem::offset_of!(libc::tcp_info, tcpi_sacked) + size_of::<u32>();
    (rc == 0 && has_fields && info.tcpi_state == TCP_LISTEN).then_some(Backlog {
        waiting: info.tcpi_unacked,
        limit: info.tcpi_sacked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    /// Waits (bounded) until the queue reads `n`: a connection's last handshake step
    /// reaches the listener a moment after `connect` returns.
    fn wait_for(l: &TcpListener, n: u32) -> Backlog {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let b = read(l.as_raw_fd()).expect("a listening socket");
            if b.waiting == n || Instant::now() > deadline {
                return b;
            }
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_listener_reports_the_connections_waiting_and_its_limit() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: listen(2) again on the socket `l` owns only sets its backlog.
        assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 7) }, 0);
        assert_eq!(
            read(l.as_raw_fd()),
            Some(Backlog {
                waiting: 0,
                limit: 7
            })
        );
        let clients: Vec<TcpStream> = (0..3)
            .map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap())
            .collect();
        assert_eq!(wait_for(&l, 3).waiting, 3);
        let (taken, _) = l.accept().unwrap();
        assert_eq!(read(l.as_raw_fd()).unwrap().waiting, 2, "one taken");
        // A connection is not a listener; neither is a closed descriptor.
        assert_eq!(read(taken.as_raw_fd()), None);
        assert_eq!(read(clients[0].as_raw_fd()), None);
        assert_eq!(read(-1), None);
    }
}
