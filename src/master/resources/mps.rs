//! NVIDIA MPS (Multi-Process Service), detected rather than assumed. A CUDA process runs as
//! an MPS client when, as CUDA starts, it can connect to the MPS control daemon's socket,
//! `control` in `CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`; NVIDIA's MPS
//! documentation, and `nvidia-cuda-mps-control(1)`: "If the connection attempt fails, the
//! program continues to run as it normally would without MPS"). The master asks the same
//! question the CUDA driver of its workers will ask: can that socket be connected to now?
//! It connects without blocking and closes at once (the daemon may log the connection).
//!
//! NVML does not answer it: its MPS list (`nvmlDeviceGetMPSComputeRunningProcesses_v3`)
//! is empty until a client runs, and a server listed for another pipe directory serves
//! other processes than ours.

use std::os::fd::AsRawFd;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};

/// Whether an MPS control daemon listens in `pipe_dir`: `Ok` says where, `Err` why not.
pub fn detect(pipe_dir: &Path) -> Result<String, String> {
    let control = pipe_dir.join("control");
    let addr = UnixAddr::new(&control).map_err(|e| format!("{}: {e}", control.display()))?;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("cannot make a socket to look for MPS: {e}"))?;
    match connect(fd.as_raw_fd(), &addr) {
        // A full backlog (EAGAIN) still means a daemon listens there.
        Ok(()) | Err(Errno::EAGAIN) | Err(Errno::EINPROGRESS) => Ok(format!(
            "the MPS control daemon accepts connections at {}",
            control.display()
        )),
        Err(e) => Err(format!(
            "no MPS control daemon at {} ({e})",
            control.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_control_socket_is_mps_and_anything_else_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let why = detect(dir.path()).unwrap_err();
        assert!(why.starts_with("no MPS control daemon at"), "{why}");
        let l = std::os::unix::net::UnixListener::bind(dir.path().join("control")).unwrap();
        let how = detect(dir.path()).unwrap();
        assert!(how.contains("accepts connections"), "{how}");
        // A socket left behind by a daemon that is gone.
        drop(l);
        assert!(detect(dir.path()).is_err());
    }
}
