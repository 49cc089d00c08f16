//! NVIDIA MPS (Multi-Process Service), detected rather than assumed, and the per-client
//! memory limit the server inherits.
//!
//! **Detection.** A CUDA process runs as an MPS client when, as CUDA starts, it can connect
//! to the MPS control daemon's socket, `control` in `CUDA_MPS_PIPE_DIRECTORY` (default
//! `/tmp/nvidia-mps`; NVIDIA's MPS documentation, and `nvidia-cuda-mps-control(1)`: "If the
//! connection attempt fails, the program continues to run as it normally would without
//! MPS"). The master asks the same question the CUDA driver of its workers will ask: can
//! that socket be connected to now? The daemon (`nvidia-cuda-mps-control -d`) listens there
//! as a `SOCK_SEQPACKET` socket (`lsof` of a running daemon: `control type=SEQPACKET
//! (LISTEN)`), so the master connects as one, without blocking, and closes at once (the
//! daemon may log the connection). Linux answers a connection of another type with
//! `EPROTOTYPE`: something listens there, but not as the daemon does, and the CUDA driver
//! could not connect either — that is "no MPS", said with its reason (`--mps on` assumes
//! it anyway). A stream socket is deliberately not accepted: the workers' CUDA would not
//! become MPS clients through it, and a plan that assumes they do overcommits an
//! exclusive-process GPU.
//!
//! NVML does not answer it: its MPS list (`nvmlDeviceGetMPSComputeRunningProcesses_v3`)
//! is empty until a client runs, and a server listed for another pipe directory serves
//! other processes than ours.
//!
//! **The per-client limit.** `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` limits the device memory
//! each MPS client may allocate (NVIDIA's MPS documentation, CUDA 11.5 and later: a
//! comma-separated list of `<device ordinal>=<limit>`, e.g. `0=1G,1=512MB`; the control
//! daemon's `set_default_device_pinned_mem_limit <dev> <value>` sets the same default for
//! every client, its value "an integer followed by a qualifier, either G or M"). Every
//! worker is one client. [`ClientLimit`] parses what the operator (or whatever started the
//! server) set, in that form or as one bare value for every device (`10G`), so that the
//! plan is bounded by it (`plan::gpus`).

use std::os::fd::AsRawFd;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};

/// Why an MPS control daemon was not found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotDetected {
    /// What the look found, for the log.
    pub why: String,
    /// Something is at the daemon's path (a socket of another kind, one nobody listens on,
    /// one this user may not reach): worth saying at start. Nothing there (no such file or
    /// folder) is the usual case on a host without MPS.
    pub something_there: bool,
}

/// Whether an MPS control daemon listens in `pipe_dir`: `Ok` says where, `Err` why not.
pub fn detect(pipe_dir: &Path) -> Result<String, NotDetected> {
    let not = |why: String, something_there: bool| NotDetected {
        why,
        something_there,
    };
    let control = pipe_dir.join("control");
    let addr =
        UnixAddr::new(&control).map_err(|e| not(format!("{}: {e}", control.display()), true))?;
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| not(format!("cannot make a socket to look for MPS: {e}"), true))?;
    match connect(fd.as_raw_fd(), &addr) {
        // A full backlog (EAGAIN) still means a daemon listens there.
        Ok(()) | Err(Errno::EAGAIN) | Err(Errno::EINPROGRESS) => Ok(format!(
            "the MPS control daemon accepts connections at {}",
            control.display()
        )),
        Err(Errno::EPROTOTYPE) => Err(not(
            format!(
                "a socket listens at {} but not as the MPS control daemon does (SOCK_SEQPACKET): \
                 the workers' CUDA could not connect to it either, so they would not be MPS \
                 clients (--mps on assumes MPS anyway)",
                control.display()
            ),
            true,
        )),
        Err(e) => Err(not(
            format!("no MPS control daemon at {} ({e})", control.display()),
            !matches!(e, Errno::ENOENT | Errno::ENOTDIR),
        )),
    }
}

const MB: u64 = 1 << 20;

/// An MPS per-client device memory limit (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`), in MB:
/// one for every device, or per CUDA device ordinal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimit {
    /// A bare value (`10G`): every device.
    pub all: Option<u64>,
    /// `<ordinal>=<value>` entries.
    pub devices: Vec<(u32, u64)>,
}

