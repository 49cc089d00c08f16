//! The collector's answer to an export, read whole off its connection (HTTP/1.1): the
//! status line, the headers, and the body by `Content-Length` or chunked, so that the
//! connection can carry the next export. When the answer's end cannot be known (no length,
//! a body larger than [`MAX_BODY`], a malformed length) or the collector said
//! `Connection: close` (or answered HTTP/1.0 without `keep-alive`), the answer is still
//! taken by its status line but the connection is not reused.
//!
//! What a collector can make the exporter read is bounded: a few interim (1xx) answers at
//! most ([`MAX_INTERIM`]), a head of [`MAX_HEAD`] bytes with a chunked body's trailers
//! counted in it, a body of [`MAX_BODY`]; past the first two the answer is a failure (the
//! connection is dropped). How long the reading may take is bounded by the stream: the
//! export's deadline (`super::connection`).

use std::io::{self, Read};

/// The most bytes of a status line and headers (an answer's head), and of a chunked body's
/// trailers counted with them, read.
const MAX_HEAD: usize = 64 << 10;
/// The most interim (1xx) answers taken before the real one: `100 Continue` once, a
/// `103 Early Hints` or two; a collector sending them without end is not answering.
const MAX_INTERIM: usize = 4;
/// The most bytes of a body read to keep the connection (an OTLP answer's body is a small
/// protobuf message, usually empty); a larger one closes it.
const MAX_BODY: u64 = 1 << 20;

/// An answer: its status, its status line (for messages), and whether the connection can
/// carry the next request.
#[derive(Debug, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub line: String,
    pub reusable: bool,
}

/// Why no answer was read.
#[derive(Debug, PartialEq)]
pub enum NoAnswer {
    /// The connection was closed (or reset) before the first byte of an answer: on a reused
    /// connection, the collector closed it while it was idle.
    Closed(String),
    /// Anything else: a timeout, a malformed answer.
    Failed(String),
}

/// Reads one answer from `s`.
pub fn read(s: &mut impl Read) -> Result<Answer, NoAnswer> {
    let mut r = Bytes {
        s,
        buf: Vec::new(),
        at: 0,
        seen: false,
        head_size: 0,
        unbounded: false,
    };
    // 1xx answers (100 Continue) come before the real one.
    let mut interim = 0;
    let (line, head) = loop {
        let (line, head) = r.head()?;
        let status = status_of(&line)?;
        if !(100..200).contains(&status) || status == 101 {
            break (line, head);
        }
        interim += 1;
        if interim > MAX_INTERIM {
            return Err(NoAnswer::Failed(format!(
                "more than {MAX_INTERIM} interim (1xx) answers before the answer"
            )));
        }
    };
    let status = status_of(&line)?;
    let framed = match r.body(status, &head) {
        Ok(framed) => framed,
        // Trailers without end: no answer, whatever its status line said.
        Err(e) if r.unbounded => return Err(e),
        // A body cut short (closed, out of time): the status stands, the connection goes.
        Err(_) => false,
    };
    let keep = if line.starts_with("HTTP/1.1") {
        !has_token(&head, "connection", "close")
    } else {
        has_token(&head, "connection", "keep-alive")
    };
    // Bytes after the answer: the collector said more than it was asked; do not reuse.
    let reusable = framed && keep && r.at == r.buf.len();
    Ok(Answer {
        status,
        line,
        reusable,
    })
}

fn status_of(line: &str) -> Result<u16, NoAnswer> {
    let mut parts = line.split(' ');
    let version = parts.next().unwrap_or("");
    match parts.next().map(str::parse::<u16>) {
        Some(Ok(s)) if version.starts_with("HTTP/1.") && (100..600).contains(&s) => Ok(s),
        _ => Err(NoAnswer::Failed(format!(
            "not an HTTP/1.1 answer: {line:?}"
        ))),
    }
}

