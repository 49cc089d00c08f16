//! The OTLP endpoint's URL: parsed (with the `http` crate's URI parser, the one the server's
//! own HTTP stack trusts) into what the exporter writes on the wire — the `Host` header's
//! `host:port` and the request line's path — and refused whole when it could not be sent as
//! given. A URL is written into the export's request line and `Host` header verbatim, so
//! whitespace or a control character anywhere in it (a space, a CR or LF that would end
//! the request line and start a header of the URL's choosing) is refused rather than
//! escaped: percent-encode what a path needs. Refused as well: a host that is empty
//! (`http://:4318`), a bracket left open (`http://[::1`) or an IPv6 literal that is not
//! one, user information (`user@host`: never sent, and a credential would be logged), and a
//! port that is not one.

use std::net::Ipv6Addr;

/// An endpoint's parts.
#[derive(Debug, PartialEq)]
pub struct Url {
    pub https: bool,
    /// The host, without the brackets of an IPv6 address.
    pub host: String,
    /// What the `Host` header says: the authority as given, with the scheme's port when
    /// it names none.
    pub host_port: String,
    /// The path and query, as the request line carries them (at least `/`).
    pub path: String,
}

/// `http(s)://host[:port][/path][?query]`. The port defaults to 80 (http) or 443 (https).
/// The error says what is wrong, without the URL (the caller names the variable and it).
pub fn parse(url: &str) -> Result<Url, String> {
    if let Some((at, c)) = url
        .char_indices()
        .find(|(_, c)| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{} at byte {at}: a URL holds no whitespace or control character (percent-encode it: %20 for a space)",
            describe(c)
        ));
    }
    let https = if url.starts_with("http://") {
        false
    } else if url.starts_with("https://") {
        true
    } else {
        return Err(
            "expected an http:// or https:// URL such as http://otel-collector:4318".into(),
        );
    };
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let authority = uri
        .authority()
        .map(|a| a.as_str())
        .filter(|a| !a.is_empty())
        .ok_or("expected a host (and port) after the scheme")?;
    if authority.contains('@') {
        return Err("user information (user@host) is not sent: give the host alone, and credentials in OTEL_EXPORTER_OTLP_HEADERS".into());
    }
    let (host, port) = host_and_port(authority)?;
    let host_port = match port {
        Some(p) if p.parse::<u16>().is_ok_and(|p| p > 0) => authority.to_string(),
        Some(p) => return Err(format!("'{p}' is not a port")),
        None => format!("{authority}:{}", if https { 443 } else { 80 }),
    };
    let path = match uri.path_and_query().map(|p| p.as_str()) {
        Some(p) if p.starts_with('/') => p.to_string(),
        Some(p) => format!("/{p}"),
        None => "/".to_string(),
    };
    Ok(Url {
        https,
        host: host.to_string(),
        host_port,
        path,
    })
}

/// The host (without an IPv6 literal's brackets) and the port as written, if any.
fn host_and_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (inner, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address's '[' is never closed")?;
        if inner.parse::<Ipv6Addr>().is_err() {
            return Err(format!("'[{inner}]' is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("'{p}' after the IPv6 address is not ':PORT'"))?,
            ),
        };
        (inner, port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("expected a host (and port) after the scheme: the host is empty".into());
    }
    if host.contains(['[', ']']) {
        return Err(format!("'{host}': a '[' or ']' outside an IPv6 address"));
    }
    Ok((host, port))
}

/// A character as a message names it (never the character itself, which may be a line
/// break).
fn describe(c: char) -> String {
    match c {
        ' ' => "a space".into(),
        '\t' => "a tab".into(),
        '\r' => "a carriage return (CR)".into(),
        '\n' => "a line feed (LF)".into(),
        '\0' => "a NUL".into(),
        c => format!("the character U+{:04X}", c as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_gives_the_host_header_and_the_request_line_s_path() {
        let u = parse("http://collector:4318/v1/traces?x=1").unwrap();
        assert_eq!(
            u,
            Url {
                https: false,
                host: "collector".into(),
                host_port: "collector:4318".into(),
                path: "/v1/traces?x=1".into()
            }
        );
        let u = parse("https://[::1]:4318/v1/traces").unwrap();
        assert_eq!(
            (u.https, u.host.as_str(), u.host_port.as_str()),
            (true, "::1", "[::1]:4318")
        );
        let u = parse("https://collector.example").unwrap();
        assert_eq!(
            (u.host_port.as_str(), u.path.as_str()),
            ("collector.example:443", "/")
        );
        let u = parse("http://[::1]/p%20q").unwrap();
        assert_eq!(
            (u.host_port.as_str(), u.path.as_str()),
            ("[::1]:80", "/p%20q")
        );
    }

    #[test]
    fn what_could_not_be_sent_as_given_is_refused() {
        for (url, want) in [
            ("http://:4318/v1/traces", "the host is empty"),
            ("http://", "not a URL"),
            ("http://[::1", "not a URL"),
            ("https://[::1", "not a URL"),
            ("http://[::1/v1/traces", "not a URL"),
            ("http://[nope]:4318", "'[nope]' is not an IPv6 address"),
            ("http://[::1]x:4318", "after the IPv6 address"),
            ("http://c:port", "'port' is not a port"),
            ("http://c:99999", "is not a port"),
            ("http://c:0", "'0' is not a port"),
            ("http://c:/x", "'' is not a port"),
            ("http://u:p@c:4318", "user information"),
            ("http://c:4318/a b", "a space at byte 15"),
            (
                "http://c:4318/x\r\nX-Evil: 1",
                "a carriage return (CR) at byte 15",
            ),
            ("http://c:4318/x\n", "a line feed (LF)"),
            ("http://c\t:4318", "a tab"),
            ("http://c:4318/\u{0}", "a NUL"),
            ("http://c:4318/\u{85}", "U+0085"),
            ("ftp://c", "expected an http:// or https:// URL"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(want), "{url:?}: {e}");
        }
    }
}
