//! The `key=value,…` lists of `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS` and
//! `OTEL_RESOURCE_ATTRIBUTES` (the specification's W3C Baggage-like form, values
//! percent-decoded), and what makes a pair a header the exporter may send.
//!
//! The headers are written into every export's request as given, so a header that would
//! not be one header of the collector's choosing is refused: a name that is not an RFC 9110
//! token (`bad key`, `k:x` would be sent as other headers or a broken line), a value holding
//! a line break, a NUL or another control character once decoded (`a%0D%0AX-Injected:%20yes`
//! would add a header of its own), and the headers the exporter writes itself (`Host`,
//! `Content-Length`, `Content-Type`, `Transfer-Encoding`, `Connection`: a second one would
//! change how the collector frames or routes the request). The messages name the header,
//! never its value: the headers usually carry a credential.

/// The headers the exporter writes itself, which the variable may not give again.
pub const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
];

/// `k=v,k2=v2` with percent-encoded values.
pub fn pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .enumerate()
        .map(|(n, p)| {
            // Not quoted: an entry without its '=' may be a credential written whole.
            let (k, v) = p.split_once('=').ok_or_else(|| {
                format!(
                    "entry {} is not key=value (not shown: it may be a credential)",
                    n + 1
                )
            })?;
            let k = k.trim();
            if k.is_empty() {
                return Err(format!("entry {} has no key", n + 1));
            }
            let v = percent_decode(v.trim()).map_err(|e| format!("'{k}': {e}"))?;
            Ok((k.to_string(), v))
        })
        .collect()
}

/// The headers `s` gives, each one a header the exporter can send as it is.
pub fn headers(s: &str) -> Result<Vec<(String, String)>, String> {
    let headers = pairs(s)?;
    for (k, v) in &headers {
        if let Some(c) = k.chars().find(|&c| !is_token_char(c)) {
            return Err(format!(
                "'{}' is not a header name: {} is not allowed in one (RFC 9110 token: letters, digits and !#$%&'*+-.^_`|~)",
                k.escape_debug(),
                named(c)
            ));
        }
        if RESERVED.iter().any(|r| k.eq_ignore_ascii_case(r)) {
            return Err(format!(
                "'{k}' is written by the exporter itself and cannot be given (none of {} can)",
                RESERVED.join(", ")
            ));
        }
        if let Some(c) = v.chars().find(|&c| c.is_control() && c != '\t') {
            return Err(format!(
                "the value of '{k}' holds {} once percent-decoded: a header value holds no line break, NUL or other control character",
                named(c)
            ));
        }
    }
    Ok(headers)
}

/// RFC 9110's `tchar`.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// A character as a message names it (a line break is not written into the message).
fn named(c: char) -> String {
    match c {
        ' ' => "a space".into(),
        '\r' => "a carriage return (CR)".into(),
        '\n' => "a line feed (LF)".into(),
        '\0' => "a NUL".into(),
        c if c.is_control() || c.is_whitespace() => format!("U+{:04X}", c as u32),
        c => format!("'{c}'"),
    }
}

/// The value with its `%XX` escapes decoded; the error does not quote it.
fn percent_decode(v: &str) -> Result<String, String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = v
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("its value has a bad percent escape at byte {i}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "its value is not UTF-8 once decoded".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_split_trimmed_and_decoded() {
        assert_eq!(
            headers("authorization=Bearer%20abc, x-tenant=t1,,").unwrap(),
            vec![
                ("authorization".to_string(), "Bearer abc".to_string()),
                ("x-tenant".to_string(), "t1".to_string())
            ]
        );
        assert_eq!(
            headers("x-tab=a%09b").unwrap()[0].1,
            "a\tb",
            "a tab is a value's"
        );
        assert_eq!(pairs("k=").unwrap(), vec![("k".into(), String::new())]);
    }

    #[test]
    fn a_header_that_would_not_be_sent_as_one_is_refused_by_name_never_by_value() {
        for (h, want) in [
            ("novalue", "entry 1 is not key=value (not shown"),
            ("=v", "entry 1 has no key"),
            ("a=%zz", "'a': its value has a bad percent escape at byte 0"),
            ("a=%ff", "'a': its value is not UTF-8"),
            ("bad key=v", "'bad key' is not a header name: a space"),
            ("k:x=v", "'k:x' is not a header name: ':'"),
            ("k\u{0}=v", "is not a header name: a NUL"),
            (
                "Content-Length=0",
                "'Content-Length' is written by the exporter itself",
            ),
            ("HOST=evil", "'HOST' is written by the exporter itself"),
            (
                "content-type=text/plain",
                "is written by the exporter itself",
            ),
            (
                "Transfer-Encoding=chunked",
                "is written by the exporter itself",
            ),
            ("connection=close", "is written by the exporter itself"),
            (
                "x-tenant=a%0D%0AX-Injected:%20yes",
                "the value of 'x-tenant' holds a carriage return (CR) once percent-decoded",
            ),
            ("x=a%0Ab", "holds a line feed (LF)"),
            ("x=a%00b", "holds a NUL"),
            ("x=a%7Fb", "holds U+007F"),
        ] {
            let e = headers(h).unwrap_err();
            assert!(e.contains(want), "{h:?}: {e}");
            assert!(!e.contains("Injected") && !e.contains('\n'), "{h:?}: {e}");
        }
    }
}