/// Whether header `name` lists `token` (case-insensitive, comma-separated).
fn has_token(head: &[(String, String)], name: &str, token: &str) -> bool {
    head.iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .flat_map(|(_, v)| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// A connection's bytes, read as needed.
struct Bytes<'a, R> {
    s: &'a mut R,
    buf: Vec<u8>,
    at: usize,
    /// Whether any byte was read (an end before one is [`NoAnswer::Closed`]).
    seen: bool,
    /// The bytes of the last head's lines, to which a chunked body's trailers add.
    head_size: usize,
    /// Whether the head (or the trailers) went past [`MAX_HEAD`].
    unbounded: bool,
}

impl<R: Read> Bytes<'_, R> {
    /// Reads more; an end of the stream is an error.
    fn more(&mut self) -> Result<(), NoAnswer> {
        let mut chunk = [0u8; 8192];
        let n = match self.s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if !self.seen && closed(&e) => return Err(NoAnswer::Closed(e.to_string())),
            Err(e) => return Err(NoAnswer::Failed(e.to_string())),
        };
        if n == 0 {
            let why = "the connection was closed".to_string();
            return Err(if self.seen {
                NoAnswer::Failed(format!("{why} in the middle of the answer"))
            } else {
                NoAnswer::Closed(format!("{why} without an answer"))
            });
        }
        self.seen = true;
        self.buf.drain(..self.at);
        self.at = 0;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// One line, without its CRLF (or LF).
    fn line(&mut self, max: usize) -> Result<String, NoAnswer> {
        loop {
            if let Some(i) = self.buf[self.at..].iter().position(|&b| b == b'\n') {
                let raw = &self.buf[self.at..self.at + i];
                let line = String::from_utf8_lossy(raw.strip_suffix(b"\r").unwrap_or(raw));
                let line = line.into_owned();
                self.at += i + 1;
                return Ok(line);
            }
            if self.buf.len() - self.at > max {
                return Err(NoAnswer::Failed(format!("a line over {max} bytes")));
            }
            self.more()?;
        }
    }

    /// The status line and the headers.
    fn head(&mut self) -> Result<(String, Vec<(String, String)>), NoAnswer> {
        let line = self.line(MAX_HEAD)?;
        let mut head = Vec::new();
        self.head_size = line.len();
        while let Some(h) = self.field("headers")? {
            if let Some((k, v)) = h.split_once(':') {
                head.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        Ok((line, head))
    }

    /// The next header (or trailer) line; `None` at the empty line that ends them. Each
    /// counts against [`MAX_HEAD`] with the head's other lines.
    fn field(&mut self, what: &str) -> Result<Option<String>, NoAnswer> {
        let h = self.line(MAX_HEAD).inspect_err(|e| {
            self.unbounded = matches!(e, NoAnswer::Failed(why) if why.starts_with("a line over"));
        })?;
        if h.is_empty() {
            return Ok(None);
        }
        self.head_size += h.len();
        if self.head_size > MAX_HEAD {
            self.unbounded = true;
            return Err(NoAnswer::Failed(format!(
                "{what} over {MAX_HEAD} bytes (with the head)"
            )));
        }
        Ok(Some(h))
    }

    /// Skips `n` bytes.
    fn skip(&mut self, mut n: u64) -> Result<(), NoAnswer> {
        loop {
            let here = ((self.buf.len() - self.at) as u64).min(n);
            self.at += here as usize;
            n -= here;
            if n == 0 {
                return Ok(());
            }
            self.more()?;
        }
    }

    /// Reads the body; `Ok(true)` when its end is known and reached (the connection can
    /// carry another request), `Ok(false)` when it cannot be known or is too large.
    fn body(&mut self, status: u16, head: &[(String, String)]) -> Result<bool, NoAnswer> {
        if status == 204 || status == 304 || status == 101 {
            return Ok(status != 101);
        }
        if head
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding"))
        {
            // Chunked must be the last coding for the length to be known.
            let last_chunked = head
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding"))
                .flat_map(|(_, v)| v.split(','))
                .last()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("chunked"));
            return if last_chunked {
                self.chunks()
            } else {
                Ok(false)
            };
        }
        let lengths: Vec<&str> = head
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.as_str())
            .collect();
        let Some(first) = lengths.first() else {
            return Ok(false); // a body until the collector closes
        };
        match first.parse::<u64>() {
            Ok(n) if n <= MAX_BODY && lengths.iter().all(|l| l == first) => {
                self.skip(n).map(|()| true)
            }
            _ => Ok(false),
        }
    }

    /// A chunked body, its trailers included.
    fn chunks(&mut self) -> Result<bool, NoAnswer> {
        let mut total = 0u64;
        loop {
            let line = self.line(1024)?;
            let size = line.split(';').next().unwrap_or("").trim();
            let Ok(n) = u64::from_str_radix(size, 16) else {
                return Ok(false);
            };
            total = total.saturating_add(n);
            if total > MAX_BODY {
                return Ok(false);
            }
            if n == 0 {
                while self.field("trailers")?.is_some() {}
                return Ok(true);
            }
            self.skip(n)?;
            if !self.line(2)?.is_empty() {
                return Ok(false);
            }
        }
    }
}

