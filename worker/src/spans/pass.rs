//! A batched forward pass as one span (issue 58): the model thread makes a [`PassSpan`]
//! for each pass of several requests and hands it to every member with its outputs; each
//! sampled member, once answered and recorded, adds a link to its SERVER span
//! ([`PassSpan::link`]); when the last member lets go of it, the pass's `forward` span is
//! queued for export with those links (none sampled: nothing). Its trace is a new one of its
//! own (a root span): the OpenTelemetry specification's model of a batch, a span "initiated
//! by multiple initiating spans" that links to each of them
//! (<https://github.com/open-telemetry/opentelemetry-specification/blob/main/specification/overview.md#links-between-spans>),
//! so that no member's trace is credited with the others' work.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::export::Exporter;
use super::otlp::{self, kv, Value};

/// One batched pass: its ids, its time, and the links its members add.
pub struct PassSpan {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    start: SystemTime,
    took: Duration,
    requests: u32,
    rows: u32,
    sink: Mutex<Sink>,
}

#[derive(Default)]
struct Sink {
    links: Vec<otlp::Link>,
    /// Where the span goes: set by the first member that links to it.
    exporter: Option<Arc<Exporter>>,
}

impl PassSpan {
    /// A pass of `requests` requests and `rows` rows that started at `start` and took `took`.
    pub fn new(start: SystemTime, took: Duration, requests: u32, rows: u32) -> Arc<PassSpan> {
        let id = || crate::request_id::unique().max(1).to_be_bytes();
        let mut trace_id = [0u8; 16];
        trace_id[..8].copy_from_slice(&id());
        trace_id[8..].copy_from_slice(&id());
        Arc::new(PassSpan {
            trace_id,
            span_id: id(),
            start,
            took,
            requests,
            rows,
            sink: Mutex::new(Sink::default()),
        })
    }

    /// Its trace id, as 32 hex digits.
    pub fn trace_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// Its span id, as 16 hex digits.
    pub fn span_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// A member's SERVER span (`trace_id`, `span_id` as bytes), to link to.
    pub(super) fn link(
        &self,
        trace_id: Vec<u8>,
        span_id: Vec<u8>,
        request_id: &str,
        exporter: &Arc<Exporter>,
    ) {
        let mut s = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        s.links.push(otlp::Link {
            trace_id,
            span_id,
            attributes: vec![kv("vramfork.request_id", Value::String(request_id.into()))],
        });
        s.exporter.get_or_insert_with(|| exporter.clone());
    }
}

impl Drop for PassSpan {
    /// Its last member is done with it: its span goes to the exporter, if any member linked.
    fn drop(&mut self) {
        let s = std::mem::take(self.sink.get_mut().unwrap_or_else(|p| p.into_inner()));
        let Some(exporter) = s.exporter else {
            return;
        };
        let nanos = |t: SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        };
        exporter.push(vec![otlp::Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id.to_vec(),
            trace_state: String::new(),
            parent_span_id: Vec::new(),
            name: "forward".into(),
            kind: otlp::KIND_INTERNAL,
            start_time_unix_nano: nanos(self.start),
            end_time_unix_nano: nanos(self.start + self.took),
            attributes: vec![
                kv("vramfork.batch.size", Value::Int(self.requests.into())),
                kv("vramfork.batch.rows", Value::Int(self.rows.into())),
                kv("vramfork.inline", Value::Bool(false)),
            ],
            links: s.links,
            status: None,
            flags: 1,
        }]);
    }
}

impl std::fmt::Debug for PassSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassSpan")
            .field("span_id", &self.span_hex())
            .field("requests", &self.requests)
            .finish()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hex_of_the_right_length_and_not_zero() {
        let p = PassSpan::new(SystemTime::now(), Duration::from_millis(1), 4, 4);
        let (t, s) = (p.trace_hex(), p.span_hex());
        assert_eq!((t.len(), s.len()), (32, 16));
        assert!(t.bytes().any(|b| b != b'0') && s.bytes().any(|b| b != b'0'));
        assert_ne!(
            t,
            PassSpan::new(SystemTime::now(), Duration::ZERO, 2, 2).trace_hex()
        );
    }
}
