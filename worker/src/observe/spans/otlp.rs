//! OTLP's trace messages written straight into protobuf bytes, as the wire needs them (field
//! numbers from opentelemetry-proto's `opentelemetry/proto/trace/v1/trace.proto`,
//! `collector/trace/v1/trace_service.proto`, `common/v1/common.proto` and
//! `resource/v1/resource.proto`): only the fields vramfork writes. No message is built
//! first: a request's four or five spans, written from its record, cost no allocation
//! (building prost messages took about 4 µs a request, and encoding them 3 µs more, on the
//! exporter thread that shares the workers' cores).
//!
//! A span is written as one `ScopeSpans.spans` entry ([`span`]); an export request wraps
//! those entries with this worker's resource and scope, written once ([`request`]). The
//! tests decode what is written with prost messages of the same definitions.

/// Wire types (protobuf encoding: "Message Structure").
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

pub const KIND_INTERNAL: i32 = 1;
pub const KIND_SERVER: i32 = 2;
const STATUS_ERROR: u64 = 2;

/// `ScopeSpans.spans`.
const SCOPE_SPANS_SPANS: u32 = 2;
/// `Span.attributes`, `Resource.attributes`, `Link.attributes`.
pub const SPAN_ATTRIBUTES: u32 = 9;
const RESOURCE_ATTRIBUTES: u32 = 1;
const LINK_ATTRIBUTES: u32 = 4;
/// `Span.links`.
pub const SPAN_LINKS: u32 = 13;

/// `v` as a varint: its bytes, and how many of them.
fn varint_array(mut v: u64) -> ([u8; 10], usize) {
    let (mut out, mut n) = ([0u8; 10], 0);
    while v >= 0x80 {
        out[n] = v as u8 | 0x80;
        n += 1;
        v >>= 7;
    }
    out[n] = v as u8;
    (out, n + 1)
}

fn varint(buf: &mut Vec<u8>, v: u64) {
    let (bytes, n) = varint_array(v);
    buf.extend_from_slice(&bytes[..n]);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn key(buf: &mut Vec<u8>, field: u32, wire: u8) {
    varint(buf, (u64::from(field) << 3) | u64::from(wire));
}

/// A `bytes` or `string` field of `parts` one after another (nothing when empty: proto3's
/// default).
fn bytes(buf: &mut Vec<u8>, field: u32, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len == 0 {
        return;
    }
    key(buf, field, LEN);
    varint(buf, len as u64);
    for p in parts {
        buf.extend_from_slice(p);
    }
}

fn fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
    key(buf, field, I64);
    buf.extend_from_slice(&v.to_le_bytes());
}

fn fixed32(buf: &mut Vec<u8>, field: u32, v: u32) {
    key(buf, field, I32);
    buf.extend_from_slice(&v.to_le_bytes());
}

/// An embedded message at `field`, written by `write` (its length, unknown until written,
/// is put before it afterwards).
fn message(buf: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    key(buf, field, LEN);
    let at = buf.len();
    buf.push(0);
    write(buf);
    let len = buf.len() - at - 1;
    if len < 0x80 {
        buf[at] = len as u8;
        return;
    }
    let (head, n) = varint_array(len as u64);
    buf[at] = head[0];
    buf.splice(at + 1..at + 1, head[1..n].iter().copied());
}

/// An embedded message at `field` whose body `content` is written already (written even
/// when empty: a message present, as prost writes one).
fn embedded(buf: &mut Vec<u8>, field: u32, content: &[u8]) {
    key(buf, field, LEN);
    varint(buf, content.len() as u64);
    buf.extend_from_slice(content);
}

/// An attribute's value (`AnyValue`).
#[derive(Clone, Copy)]
pub enum Value<'a> {
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
}

/// An attribute (`KeyValue`) at `field` ([`SPAN_ATTRIBUTES`] in a span).
pub fn attribute(buf: &mut Vec<u8>, field: u32, name: &str, value: Value<'_>) {
    // AnyValue: string_value 1, bool_value 2, int_value 3, double_value 4.
    let any_len = match value {
        Value::Str(s) => 1 + varint_len(s.len() as u64) + s.len(),
        Value::Bool(_) => 2,
        Value::Int(i) => 1 + varint_len(i as u64),
        Value::Double(_) => 9,
    };
    let kv_len =
        1 + varint_len(name.len() as u64) + name.len() + 1 + varint_len(any_len as u64) + any_len;
    key(buf, field, LEN);
    varint(buf, kv_len as u64);
    key(buf, 1, LEN);
    varint(buf, name.len() as u64);
    buf.extend_from_slice(name.as_bytes());
    key(buf, 2, LEN);
    varint(buf, any_len as u64);
    match value {
        Value::Str(s) => {
            key(buf, 1, LEN);
            varint(buf, s.len() as u64);
            buf.extend_from_slice(s.as_bytes());
        }
        Value::Bool(b) => {
            key(buf, 2, VARINT);
            buf.push(u8::from(b));
        }
        Value::Int(i) => {
            key(buf, 3, VARINT);
            varint(buf, i as u64);
        }
        Value::Double(f) => {
            key(buf, 4, I64);
            buf.extend_from_slice(&f.to_le_bytes());
        }
    }
}