/// An error that means the peer closed the connection.
pub fn closed(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(bytes: &[u8]) -> Result<Answer, NoAnswer> {
        read(&mut &bytes[..])
    }

    #[test]
    fn a_framed_answer_keeps_the_connection() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
        ] {
            let a = answer(raw).unwrap();
            assert!(a.reusable && (a.status == 200 || a.status == 204), "{a:?}");
        }
        let a = answer(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno").unwrap();
        assert_eq!(
            (a.status, a.line.as_str(), a.reusable),
            (503, "HTTP/1.1 503 Service Unavailable", true)
        );
    }

    #[test]
    fn an_answer_whose_end_is_unknown_or_that_says_close_does_not() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\n\r\nuntil the end"[..],
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nContent-Length: 9999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
        ] {
            let a = answer(raw).unwrap();
            assert!(
                a.status == 200 && !a.reusable,
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn interim_answers_and_trailers_without_end_are_no_answer() {
        let interim = |n: usize| {
            let mut raw = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(n);
            raw.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            answer(&raw)
        };
        assert_eq!(interim(MAX_INTERIM).unwrap().status, 200);
        let e = interim(MAX_INTERIM + 1).unwrap_err();
        assert_eq!(
            e,
            NoAnswer::Failed("more than 4 interim (1xx) answers before the answer".into())
        );
        let trailed = |trailers: usize, one: &[u8]| {
            let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n".to_vec();
            for _ in 0..trailers {
                raw.extend_from_slice(one);
            }
            raw.extend_from_slice(b"\r\n");
            answer(&raw)
        };
        assert!(trailed(100, b"X-T: 1\r\n").unwrap().reusable);
        let e = trailed(MAX_HEAD / 6 + 1, b"X-T: 1\r\n").unwrap_err();
        assert!(
            matches!(&e, NoAnswer::Failed(w) if w.starts_with("trailers over 65536 bytes")),
            "{e:?}"
        );
        // One trailer line without end.
        let e = trailed(1, &vec![b'x'; 2 * MAX_HEAD]).unwrap_err();
        assert!(
            matches!(&e, NoAnswer::Failed(w) if w.starts_with("a line over")),
            "{e:?}"
        );
    }

    #[test]
    fn no_answer_is_closed_before_a_byte_and_failed_after() {
        assert!(matches!(answer(b""), Err(NoAnswer::Closed(_))));
        assert!(matches!(answer(b"HTTP/1.1 20"), Err(NoAnswer::Failed(_))));
        assert!(matches!(
            answer(b"SSH-2.0\r\n\r\n"),
            Err(NoAnswer::Failed(_))
        ));
    }
}
