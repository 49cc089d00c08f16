//! A connection to the collector kept between exports (HTTP/1.1 keep-alive), plain TCP or
//! TLS: one export's request and its answer read whole ([`super::answer`]), and whether an
//! idle connection is still open before it carries the next one.
//!
//! Every read and write of a connection, the TLS handshake's included, is bounded by the
//! export's deadline ([`Timed`]): the timeout is for the export whole, so a collector that
//! answers a byte at a time, each within the timeout, cannot hold the exporter longer than
//! one timeout.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rustls::{ClientConnection, StreamOwned};
use vramfork::otel::OtelConfig;

use super::answer::{self, Answer, NoAnswer};

/// An open connection to the collector.
pub struct Connection {
    stream: Stream,
}

enum Stream {
    Plain(Timed),
    Tls(Box<StreamOwned<ClientConnection, Timed>>),
}

/// A TCP stream whose reads and writes end at a deadline: each is given what is left of it
/// as its timeout, and none starts once it has passed.
pub struct Timed {
    s: TcpStream,
    deadline: Instant,
    /// The timeout the deadline was set from (for messages).
    timeout: Duration,
}

impl Timed {
    /// `s`, its operations to end by `deadline` (set `timeout` after the export began).
    pub fn new(s: TcpStream, deadline: Instant, timeout: Duration) -> Timed {
        Timed {
            s,
            deadline,
            timeout,
        }
    }

    /// A new deadline: `timeout` from now.
    pub fn restart(&mut self, timeout: Duration) {
        self.deadline = Instant::now() + timeout;
        self.timeout = timeout;
    }

    fn ran_out(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "not done within the export's timeout of {} ms",
                self.timeout.as_millis()
            ),
        )
    }

    /// What is left of the deadline (at least a millisecond: a zero timeout is none), or
    /// the error saying it ran out.
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.ran_out());
        }
        Ok(left.max(Duration::from_millis(1)))
    }

    /// `r`, unless it is a timeout because the deadline passed (then said so).
    fn timed<T>(&self, r: io::Result<T>) -> io::Result<T> {
        match r {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) && Instant::now() >= self.deadline =>
            {
                Err(self.ran_out())
            }
            r => r,
        }
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.s.set_read_timeout(Some(left))?;
        let r = self.s.read(buf);
        self.timed(r)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.s.set_write_timeout(Some(left))?;
        let r = self.s.write(buf);
        self.timed(r)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

/// Why an exchange got no answer.
pub enum Trip {
    /// The connection turned out closed before any answer (the request may be sent again on
    /// a new one).
    Closed(String),
    Failed(String),
}

impl Connection {
    pub fn plain(s: Timed) -> Connection {
        Connection {
            stream: Stream::Plain(s),
        }
    }

    pub fn tls(s: StreamOwned<ClientConnection, Timed>) -> Connection {
        Connection {
            stream: Stream::Tls(Box::new(s)),
        }
    }

    fn timed(&mut self) -> &mut Timed {
        match &mut self.stream {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &mut s.sock,
        }
    }

    fn tcp(&mut self) -> &TcpStream {
        &self.timed().s
    }

    /// The next export's deadline: `timeout` from now.
    pub fn restart(&mut self, timeout: Duration) {
        self.timed().restart(timeout);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_peer_dripping_bytes_within_each_read_s_timeout_is_cut_at_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let drip = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // A byte every 50 ms until the reader goes (far below the 400 ms deadline each).
            while s.write_all(b"x").is_ok() {
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let timeout = Duration::from_millis(400);
        let began = Instant::now();
        let mut s = Timed::new(TcpStream::connect(addr).unwrap(), began + timeout, timeout);
        let mut got = 0;
        let e = loop {
            match s.read(&mut [0u8; 16]) {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        let took = began.elapsed();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert_eq!(
            e.to_string(),
            "not done within the export's timeout of 400 ms"
        );
        assert!(
            got > 0 && took < Duration::from_secs(3),
            "{got} bytes, {took:?}"
        );
        drop(s);
        drip.join().unwrap();
    }
}
