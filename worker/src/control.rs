//! The control channel to the master (inherited Unix stream socket on fd 4): one JSON
//! message per line ([`ControlMsg`]). Without a channel (a hand-started worker) messages
//! are only logged. A broken channel is reported once and then ignored: the master notices
//! a dead worker by other means.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use vramfork::protocol::{ControlMsg, CONTROL_FD};

pub struct Control {
    stream: Mutex<Option<UnixStream>>,
}

impl Control {
    /// Takes fd 4 when `has_control`; checks that it is a Unix stream socket.
    pub fn inherit(has_control: bool) -> Result<Control, String> {
        if !has_control {
            return Ok(Control::none());
        }
        crate::listener::check_socket(CONTROL_FD, libc::AF_UNIX, false)
            .map_err(|e| format!("control channel fd {CONTROL_FD}: {e}"))?;
        // SAFETY: fd 4 was checked above to be an open Unix stream socket that this process
        // inherited for exactly this purpose; nothing else in the process owns it.
        let stream = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
        crate::listener::set_cloexec(CONTROL_FD).map_err(|e| format!("control channel: {e}"))?;
        Ok(Control {
            stream: Mutex::new(Some(stream)),
        })
    }

    pub fn none() -> Control {
        Control {
            stream: Mutex::new(None),
        }
    }

    /// Whether a master's channel was inherited (and has not broken).
    pub fn attached(&self) -> bool {
        self.stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Sends one message (a short blocking write of one line).
    pub fn send(&self, msg: &ControlMsg) {
        tracing::debug!(?msg, "control");
        let mut guard = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = guard.as_mut() {
            if let Err(e) = s.write_all(msg.to_line().as_bytes()) {
                tracing::warn!("control channel to the master is broken ({e}); no more messages");
                *guard = None;
            }
        }
    }
}
