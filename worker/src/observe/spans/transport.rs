//! One export's trip to the collector, on the exporter thread (never on a request's path):
//! HTTP/1.1 over a connection kept between exports ([`super::connection`]: a new TCP
//! connection, or TLS handshake, only when there is none open), plain TCP or TLS (rustls,
//! sync: `StreamOwned`) for an `https://` endpoint, the collector's certificate verified as
//! `vramfork::otel_tls` says; the configured timeout for the export whole (connecting, the
//! handshake, sending and the answer share one deadline).
//!
//! An idle connection the collector closed is found closed before it is used, and a request
//! sent on one it closed just then (no byte of an answer before its end) is sent again, at
//! once, on a new connection: a collector closing idle connections costs no batch. A host
//! name resolving to several addresses has each tried in turn, the timeout shared among them.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use vramfork::otel::OtelConfig;

use super::answer::Answer;
use super::connection::{Connection, Timed, Trip};

/// How exports reach the collector: plain TCP, or TLS with the configuration made once.
pub struct Transport {
    /// `None`: http://. `Some(Err)`: https://, but its configuration could not be made
    /// (every export fails with why).
    tls: Option<Result<(Arc<rustls::ClientConfig>, ServerName<'static>), String>>,
    /// The connection the last export left open.
    open: Option<Connection>,
}

impl Transport {
    /// Reads the certificate files of an `https://` endpoint.
    pub fn new(config: &OtelConfig) -> Transport {
        let tls = config.tls.as_ref().map(|t| {
            let name = ServerName::try_from(t.host.clone())
                .map_err(|e| format!("{}: not a host name TLS can verify: {e}", t.host))?;
            Ok((vramfork::otel_tls::client_config(t)?, name))
        });
        Transport { tls, open: None }
    }

    /// POSTs `body` to the collector; Ok on a 2xx answer.
    pub fn post(&mut self, config: &OtelConfig, body: &[u8]) -> Result<(), String> {
        if let Some(Err(why)) = &self.tls {
            return Err(why.clone());
        }
        let timeout = Duration::from_millis(config.timeout_ms);
        let deadline = Instant::now() + timeout;
        if let Some(mut c) = self.open.take() {
            c.restart(timeout);
            if c.alive() {
                match c.exchange(config, body) {
                    Ok(a) => return self.taken(c, a, config),
                    // Closed by the collector as the request went: once more, on a new one.
                    Err(Trip::Closed(_)) => {}
                    Err(Trip::Failed(why)) => return Err(why),
                }
            }
        }
        let mut c = self.connect(config, deadline, timeout)?;
        match c.exchange(config, body) {
            Ok(a) => self.taken(c, a, config),
            Err(Trip::Closed(why) | Trip::Failed(why)) => Err(why),
        }
    }

    /// Keeps `c` when its answer allows; Ok on a 2xx answer.
    fn taken(&mut self, c: Connection, a: Answer, config: &OtelConfig) -> Result<(), String> {
        if a.reusable {
            self.open = Some(c);
        }
        if (200..300).contains(&a.status) {
            Ok(())
        } else {
            Err(format!("{} answered {}", config.endpoint, a.line))
        }
    }

