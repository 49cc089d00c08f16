//! Forking from the template: twice, so the worker is re-parented to the master (a child
//! subreaper), then adopted (`PR_SET_PDEATHSIG` once the master is its parent).

use std::io::Read;
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use vramfork::protocol::{worker_exit, CONTROL_FD};

/// Forks twice. Returns the grandchild's pid in the template, once the intermediate child
/// has exited, so the grandchild is re-parented to the master (a child subreaper); returns
/// `None` in the grandchild.
pub fn double_fork() -> std::io::Result<Option<u32>> {
    let mut pipe = [0 as libc::c_int; 2];
    // SAFETY: `pipe` is a valid 2-int array for the kernel to fill.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the template is single-threaded (checked before it announced itself), so the
    // child is a faithful copy with no lock held by a vanished thread.
    let child = unsafe { libc::fork() };
    if child < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing the pipe we just made.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
        return Err(e);
    }
    if child == 0 {
        // Intermediate child: fork the grandchild, report its pid, leave.
        // SAFETY: still single-threaded (a copy of the template).
        let grandchild = unsafe { libc::fork() };
        if grandchild == 0 {
            // SAFETY: closing our copies of the pipe ends.
            unsafe {
                libc::close(pipe[0]);
                libc::close(pipe[1]);
            }
            return Ok(None);
        }
        let pid = grandchild.to_ne_bytes();
        // SAFETY: writing 4 bytes from a live buffer to our pipe end, then leaving at once
        // without running any destructor of the template's state.
        unsafe {
            libc::write(pipe[1], pid.as_ptr().cast(), pid.len());
            libc::_exit(0);
        }
    }
    // SAFETY: closing the write end in the template, so the read below ends if the child
    // dies without writing.
    unsafe { libc::close(pipe[1]) };
    let mut buf = [0u8; 4];
    // SAFETY: pipe[0] is our open read end; File takes ownership and closes it.
    let mut r = unsafe { std::fs::File::from_raw_fd(pipe[0]) };
    let got = r.read_exact(&mut buf);
    let mut status = 0;
    // SAFETY: reaping our own intermediate child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    got?;
    let pid = i32::from_ne_bytes(buf);
    if pid <= 0 {
        return Err(std::io::Error::other("the second fork failed"));
    }
    Ok(Some(pid as u32))
}

/// In a forked process, first: close the template's channel (fd 4: the master must see it
/// end when the template does, whoever else was forked), then wait to be adopted.
pub fn leave(master: i32) -> Result<(), i32> {
    // SAFETY: the template's control channel (fd 4) is not a forked process's to read;
    // `answer` forgets its handle to it without closing the number again.
    unsafe { libc::close(CONTROL_FD) };
    adopt(master).map_err(|()| worker_exit::OK)
}

/// In a forked process: wait to be re-parented to the master, then tie our life to it
/// (`PR_SET_PDEATHSIG`) and leave the template's process group.
fn adopt(master: i32) -> Result<(), ()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    // SAFETY: getppid, prctl and setpgid have no memory-safety preconditions.
    unsafe {
        while libc::getppid() != master {
            if Instant::now() > deadline {
                return Err(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != master {
            return Err(());
        }
        libc::setpgid(0, 0);
    }
    Ok(())
}
