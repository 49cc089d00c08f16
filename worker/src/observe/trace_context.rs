//! W3C Trace Context (`traceparent`, <https://www.w3.org/TR/trace-context/>): the trace a
//! request belongs to, read from its `traceparent` header (HTTP) or metadata (gRPC), or a
//! new one when it has none (or one that is not valid: a request is never refused for it);
//! the worker's answer carries `traceparent` with the same trace id, this worker's own span
//! id and the caller's flags, and the access log writes the trace id — so that a request a
//! gateway traced can be found here. `tracestate` is passed on as it came. Without a trace
//! export (`crate::observe::spans`, off by default) the worker records nothing, so a trace it starts
//! is not sampled (flags `00`) and a caller's sampled flag is passed on; with one, the
//! sampler decides ([`TraceContext::sample`]) and the answer's flags say what it decided.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

/// The header, both ways.
pub static HEADER: HeaderName = HeaderName::from_static("traceparent");
/// The vendors' part of the context, passed on as it came.
pub static STATE: HeaderName = HeaderName::from_static("tracestate");

/// A request's place in its trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// 32 lower-case hex digits, not all zero.
    trace_id: String,
    /// This worker's span: 16 lower-case hex digits, not all zero.
    span_id: String,
    /// The caller's span (its `traceparent`'s parent id), when it sent one.
    parent_span_id: Option<String>,
    /// The caller's trace flags (bit 0: sampled), or the sampler's decision; `00` for a
    /// trace started here without an export.
    flags: u8,
    /// The caller's `tracestate`.
    state: Option<HeaderValue>,
}

impl TraceContext {
    /// The caller's trace when its `traceparent` is valid, else a new one.
    pub fn of(headers: &HeaderMap) -> TraceContext {
        let parsed = headers
            .get(&HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse);
        let state = parsed
            .as_ref()
            .and_then(|_| headers.get(&STATE))
            .filter(|v| v.len() <= 512)
            .cloned();
        let (trace_id, parent_span_id, flags) = match parsed {
            Some((t, p, f)) => (t, Some(p), f),
            None => (format!("{:016x}{:016x}", next(), next()), None, 0),
        };
        TraceContext {
            trace_id,
            span_id: format!("{:016x}", next()),
            parent_span_id,
            flags,
            state,
        }
    }

    /// With a trace export: the sampler decides whether this request's spans are recorded
    /// (parent-based by default: the caller's flag), and the answer's flags say so.
    pub fn sample(&mut self, sampler: &vramfork::otel::Sampler) {
        let parent = self.parent_span_id.as_ref().map(|_| self.flags & 1 == 1);
        let sampled = sampler.sampled(&self.trace_id, parent);
        self.flags = (self.flags & !1) | u8::from(sampled);
    }

    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// This worker's span (the request's SERVER span when it is exported).
    pub fn span_id(&self) -> &str {
        &self.span_id
    }

    pub fn parent_span_id(&self) -> Option<&str> {
        self.parent_span_id.as_deref()
    }

    /// Whether the trace is sampled (flags bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// `traceparent` for the answer: the trace, this worker's span, the flags.
    pub fn header(&self) -> HeaderValue {
        let v = format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, self.flags);
        HeaderValue::from_str(&v).expect("hex digits and dashes")
    }

    /// `tracestate` for the answer: the caller's, when it sent one with a valid
    /// `traceparent`.
    pub fn state(&self) -> Option<&HeaderValue> {
        self.state.as_ref()
    }
}

/// `version-traceid-parentid-flags` (version 00 exactly 55 characters; a later version at
/// least that, its fields the same, whatever follows a `-`): the trace id, the parent id
/// and the flags.
fn parse(v: &str) -> Option<(String, String, u8)> {
    let v = v.trim();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let version = v.get(0..2)?;
    if !hex(version, 2) || version == "ff" || (version == "00" && v.len() != 55) {
        return None;
    }
    if v.len() > 55 && v.as_bytes()[55] != b'-' {
        return None;
    }
    let mut fields = v.get(..55)?.split('-');
    let (_, trace, parent, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    if !hex(trace, 32) || zero(trace) || !hex(parent, 16) || zero(parent) || !hex(flags, 2) {
        return None;
    }
    Some((
        trace.to_string(),
        parent.to_string(),
        u8::from_str_radix(flags, 16).ok()?,
    ))
}

/// 64 bits for an id, never zero (an all-zero id is not valid).
fn next() -> u64 {
    crate::request_id::unique().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(&HEADER, HeaderValue::from_str(v).unwrap());
        h
    }

    const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_continued_with_a_span_of_this_worker() {
        let t = TraceContext::of(&with(CALLER));
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let h = t.header();
        let h = h.to_str().unwrap();
        assert!(h.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{h}");
        assert!(
            h.ends_with("-01"),
            "the caller's sampled flag passed on: {h}"
        );
        assert!(!h.contains("00f067aa0ba902b7"), "a span of its own: {h}");
        assert_eq!(
            parse(h).map(|(t, _, f)| (t, f)),
            Some((t.trace_id().to_string(), 1))
        );
        assert_eq!(t.parent_span_id(), Some("00f067aa0ba902b7"));
        // A later version's extra fields are ignored, its four read.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-follows";
        assert_eq!(
            TraceContext::of(&with(later)).trace_id(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }

    #[test]
    fn an_invalid_or_missing_traceparent_starts_a_new_unsampled_trace() {
        for bad in [
            "",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        let a = TraceContext::of(&HeaderMap::new());
        let b = TraceContext::of(&with("nonsense"));
        assert_ne!(a.trace_id(), b.trace_id());
        for t in [a, b] {
            let h = t.header();
            let (id, _, flags) = parse(h.to_str().unwrap()).expect("a valid header");
            assert_eq!((id.as_str(), flags), (t.trace_id(), 0));
        }
    }

    #[test]
    fn the_sampler_decides_and_the_answer_says_so() {
        use vramfork::otel::Sampler;
        let parent_based = Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
        let mut t = TraceContext::of(&with(CALLER));
        t.sample(&parent_based);
        assert!(t.sampled() && t.header().to_str().unwrap().ends_with("-01"));
        let mut t = TraceContext::of(&with(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        ));
        t.sample(&parent_based);
        assert!(!t.sampled(), "the caller's unsampled flag is honoured");
        let mut t = TraceContext::of(&HeaderMap::new());
        assert!(!t.sampled());
        t.sample(&parent_based);
        assert!(t.sampled() && t.header().to_str().unwrap().ends_with("-01"));
        let mut h = with(CALLER);
        h.insert(&STATE, HeaderValue::from_static("congo=t61rcWkgMzE"));
        assert_eq!(
            TraceContext::of(&h).state().map(|v| v.to_str().unwrap()),
            Some("congo=t61rcWkgMzE")
        );
    }
}
