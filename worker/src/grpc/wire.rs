//! gRPC over HTTP/2 as the worker speaks it (the gRPC "PROTOCOL-HTTP2" specification): a
//! message is a compressed flag (always 0 here: no compression is offered), a 4-byte
//! big-endian length and the protobuf bytes ([`frame`], [`Reader`]); a call's status goes
//! in the trailers (`grpc-status`, `grpc-message` percent-encoded), or in the headers of a
//! call that fails before any message (a "Trailers-Only" answer); `grpc-timeout` is the
//! client's deadline ([`timeout`], [`deadline`]). [`GrpcBody`] is what a gRPC answer's body is: its frames
//! in hand, a stream's as they come, or a sibling's relayed.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderValue};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::infer::{Deadline, MAX_TIMEOUT_S};

/// The content type of gRPC requests and answers (`application/grpc+proto` and such too).
pub const CONTENT_TYPE: &str = "application/grpc";

/// What a call must be for this server to read it, before anything else: a gRPC content
/// type (else HTTP 415, as the specification asks of a request that is not gRPC's), with
/// protobuf messages (`application/grpc` or `application/grpc+proto`: another subtype, such
/// as `+json`, is `UNIMPLEMENTED`), uncompressed (a `grpc-encoding` other than `identity`
/// is `UNIMPLEMENTED`, as the specification says of an encoding the server does not
/// support; answers say `grpc-accept-encoding: identity`).
pub fn check_request(h: &HeaderMap) -> Result<(), ApiError> {
    let ct = h
        .get(hyper::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let Some(rest) = ct.as_deref().and_then(|c| {
        c.to_ascii_lowercase()
            .strip_prefix(CONTENT_TYPE)
            .map(str::to_string)
    }) else {
        return Err(ApiError::UnsupportedMediaType(format!(
            "a gRPC method was called with content-type {}: gRPC calls are application/grpc (or application/grpc+proto)",
            ct.as_deref().map_or("(none)".into(), |c| format!("{c:?}"))
        )));
    };
    let subtype = rest.split(';').next().unwrap_or_default().trim();
    if !(subtype.is_empty() || subtype == "+proto") {
        return Err(ApiError::NotImplemented(format!(
            "content-type {:?}: this server reads gRPC messages as protobuf only (application/grpc or application/grpc+proto)",
            ct.unwrap_or_default()
        )));
    }
    if let Some(enc) = h
        .get("grpc-encoding")
        .filter(|e| e.as_bytes() != b"identity")
    {
        return Err(ApiError::NotImplemented(format!(
            "grpc-encoding {:?} is not supported: this server takes uncompressed messages only (grpc-accept-encoding: identity)",
            String::from_utf8_lossy(enc.as_bytes())
        )));
    }
    Ok(())
}

/// A message framed for the wire.
pub fn frame(msg: &impl prost::Message) -> Bytes {
    let len = msg.encoded_len();
    let mut b = BytesMut::with_capacity(5 + len);
    b.put_u8(0);
    b.put_u32(len as u32);
    // The buffer has room for the whole message: encoding cannot fail.
    let _ = msg.encode(&mut b);
    b.freeze()
}

/// The message in a frame from [`Reader::next`].
pub fn message(framed: &Bytes) -> Bytes {
    framed.slice(5..)
}

/// A request body's messages, one at a time.
pub struct Reader {
    body: Incoming,
    buf: BytesMut,
    /// The largest message taken (`--max-body-mb`).
    limit: u64,
    ended: bool,
}

impl Reader {
    pub fn new(body: Incoming, limit: u64) -> Reader {
        Reader {
            body,
            buf: BytesMut::new(),
            limit,
            ended: false,
        }
    }

    /// The next message, framed as it came (its message: [`message`]); `None` once the body
    /// ended between messages. A message cut short, compressed, or over the limit is
    /// refused.
    pub async fn next(&mut self) -> Result<Option<Bytes>, ApiError> {
        loop {
            if self.buf.len() >= 5 {
                if self.buf[0] != 0 {
                    return Err(ApiError::BadRequest(
                        "a compressed gRPC message: this server takes uncompressed messages only (grpc-accept-encoding: identity)".into(),
                    ));
                }
                let len = u64::from((&self.buf[1..5]).get_u32());
                if len > self.limit {
                    return Err(ApiError::TooLarge { limit: self.limit });
                }
                let len = len as usize;
                if self.buf.len() >= 5 + len {
                    return Ok(Some(self.buf.split_to(5 + len).freeze()));
                }
                self.buf.reserve(5 + len - self.buf.len());
            }
            if self.ended {
                return match self.buf.is_empty() {
                    true => Ok(None),
                    false => Err(ApiError::BadRequest(format!(
                        "the request body ended inside a gRPC message ({} bytes of it)",
                        self.buf.len()
                    ))),
                };
            }
            match self.body.frame().await {
                None => self.ended = true,
                Some(Err(e)) => {
                    return Err(ApiError::BadRequest(format!(
                        "could not read the request body: {e}"
                    )))
                }
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The one message of a unary call (framed), within `within` (`BODY_READ`).
    pub async fn only(mut self, within: Duration) -> Result<Bytes, ApiError> {
        let read = async {
            let msg = self
                .next()
                .await?
                .ok_or_else(|| ApiError::BadRequest("the gRPC request has no message".into()))?;
            match self.next().await? {
                None => Ok(msg),
                Some(_) => Err(ApiError::BadRequest(
                    "a unary gRPC call sent more than one message".into(),
                )),
            }
        };
        tokio::time::timeout(within, read)
            .await
            .unwrap_or(Err(ApiError::BodyTimeout(within.as_secs())))
    }
}

/// `grpc-timeout` (1 to 8 digits and a unit: `H`, `M`, `S`, `m`, `u`, `n`): the client's
/// deadline from the request's arrival. A malformed value is the request's error.
pub fn timeout(h: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(v) = h.get("grpc-timeout") else {
        return Ok(None);
    };
    let bad = || {
        ApiError::BadRequest(format!(
            "grpc-timeout must be 1 to 8 digits and a unit (H, M, S, m, u, n), not {v:?}"
        ))
    };
    let s = v.to_str().map_err(|_| bad())?;
    if s.len() < 2 || s.len() > 9 {
        return Err(bad());
    }
    let (digits, unit) = s.split_at(s.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    Ok(Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    }))
}

/// `grpc-message`: percent-encoded, as the specification asks, outside printable ASCII
/// and for `%` itself.
pub fn message_value(m: &str) -> HeaderValue {
    let mut out = String::with_capacity(m.len());
    for b in m.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&out).expect("printable ASCII is a valid header value")
}

/// A gRPC answer's body.
pub enum GrpcBody {
    /// Frames in hand: a unary answer's message and trailers (none: a Trailers-Only answer).
    Frames(VecDeque<Frame<Bytes>>),
    /// A stream's answers as the handler sends them, trailers last.
    Stream(mpsc::Receiver<Frame<Bytes>>),
    /// A sibling's answer to a request handed to it, relayed as it arrives.
    Relay(Incoming),
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            GrpcBody::Frames(q) => Poll::Ready(q.pop_front().map(Ok)),
            GrpcBody::Stream(rx) => rx.poll_recv(cx).map(|f| f.map(Ok)),
            GrpcBody::Relay(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GrpcBody::Frames(q) => q.is_empty(),
            GrpcBody::Stream(_) => false,
            GrpcBody::Relay(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GrpcBody::Relay(b) => b.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

/// The client's deadline from `grpc-timeout` (one longer than a day is none: it can never
/// matter).
pub fn deadline(headers: &HeaderMap, arrived: Instant) -> Result<Option<Deadline>, ApiError> {
    Ok(timeout(headers)?
        .filter(|d| d.as_secs_f64() <= MAX_TIMEOUT_S)
        .map(|d| Deadline::after(arrived, d, "grpc-timeout")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_read_in_every_unit_and_malformed_ones_refused() {
        let t = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", HeaderValue::from_str(v).unwrap());
            timeout(&h)
        };
        assert_eq!(t("2S").unwrap(), Some(Duration::from_secs(2)));
        assert_eq!(t("1H").unwrap(), Some(Duration::from_secs(3600)));
        assert_eq!(t("3M").unwrap(), Some(Duration::from_secs(180)));
        assert_eq!(t("250m").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(
            t("99999999u").unwrap(),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(t("5n").unwrap(), Some(Duration::from_nanos(5)));
        for bad in ["", "S", "5", "5s", "123456789S", "-5S", "1.5S"] {
            assert!(t(bad).is_err(), "{bad:?}");
        }
        assert_eq!(timeout(&HeaderMap::new()).unwrap(), None);
        let back = |d: Duration| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", crate::siblings::link::timeout_value(d));
            timeout(&h).unwrap().unwrap()
        };
        assert_eq!(
            back(Duration::from_millis(1500)),
            Duration::from_millis(1500)
        );
        assert_eq!(
            back(Duration::from_secs(86_400)),
            Duration::from_secs(86_400)
        );
        assert_eq!(back(Duration::ZERO), Duration::from_micros(1));
    }

    #[test]
    fn content_types_and_encodings_are_checked_as_the_specification_asks() {
        let check = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_str(v).unwrap());
            }
            check_request(&h).map_err(|e| (e.status().as_u16(), e.grpc_code()))
        };
        use crate::error::GrpcCode as G;
        for ok in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC+Proto",
        ] {
            assert_eq!(check(&[("content-type", ok)]), Ok(()), "{ok}");
        }
        assert_eq!(
            check(&[
                ("content-type", "application/grpc"),
                ("grpc-encoding", "identity")
            ]),
            Ok(())
        );
        for sub in [
            "application/grpc+json",
            "application/grpc-web",
            "application/grpc+x",
        ] {
            assert_eq!(
                check(&[("content-type", sub)]),
                Err((501, G::Unimplemented)),
                "{sub}"
            );
        }
        assert_eq!(
            check(&[
                ("content-type", "application/grpc"),
                ("grpc-encoding", "gzip")
            ]),
            Err((501, G::Unimplemented))
        );
        assert_eq!(
            check(&[("content-type", "text/plain")]),
            Err((415, G::Internal))
        );
        assert_eq!(check(&[]), Err((415, G::Internal)));
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            message_value("input x: 50% é\n"),
            "input x: 50%25 %C3%A9%0A"
        );
    }

    #[test]
    fn a_frame_is_flag_length_and_message() {
        let m = crate::grpc::pb::ServerLiveResponse { live: true };
        assert_eq!(&frame(&m)[..], &[0, 0, 0, 0, 2, 8, 1]);
    }
}
