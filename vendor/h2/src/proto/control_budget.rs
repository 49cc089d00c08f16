//! A budget for the control frames a peer sends, counted against useful work, so that a
//! flood of cheap frames (WINDOW_UPDATE +1, SETTINGS, PING, RST_STREAM, PRIORITY, empty
//! DATA) cannot keep the connection busy for nothing: each such frame spends one unit, and
//! each useful frame (HEADERS, PUSH_PROMISE or a non-empty DATA received, a DATA frame
//! sent) adds [`PER_USEFUL`]; past [`INITIAL`] units more than that, the connection ends
//! with GOAWAY `ENHANCE_YOUR_CALM` ("too_many_control_frames"). As Envoy and nginx budget
//! control frames against the data they carry.
//!
//! A well-behaved peer stays far inside it: it sends a WINDOW_UPDATE per half window of
//! DATA it receives, a PING per keepalive period or per DATA frame it receives (gRPC's
//! bandwidth probes), a SETTINGS now and then.

use crate::frame::Frame;

/// Control frames a connection may send beyond [`PER_USEFUL`] per useful frame.
pub(crate) const INITIAL: u64 = 1_000;

/// Control frames allowed per useful frame.
pub(crate) const PER_USEFUL: u64 = 10;

#[derive(Debug, Default)]
pub(crate) struct ControlBudget {
    control: u64,
    useful: u64,
}

impl ControlBudget {
    /// A frame received, `data_sent` DATA frames sent so far on the connection: whether the
    /// peer is still within its budget.
    pub(crate) fn recv<B>(&mut self, frame: &Frame<B>, data_sent: u64) -> bool
    where
        B: bytes::Buf,
    {
        match frame {
            Frame::Headers(_) | Frame::PushPromise(_) => self.useful += 1,
            Frame::Data(d) if d.payload().has_remaining() => self.useful += 1,
            // An empty DATA that ends its stream is how many clients end a request.
            Frame::Data(d) if d.is_end_stream() => {}
            Frame::Data(_)
            | Frame::WindowUpdate(_)
            | Frame::Settings(_)
            | Frame::Ping(_)
            | Frame::Reset(_)
            | Frame::Priority(_) => self.control += 1,
            Frame::GoAway(_) => {}
        }
        self.control
            <= INITIAL.saturating_add(PER_USEFUL.saturating_mul(self.useful + data_sent))
    }
}
