//! The master's side of the template process (see [`crate::master::worker_config::TemplateRequest`]):
//! starting it, knowing when it is ready, and asking it for a worker. A worker from the
//! template is ready in milliseconds; when the template is not usable (still loading, dead,
//! or unfit to fork) workers are started by fork+exec instead.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use super::spawn::{launch_with, Launched, WorkerSpec};
use super::worker_config::{TemplateRequest, WorkerConfig};
use crate::protocol::{take_line, BootTimes, ControlMsg, ReadyMemory, TemplateReply, ENV_TEMPLATE};

/// How long the master waits for the template to answer one request.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// A started template process.
pub struct Template {
    pub pid: u32,
    control: UnixStream,
    buf: Vec<u8>,
    pub ready: bool,
    pub started: Instant,
    /// The configuration generation whose model it holds.
    pub cfg_gen: u64,
}

impl Template {
    /// Starts `binary` as the template for `config` (its model and torch threads), with the
    /// idle board its forked workers will use.
    pub fn start(
        binary: &std::path::Path,
        config: &WorkerConfig,
        listener: &TcpListener,
        board: Option<std::os::fd::RawFd>,
        cfg_gen: u64,
    ) -> std::io::Result<Template> {
        // The template serves nothing: no keys, no certificate (its workers get theirs with
        // each request).
        let spec = WorkerSpec {
            config: config.clone(),
            board,
            secrets: None,
        };
        let l = launch_with(binary, &spec, listener, &[(ENV_TEMPLATE, "1")])?;
        Ok(Template {
            pid: l.pid,
            control: l.control,
            buf: Vec::new(),
            ready: false,
            started: Instant::now(),
            cfg_gen,
        })
    }

    /// The descriptor to poll while the template loads.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.control.as_fd()
    }

    /// Reads what arrived; when the template has just become ready, its boot times and
    /// host memory (with its warm-up's peak).
    pub fn poll_ready(&mut self) -> Option<(BootTimes, Option<ReadyMemory>)> {
        if self.ready {
            return None;
        }
        let mut chunk = [0u8; 1024];
        while let Ok(n) = (&self.control).read(&mut chunk) {
            if n == 0 {
                break;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        if let Some(line) = take_line(&mut self.buf) {
            if let Ok(ControlMsg::Ready {
                boot_ms, memory, ..
            }) = ControlMsg::from_line(&line)
            {
                self.ready = true;
                return Some((boot_ms, memory));
            }
        }
        None
    }

    /// Asks the template for a worker with `config`, handing it `secrets` (`SECRETS_FD`)
    /// when given.
    pub fn spawn(
        &mut self,
        config: &WorkerConfig,
        secrets: Option<std::os::fd::RawFd>,
    ) -> std::io::Result<Launched> {
        let (master_end, worker_end) = UnixStream::pair()?;
        let mut line = serde_json::to_vec(&TemplateRequest {
            config: config.clone(),
        })
        .expect("requests serialize");
        line.push(b'\n');
        let fds: Vec<_> = std::iter::once(worker_end.as_raw_fd())
            .chain(secrets)
            .collect();
        let iov = [std::io::IoSlice::new(&line)];
        self.control.set_nonblocking(false)?;
        self.control.set_write_timeout(Some(REPLY_TIMEOUT))?;
        let sent = sendmsg::<()>(
            self.control.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(std::io::Error::from)?;
        if sent < line.len() {
            self.control.write_all(&line[sent..])?;
        }
        drop(worker_end);
        let reply = self.read_reply();
        self.control.set_nonblocking(true)?;
        match reply? {
            TemplateReply::Spawned { pid } => {
                master_end.set_nonblocking(true)?;
                Ok(Launched {
                    pid,
                    control: master_end,
                })
            }
            TemplateReply::Failed { error } => Err(std::io::Error::other(error)),
        }
    }

    fn read_reply(&mut self) -> std::io::Result<TemplateReply> {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(line) = take_line(&mut self.buf) {
                return serde_json::from_str(&line).map_err(|e| {
                    std::io::Error::other(format!("bad template reply {line:?}: {e}"))
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the template did not answer",
                ));
            }
            self.control.set_read_timeout(Some(left))?;
            match (&self.control).read(&mut chunk) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the template closed its channel",
                    ))
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}