/// What every span has.
pub struct Span<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    /// Empty for a root.
    pub parent: &'a [u8],
    /// Written one part after another (`POST` ` ` `/`: no name is formatted first).
    pub name: &'a [&'a str],
    pub kind: i32,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// The ERROR status.
    pub error: bool,
}

/// A span's fields as `Span`'s message body, `more` writing its attributes and links
/// ([`attribute`] at [`SPAN_ATTRIBUTES`], [`link`]).
pub fn span_body(buf: &mut Vec<u8>, s: &Span<'_>, more: impl FnOnce(&mut Vec<u8>)) {
    bytes(buf, 1, &[s.trace_id]);
    bytes(buf, 2, &[s.span_id]);
    bytes(buf, 4, &[s.parent]);
    let len: usize = s.name.iter().map(|p| p.len()).sum();
    if len > 0 {
        key(buf, 5, LEN);
        varint(buf, len as u64);
        for p in s.name {
            buf.extend_from_slice(p.as_bytes());
        }
    }
    key(buf, 6, VARINT);
    varint(buf, s.kind as u64);
    fixed64(buf, 7, s.start_unix_nano);
    fixed64(buf, 8, s.end_unix_nano);
    more(buf);
    if s.error {
        // Status: code 3.
        message(buf, 15, |b| {
            key(b, 3, VARINT);
            varint(b, STATUS_ERROR);
        });
    }
    // W3C trace flags: sampled.
    fixed32(buf, 16, 1);
}

/// A span as one `ScopeSpans.spans` entry of an export ([`request`]).
pub fn span(buf: &mut Vec<u8>, s: &Span<'_>, more: impl FnOnce(&mut Vec<u8>)) {
    message(buf, SCOPE_SPANS_SPANS, |b| span_body(b, s, more));
}

/// A span's message body written before ([`span_body`]), as one `ScopeSpans.spans` entry.
pub fn span_written(buf: &mut Vec<u8>, body: &[u8]) {
    embedded(buf, SCOPE_SPANS_SPANS, body);
}

/// A link (`Span.links`) to span `span_id` of `trace_id`, with one string attribute.
pub fn link(buf: &mut Vec<u8>, trace_id: &[u8], span_id: &[u8], name: &str, value: &str) {
    message(buf, SPAN_LINKS, |b| {
        bytes(b, 1, &[trace_id]);
        bytes(b, 2, &[span_id]);
        attribute(b, LINK_ATTRIBUTES, name, Value::Str(value));
    });
}

/// A `Resource`'s and an `InstrumentationScope`'s message bodies: what every export of this
/// worker repeats, written once.
pub struct Head {
    resource: Vec<u8>,
    scope: Vec<u8>,
}

impl Head {
    /// The resource of `attributes`; the scope `name` at `version`.
    pub fn new(attributes: &[(&str, Value<'_>)], name: &str, version: &str) -> Head {
        let mut resource = Vec::new();
        for (k, v) in attributes {
            attribute(&mut resource, RESOURCE_ATTRIBUTES, k, *v);
        }
        let mut scope = Vec::new();
        bytes(&mut scope, 1, &[name.as_bytes()]);
        bytes(&mut scope, 2, &[version.as_bytes()]);
        Head { resource, scope }
    }
}

/// An `ExportTraceServiceRequest` of the `ScopeSpans.spans` entries `spans` ([`span`]),
/// written into `out` (cleared first).
pub fn request(out: &mut Vec<u8>, head: &Head, spans: &[u8]) {
    out.clear();
    let field = |len: usize| 1 + varint_len(len as u64) + len;
    let scope_spans = field(head.scope.len()) + spans.len();
    let resource_spans = field(head.resource.len()) + field(scope_spans);
    out.reserve(field(resource_spans));
    // ExportTraceServiceRequest.resource_spans 1 { resource 1, scope_spans 2 { scope 1, spans } }
    key(out, 1, LEN);
    varint(out, resource_spans as u64);
    embedded(out, 1, &head.resource);
    key(out, 2, LEN);
    varint(out, scope_spans as u64);
    embedded(out, 1, &head.scope);
    out.extend_from_slice(spans);
}

/// `t` in nanoseconds since the Unix epoch (0 before it), as spans give their times.
pub fn unix_nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// 16 or 32 hex digits as `N` bytes (zeros when not hex of that length).
pub fn hex_bytes<const N: usize>(hex: &str) -> [u8; N] {
    let mut out = [0u8; N];
    if hex.len() != 2 * N {
        return out;
    }
    for (i, o) in out.iter_mut().enumerate() {
        match hex.get(2 * i..2 * i + 2).map(|d| u8::from_str_radix(d, 16)) {
            Some(Ok(b)) => *o = b,
            _ => return [0u8; N],
        }
    }
    out
}

/// `bytes` as lower-case hex digits in `into` (twice as long).
pub fn hex_str<'a>(bytes: &[u8], into: &'a mut [u8]) -> &'a str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        into[2 * i] = DIGITS[usize::from(b >> 4)];
        into[2 * i + 1] = DIGITS[usize::from(b & 15)];
    }
    std::str::from_utf8(&into[..2 * bytes.len()]).unwrap_or("")
}