    /// A new connection (and its TLS handshake, for https), by `deadline`.
    fn connect(
        &self,
        config: &OtelConfig,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Connection, String> {
        let addrs: Vec<SocketAddr> = config
            .host_port
            .to_socket_addrs()
            .map_err(|e| format!("{}: {e}", config.host_port))?
            .collect();
        let left = deadline.saturating_duration_since(Instant::now());
        let (s, addr) = first_to_connect(&addrs, left, TcpStream::connect_timeout)
            .map_err(|e| format!("{}: {e}", config.host_port))?;
        s.set_nodelay(true).ok();
        let s = Timed::new(s, deadline, timeout);
        let Some(Ok((client, name))) = &self.tls else {
            return Ok(Connection::plain(s));
        };
        let mut conn = rustls::ClientConnection::new(client.clone(), name.clone())
            .map_err(|e| format!("TLS with {addr}: {e}"))?;
        let mut s = s;
        // The handshake first, so that a refused certificate reads as one.
        while conn.is_handshaking() {
            conn.complete_io(&mut s)
                .map_err(|e| format!("the TLS handshake with {addr} failed: {e}"))?;
        }
        Ok(Connection::tls(rustls::StreamOwned::new(conn, s)))
    }
}

/// The shortest time an address is given while others wait (Go's dialer's figure): a
/// first address that swallows packets leaves the next ones time.
const MIN_ATTEMPT: Duration = Duration::from_secs(2);

/// Connects to each of `addrs` in turn until one answers, within `timeout` in all: each
/// attempt gets what is left divided by the addresses left (at least [`MIN_ATTEMPT`], or
/// what is left), as Go's `net.Dialer` shares its deadline. The error names every address
/// tried and why.
pub fn first_to_connect<T>(
    addrs: &[SocketAddr],
    timeout: Duration,
    mut connect: impl FnMut(&SocketAddr, Duration) -> io::Result<T>,
) -> Result<(T, SocketAddr), String> {
    let deadline = Instant::now() + timeout;
    let mut failed = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            failed.push(format!(
                "{addr}: not tried, the timeout of {} ms ran out",
                timeout.as_millis()
            ));
            continue;
        }
        let share = (left / (addrs.len() - i) as u32).max(MIN_ATTEMPT).min(left);
        match connect(addr, share) {
            Ok(s) => return Ok((s, *addr)),
            Err(e) => failed.push(format!("{addr}: {e}")),
        }
    }
    if failed.is_empty() {
        return Err("no address".into());
    }
    Err(failed.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn each_address_is_tried_in_turn_until_one_connects() {
        // localhost here resolves to 127.0.0.1 alone (/etc/hosts), so the case of ::1 first
        // and a collector on 127.0.0.1 only is made by hand: nothing listens on ::1's port
        // (refused, or no IPv6 at all), the listener is on 127.0.0.1.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
        let v4: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (_, addr) = first_to_connect(
            &[v6, v4],
            Duration::from_secs(5),
            TcpStream::connect_timeout,
        )
        .unwrap();
        assert_eq!(addr, v4);
        drop(l);
        let e = first_to_connect(
            &[v6, v4],
            Duration::from_secs(5),
            TcpStream::connect_timeout,
        )
        .unwrap_err();
        assert!(
            e.starts_with(&format!("{v6}: ")) && e.contains(&format!("; {v4}: ")),
            "{e}"
        );
    }

    #[test]
    fn the_timeout_is_shared_among_the_addresses_left() {
        let addrs: Vec<SocketAddr> = (1..=3)
            .map(|i| format!("10.0.0.{i}:4318").parse().unwrap())
            .collect();
        let mut given = Vec::new();
        let refused = |_: &SocketAddr, t: Duration| -> io::Result<()> {
            given.push(t);
            Err(io::ErrorKind::ConnectionRefused.into())
        };
        let e = first_to_connect(&addrs, Duration::from_secs(9), refused).unwrap_err();
        assert_eq!(e.matches("refused").count(), 3, "{e}");
        let near = |t: Duration, secs: f64| (t.as_secs_f64() - secs).abs() < 0.5;
        assert!(
            near(given[0], 3.0) && near(given[1], 4.5) && near(given[2], 9.0),
            "{given:?}"
        );
        // A short timeout: the first address gets at least MIN_ATTEMPT, never more than all.
        let mut given = Vec::new();
        let refused = |_: &SocketAddr, t: Duration| -> io::Result<()> {
            given.push(t);
            Err(io::ErrorKind::ConnectionRefused.into())
        };
        first_to_connect(&addrs, Duration::from_secs(3), refused).unwrap_err();
        assert!(near(given[0], 2.0) && near(given[1], 2.0), "{given:?}");
        let mut given = Vec::new();
        let refused = |_: &SocketAddr, t: Duration| -> io::Result<()> {
            given.push(t);
            Err(io::ErrorKind::ConnectionRefused.into())
        };
        first_to_connect(&addrs[..2], Duration::from_millis(500), refused).unwrap_err();
        assert!(given[0] <= Duration::from_millis(500), "{given:?}");
    }

    #[test]
    fn an_address_the_timeout_left_no_time_for_is_named() {
        let addrs: Vec<SocketAddr> = vec![
            "10.0.0.1:4318".parse().unwrap(),
            "10.0.0.2:4318".parse().unwrap(),
        ];
        let slow = |_: &SocketAddr, t: Duration| -> io::Result<()> {
            std::thread::sleep(t);
            Err(io::ErrorKind::TimedOut.into())
        };
        let e = first_to_connect(&addrs, Duration::from_millis(50), slow).unwrap_err();
        assert!(
            e.contains("10.0.0.2:4318: not tried, the timeout of 50 ms ran out"),
            "{e}"
        );
    }
}