impl ClientLimit {
    /// Parses the variable's value; `Err` says what is allowed.
    pub fn parse(v: &str) -> Result<ClientLimit, String> {
        let mut limit = ClientLimit {
            all: None,
            devices: Vec::new(),
        };
        let expected = "expected <device>=<size>[,<device>=<size>…] (NVIDIA's form, e.g. \
                        0=10G,1=512M) or one <size> for every device, a size being an integer \
                        followed by K, M, G or T (KB, MB, GB, TB; powers of 1024)";
        for entry in v.split(',').map(str::trim) {
            match entry.split_once('=') {
                Some((dev, size)) => {
                    let dev: u32 = dev
                        .trim()
                        .parse()
                        .map_err(|_| format!("device {dev:?} is not a number: {expected}"))?;
                    let mb = size_mb(size.trim()).ok_or(format!("{size:?}: {expected}"))?;
                    limit.devices.retain(|(d, _)| *d != dev);
                    limit.devices.push((dev, mb));
                }
                None if limit.all.is_none() && v.split(',').count() == 1 => {
                    limit.all = Some(size_mb(entry).ok_or(format!("{entry:?}: {expected}"))?);
                }
                None => return Err(format!("{entry:?}: {expected}")),
            }
        }
        Ok(limit)
    }

    /// The limit on CUDA device `ordinal`, MB, when one is set for it.
    pub fn on(&self, ordinal: u32) -> Option<u64> {
        self.devices
            .iter()
            .find(|(d, _)| *d == ordinal)
            .map(|(_, mb)| *mb)
            .or(self.all)
    }
}

/// `10G`, `512MB`, `4096M`… in MB (rounded down; powers of 1024, as MPS counts).
fn size_mb(s: &str) -> Option<u64> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let unit: u64 = match s[digits..].to_ascii_uppercase().as_str() {
        "K" | "KB" => 1 << 10,
        "M" | "MB" => MB,
        "G" | "GB" => 1 << 30,
        "T" | "TB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(unit).map(|b| b / MB)
}

/// A stand-in for the daemon in tests: a `SOCK_SEQPACKET` socket listening at
/// `dir/control`, as `nvidia-cuda-mps-control -d` listens.
#[cfg(test)]
pub(crate) fn listen_as_daemon(dir: &Path) -> std::os::fd::OwnedFd {
    use nix::sys::socket::{bind, listen, Backlog};
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(
        fd.as_raw_fd(),
        &UnixAddr::new(&dir.join("control")).unwrap(),
    )
    .unwrap();
    listen(&fd, Backlog::new(8).unwrap()).unwrap();
    fd
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon listens as `SOCK_SEQPACKET`; a stream socket there is
    /// not it (the workers' CUDA could not connect), and a socket left behind is nothing.
    #[test]
    fn a_listening_seqpacket_control_socket_is_mps_and_anything_else_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let not = detect(dir.path()).unwrap_err();
        assert!(not.why.starts_with("no MPS control daemon at"), "{not:?}");
        assert!(!not.something_there, "nothing at the path: {not:?}");
        let l = listen_as_daemon(dir.path());
        let how = detect(dir.path()).unwrap();
        assert!(how.contains("accepts connections"), "{how}");
        // A socket left behind by a daemon that is gone: something is there.
        drop(l);
        assert!(detect(dir.path()).unwrap_err().something_there);
        std::fs::remove_file(dir.path().join("control")).unwrap();
        let _stream = std::os::unix::net::UnixListener::bind(dir.path().join("control")).unwrap();
        let not = detect(dir.path()).unwrap_err();
        assert!(
            not.why.contains("not as the MPS control daemon does"),
            "{not:?}"
        );
        assert!(not.something_there, "{not:?}");
    }

    #[test]
    fn client_limits_are_read_in_nvidias_form_and_as_one_value() {
        let l = ClientLimit::parse("0=10G,1=512MB").unwrap();
        assert_eq!((l.on(0), l.on(1), l.on(2)), (Some(10_240), Some(512), None));
        let l = ClientLimit::parse("10G").unwrap();
        assert_eq!((l.on(0), l.on(7)), (Some(10_240), Some(10_240)));
        // The Kubernetes device plugin's figure: total ÷ replicas in MiB, "%vM".
        assert_eq!(ClientLimit::parse("0=8146M").unwrap().on(0), Some(8146));
        assert_eq!(ClientLimit::parse("2048k").unwrap().on(0), Some(2));
        for bad in ["", "10", "0=", "x=1G", "1G,2G", "0=1Q", "0=-1G"] {
            let e = ClientLimit::parse(bad).unwrap_err();
            assert!(e.contains("expected"), "{bad}: {e}");
        }
    }
}