#[cfg(test)]
pub mod decoded;

#[cfg(test)]
mod tests {
    use super::decoded::{AnyValueKind, ExportTraceServiceRequest};
    use super::*;
    use prost::Message;

    #[test]
    fn varints_have_the_length_protobuf_gives_them() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
            assert_eq!(b.len(), prost::encoding::encoded_len_varint(v), "{v}");
        }
    }

    #[test]
    fn what_is_written_decodes_as_the_messages_say() {
        let head = Head::new(
            &[
                ("service.name", Value::Str("svc")),
                ("process.pid", Value::Int(42)),
            ],
            "vramfork",
            "1.2.3",
        );
        let mut spans = Vec::new();
        let long = "x".repeat(300);
        span(
            &mut spans,
            &Span {
                trace_id: &[7; 16],
                span_id: &[8; 8],
                parent: &[9; 8],
                name: &["POST", " ", "/"],
                kind: KIND_SERVER,
                start_unix_nano: 1,
                end_unix_nano: u64::MAX,
                error: true,
            },
            |b| {
                attribute(b, SPAN_ATTRIBUTES, "a", Value::Str(&long));
                attribute(b, SPAN_ATTRIBUTES, "b", Value::Int(-3));
                attribute(b, SPAN_ATTRIBUTES, "c", Value::Bool(true));
                link(b, &[1; 16], &[2; 8], "vramfork.request_id", "r-1");
            },
        );
        let mut body = Vec::new();
        let mut s = Span {
            trace_id: &[3; 16],
            span_id: &[4; 8],
            parent: &[],
            name: &["forward"],
            kind: KIND_INTERNAL,
            start_unix_nano: 5,
            end_unix_nano: 6,
            error: false,
        };
        span_body(&mut body, &s, |_| {});
        span_written(&mut spans, &body);
        s.name = &[];
        span(&mut spans, &s, |_| {});
        let mut out = vec![1, 2, 3];
        request(&mut out, &head, &spans);
        let r = ExportTraceServiceRequest::decode(out.as_slice()).unwrap();
        assert_eq!(r.resource_spans.len(), 1);
        let rs = &r.resource_spans[0];
        let res = rs.resource.as_ref().unwrap();
        assert_eq!(res.attributes.len(), 2);
        assert_eq!(res.attributes[1].key, "process.pid");
        assert_eq!(
            res.attributes[1].value.as_ref().unwrap().value,
            Some(AnyValueKind::Int(42))
        );
        let ss = &rs.scope_spans[0];
        assert_eq!(ss.scope.as_ref().unwrap().version, "1.2.3");
        assert_eq!(ss.spans.len(), 3);
        let server = &ss.spans[0];
        assert_eq!(
            (server.trace_id.as_slice(), server.span_id.as_slice()),
            (&[7u8; 16][..], &[8u8; 8][..])
        );
        assert_eq!(server.parent_span_id, vec![9; 8]);
        assert_eq!((server.name.as_str(), server.kind), ("POST /", 2));
        assert_eq!(
            (server.start_time_unix_nano, server.end_time_unix_nano),
            (1, u64::MAX)
        );
        assert_eq!(server.status.as_ref().map(|s| s.code), Some(2));
        assert_eq!(server.flags, 1);
        let values: Vec<_> = server
            .attributes
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.clone().unwrap().value.unwrap()))
            .collect();
        assert_eq!(
            values,
            vec![
                ("a", AnyValueKind::String(long.clone())),
                ("b", AnyValueKind::Int(-3)),
                ("c", AnyValueKind::Bool(true)),
            ]
        );
        assert_eq!(server.links.len(), 1);
        assert_eq!(server.links[0].trace_id, vec![1; 16]);
        assert_eq!(server.links[0].attributes[0].key, "vramfork.request_id");
        let forward = &ss.spans[1];
        assert_eq!((forward.name.as_str(), forward.kind), ("forward", 1));
        assert!(forward.parent_span_id.is_empty() && forward.status.is_none());
        assert_eq!(ss.spans[2].name, "");
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let b: [u8; 8] = hex_bytes("00f067aa0ba902b7");
        assert_eq!(b, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        let mut s = [0u8; 16];
        assert_eq!(hex_str(&b, &mut s), "00f067aa0ba902b7");
        assert_eq!(hex_bytes::<8>("00f067aa0ba902bz"), [0; 8]);
        assert_eq!(hex_bytes::<8>("00f0"), [0; 8]);
    }
}
