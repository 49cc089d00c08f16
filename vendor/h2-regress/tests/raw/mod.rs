//! A raw HTTP/2 client for these tests: an h2 server on one end of an in-memory pipe, a
//! client on the other end that writes raw frames and reads what the server answers. Every
//! wait is for a frame the server sends (a PING's answer marks that all frames written before
//! it were handled), never a sleep.
#![allow(dead_code)]

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const ACK: u8 = 0x1;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len() as u32;
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `GET /` over http, from HPACK's static table (`:method GET`, `:scheme http`, `:path /`).
pub fn get(stream: u32) -> Vec<u8> {
    frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        stream,
        &[0x82, 0x86, 0x84],
    )
}

pub fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

/// A GOAWAY the server sent: (last stream id, error code, debug data).
#[derive(Debug, Clone, PartialEq)]
pub struct GoAway(pub u32, pub u32, pub String);

/// The client's end: writes frames, reads the server's, answers its SETTINGS and PINGs.
pub struct Client {
    io: DuplexStream,
    pub goaways: Vec<GoAway>,
}

impl Client {
    pub async fn start(io: DuplexStream) -> Client {
        let mut c = Client {
            io,
            goaways: Vec::new(),
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        c.write(&hello).await;
        c
    }

    /// Writes `bytes`; a server that already ended the connection is seen by `read`.
    pub async fn write(&mut self, bytes: &[u8]) {
        let _ = self.io.write_all(bytes).await;
    }

    /// The next frame (kind, flags, stream, payload); `None` at the end of the connection.
    pub async fn read(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        if self.io.read_exact(&mut head).await.is_err() {
            return None;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        self.io.read_exact(&mut payload).await.ok()?;
        let (kind, flags) = (head[3], head[4]);
        match kind {
            SETTINGS if flags & ACK == 0 => self.write(&frame(SETTINGS, ACK, 0, &[])).await,
            PING if flags & ACK == 0 => self.write(&frame(PING, ACK, 0, &payload)).await,
            GOAWAY => self.goaways.push(GoAway(
                u32::from_be_bytes(payload[0..4].try_into().unwrap()) & 0x7fff_ffff,
                u32::from_be_bytes(payload[4..8].try_into().unwrap()),
                String::from_utf8_lossy(&payload[8..]).into_owned(),
            )),
            _ => {}
        }
        Some((kind, flags, stream, payload))
    }

    /// Reads until `until` holds for a frame; false when the connection ended first.
    pub async fn read_until(&mut self, until: impl Fn(u8, u8, u32, &[u8]) -> bool) -> bool {
        while let Some((kind, flags, stream, payload)) = self.read().await {
            if until(kind, flags, stream, &payload) {
                return true;
            }
        }
        false
    }

    /// Writes a PING and reads until its answer: every frame written before it has been
    /// handled by then. False when the connection ended first.
    pub async fn round_trip(&mut self, opaque: [u8; 8]) -> bool {
        self.write(&frame(PING, 0, 0, &opaque)).await;
        self.read_until(|kind, flags, _, payload| {
            kind == PING && flags & ACK != 0 && payload == opaque
        })
        .await
    }
}

/// An h2 server on the other end of the pipe, answering each request `200` once `go` says
/// so; `shutdown` starts a graceful shutdown after the first request arrived.
pub fn serve(io: DuplexStream, go: tokio::sync::watch::Receiver<bool>, shutdown: bool) {
    tokio::spawn(async move {
        let Ok(mut conn) = h2::server::handshake(io).await else {
            return;
        };
        let mut first = true;
        while let Some(Ok((_req, mut respond))) = conn.accept().await {
            if shutdown && first {
                conn.graceful_shutdown();
            }
            first = false;
            let mut go = go.clone();
            tokio::spawn(async move {
                let _ = go.wait_for(|g| *g).await;
                let answer = http::Response::builder().status(200).body(()).unwrap();
                if let Ok(mut body) = respond.send_response(answer, false) {
                    let _ = body.send_data(Bytes::from_static(b"ok"), true);
                }
            });
        }
    });
}
