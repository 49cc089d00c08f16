//! The descriptors the master sends the template for a worker (its control channel, and its
//! key and TLS material), as they cross the template's channel (`SCM_RIGHTS`), and where a
//! forked worker puts them.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use vramfork::protocol::{worker_exit, CONTROL_FD, SECRETS_FD};

/// The descriptors a request carries: the worker's control socket, then (when the master
/// has any) the key and TLS material for `SECRETS_FD` (`vramfork::secrets`).
pub type Attached = Vec<OwnedFd>;

/// Reads one request line and the descriptors attached to it.
pub fn receive(
    control: &UnixStream,
    pending: &mut Vec<u8>,
) -> std::io::Result<Option<(String, Attached)>> {
    let mut fds = Vec::new();
    loop {
        if let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            return Ok(Some((text, fds)));
        }
        let mut buf = vec![0u8; 64 * 1024];
        let (n, got) = recv_with_fds(control.as_raw_fd(), &mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        fds.extend(got);
        pending.extend_from_slice(&buf[..n]);
    }
}

fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Attached)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for a control message of a few descriptors (CMSG_SPACE of two ints is 24).
    let mut cmsg = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg);
    // SAFETY: msg points at `iov` (describing `buf`) and `cmsg`, both alive and writable
    // for the whole call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control buffer the kernel just filled in, within
    // msg_controllen; SCM_RIGHTS data is an array of int descriptors now owned by this
    // process, as many as fit in the message's length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for k in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    let raw = std::ptr::read_unaligned(data.add(k));
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, fds))
}

pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    const MAX_FDS: usize = 4;
    assert!(fds.len() <= MAX_FDS, "at most {MAX_FDS} descriptors");
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cmsg = [0u64; 8];
    let size = std::mem::size_of_val(fds) as u32;
    // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below, and the
    // control buffer (64 bytes) holds MAX_FDS descriptors (CMSG_SPACE(16) = 32).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(size) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size) as _;
        let slots = libc::CMSG_DATA(c) as *mut libc::c_int;
        for (k, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(slots.add(k), *fd);
        }
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if (n as usize) < data.len() {
            let mut s = std::mem::ManuallyDrop::new(UnixStream::from_raw_fd(sock));
            s.write_all(&data[n as usize..])?;
        }
    }
    Ok(())
}

/// Each received descriptor onto its number (control 4, material 7). They may sit on either
/// number, so each is first moved above them, then placed: no dup2 can clobber the other.
pub fn place(fds: Attached, secrets: bool) -> Result<(), i32> {
    let mut fds = fds.into_iter();
    let Some(control) = fds.next() else {
        return Err(worker_exit::CONFIG);
    };
    let material = if secrets {
        let Some(s) = fds.next() else {
            vramfork::logging::say("app-worker: the key and certificate hand-over is missing");
            return Err(worker_exit::CONFIG);
        };
        Some(s)
    } else {
        None
    };
    let mut high = Vec::new();
    for (fd, at) in [(Some(control), CONTROL_FD), (material, SECRETS_FD)] {
        let Some(fd) = fd else { continue };
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a descriptor this process owns (the original
        // closes when `fd` drops).
        let h = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
        if h < 0 {
            return Err(worker_exit::CONFIG);
        }
        high.push((h, at));
    }
    for (h, at) in high {
        // SAFETY: dup2 of our own copy onto its number, then the copy closed.
        unsafe {
            if libc::dup2(h, at) < 0 {
                return Err(worker_exit::CONFIG);
            }
            libc::close(h);
        }
    }
    Ok(())
}
