//! What either side asks of an inherited socket: its integer `SOL_SOCKET` options. The
//! master checks the socket systemd hands over (`master::activation`), a worker the one it
//! inherits on fd 3 (`worker/src/listener.rs`); both ask here.

use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;

/// An integer `SOL_SOCKET` option of `fd` (`SO_DOMAIN`, `SO_TYPE`, `SO_ACCEPTCONN`…). A
/// closed descriptor is `NotFound` ("not an open file descriptor"), one that is not a socket
/// `InvalidInput` ("not a socket").
pub fn socket_option(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut val: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `val` and `len` are valid for writes and `len` holds the size of `val`;
    // getsockopt only reads/writes within them, and fails cleanly on a bad fd.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(val)
    } else {
        let e = io::Error::last_os_error();
        Err(match e.raw_os_error() {
            Some(libc::EBADF) => {
                io::Error::new(io::ErrorKind::NotFound, "not an open file descriptor")
            }
            Some(libc::ENOTSOCK) => io::Error::new(io::ErrorKind::InvalidInput, "not a socket"),
            _ => e,
        })
    }
}
