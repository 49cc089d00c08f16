//! One export's trip to the collector, on the exporter thread (never on a request's path):
//! HTTP/1.1, a connection per export, the configured timeout for each step; over TLS
//! (rustls, sync: `StreamOwned`) for an `https://` endpoint, the collector's certificate
//! verified as `vramfork::otel_tls` says.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use vramfork::otel::OtelConfig;

/// How exports reach the collector: plain TCP, or TLS with the configuration made once.
pub struct Transport {
    /// `None`: http://. `Some(Err)`: https://, but its configuration could not be made
    /// (every export fails with why).
    tls: Option<Result<(Arc<rustls::ClientConfig>, ServerName<'static>), String>>,
}

impl Transport {
    /// Reads the certificate files of an `https://` endpoint.
    pub fn new(config: &OtelConfig) -> Transport {
        let tls = config.tls.as_ref().map(|t| {
            let name = ServerName::try_from(t.host.clone())
                .map_err(|e| format!("{}: not a host name TLS can verify: {e}", t.host))?;
            Ok((vramfork::otel_tls::client_config(t)?, name))
        });
        Transport { tls }
    }

    /// POSTs `body` to the collector; Ok on a 2xx answer.
    pub fn post(&self, config: &OtelConfig, body: &[u8]) -> Result<(), String> {
        let timeout = Duration::from_millis(config.timeout_ms);
        let tls = match &self.tls {
            None => None,
            Some(Ok(t)) => Some(t),
            Some(Err(why)) => return Err(why.clone()),
        };
        let addr = config
            .host_port
            .to_socket_addrs()
            .map_err(|e| format!("{}: {e}", config.host_port))?
            .next()
            .ok_or_else(|| format!("{}: no address", config.host_port))?;
        let mut s =
            TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
        s.set_write_timeout(Some(timeout)).ok();
        s.set_read_timeout(Some(timeout)).ok();
        let Some((client, name)) = tls else {
            return exchange(&mut s, config, body);
        };
        let mut conn = rustls::ClientConnection::new(client.clone(), name.clone())
            .map_err(|e| format!("TLS with {addr}: {e}"))?;
        // The handshake first, so that a refused certificate reads as one.
        while conn.is_handshaking() {
            conn.complete_io(&mut s)
                .map_err(|e| format!("the TLS handshake with {addr} failed: {e}"))?;
        }
        exchange(&mut rustls::StreamOwned::new(conn, s), config, body)
    }
}

/// Sends the request on `s` and reads the status line of the answer.
fn exchange(s: &mut impl ReadWrite, config: &OtelConfig, body: &[u8]) -> Result<(), String> {
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n",
        config.path,
        config.host_port,
        body.len()
    );
    for (k, v) in &config.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let to = &config.host_port;
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .and_then(|()| s.flush())
        .map_err(|e| format!("sending to {to}: {e}"))?;
    // The status line is all that is needed.
    let mut answer = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("the answer of {to}: {e}"))?;
        if n == 0 {
            return Err(format!("{to} closed the connection without an answer"));
        }
        answer.extend_from_slice(&buf[..n]);
        if answer.len() > 8192 {
            break;
        }
    }
    let line = String::from_utf8_lossy(&answer);
    let status = line.split(' ').nth(1).unwrap_or("");
    if status.starts_with('2') {
        Ok(())
    } else {
        Err(format!(
            "{} answered {}",
            config.endpoint,
            line.lines().next().unwrap_or("")
        ))
    }
}

/// A byte stream both ways (a TCP or a TLS one).
trait ReadWrite: Read + Write {}

impl<T: Read + Write> ReadWrite for T {}
