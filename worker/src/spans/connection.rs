//! A connection to the collector kept between exports (HTTP/1.1 keep-alive), plain TCP or
//! TLS: one export's request and its answer read whole ([`super::answer`]), and whether an
//! idle connection is still open before it carries the next one.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use rustls::{ClientConnection, StreamOwned};
use vramfork::otel::OtelConfig;

use super::answer::{self, Answer, NoAnswer};

/// An open connection to the collector.
pub struct Connection {
    stream: Stream,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

/// Why an exchange got no answer.
pub enum Trip {
    /// The connection turned out closed before any answer (the request may be sent again on
    /// a new one).
    Closed(String),
    Failed(String),
}

impl Connection {
    pub fn plain(s: TcpStream) -> Connection {
        Connection {
            stream: Stream::Plain(s),
        }
    }

    pub fn tls(s: StreamOwned<ClientConnection, TcpStream>) -> Connection {
        Connection {
            stream: Stream::Tls(Box::new(s)),
        }
    }

    fn tcp(&self) -> &TcpStream {
        match &self.stream {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    /// Whether an idle connection is still open: nothing to read without waiting (a closed
    /// one reads its end, or over TLS the collector's close_notify; anything else the
    /// collector sent unasked makes it unusable too). TLS messages that are no data (a
    /// session ticket) are taken by rustls on the way.
    pub fn alive(&mut self) -> bool {
        if self.tcp().set_nonblocking(true).is_err() {
            return false;
        }
        let r = self.stream.read(&mut [0u8; 1]);
        let blocking = self.tcp().set_nonblocking(false).is_ok();
        blocking && matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Sends the export `body` and reads the answer whole.
    pub fn exchange(&mut self, config: &OtelConfig, body: &[u8]) -> Result<Answer, Trip> {
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n",
            config.path,
            config.host_port,
            body.len()
        );
        for (k, v) in &config.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let to = &config.host_port;
        let sent = self
            .stream
            .write_all(head.as_bytes())
            .and_then(|()| self.stream.write_all(body))
            .and_then(|()| self.stream.flush());
        match sent {
            Ok(()) => {}
            Err(e) if answer::closed(&e) => {
                return Err(Trip::Closed(format!("sending to {to}: {e}")))
            }
            Err(e) => return Err(Trip::Failed(format!("sending to {to}: {e}"))),
        }
        answer::read(&mut self.stream).map_err(|e| match e {
            NoAnswer::Closed(why) => Trip::Closed(format!("{to}: {why}")),
            NoAnswer::Failed(why) => Trip::Failed(format!("the answer of {to}: {why}")),
        })
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}
