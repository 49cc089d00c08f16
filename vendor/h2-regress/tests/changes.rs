//! Our changes to h2 0.4.20 (vendor/README.md), each as a deterministic test: an h2 server
//! on one end of an in-memory pipe, a client on the other end that writes raw HTTP/2 frames
//! and reads what the server answers. Every wait is for a frame the server sends (a PING's
//! answer marks that all frames written before it were handled), never a sleep.
//!
//! With the vendored h2 both pass; with crates.io's h2 0.4.20 both fail (run them there by
//! copying this folder out of the workspace: `cargo test` in the copy).

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PROTOCOL_ERROR: u32 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len() as u32;
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `GET /` over http, from HPACK's static table (`:method GET`, `:scheme http`, `:path /`).
fn get(stream: u32) -> Vec<u8> {
    frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        stream,
        &[0x82, 0x86, 0x84],
    )
}

fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

/// A GOAWAY the server sent: (last stream id, error code, debug data).
#[derive(Debug, Clone, PartialEq)]
struct GoAway(u32, u32, String);

/// The client's end: writes frames, reads the server's, answers its SETTINGS and PINGs.
struct Client {
    io: DuplexStream,
    goaways: Vec<GoAway>,
}

impl Client {
    async fn start(io: DuplexStream) -> Client {
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
    async fn write(&mut self, bytes: &[u8]) {
        let _ = self.io.write_all(bytes).await;
    }

    /// The next frame (kind, flags, stream, payload); `None` at the end of the connection.
    async fn read(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
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
    async fn read_until(&mut self, until: impl Fn(u8, u8, u32, &[u8]) -> bool) -> bool {
        while let Some((kind, flags, stream, payload)) = self.read().await {
            if until(kind, flags, stream, &payload) {
                return true;
            }
        }
        false
    }

    /// Writes a PING and reads until its answer: every frame written before it has been
    /// handled by then. False when the connection ended first.
    async fn round_trip(&mut self, opaque: [u8; 8]) -> bool {
        self.write(&frame(PING, 0, 0, &opaque)).await;
        self.read_until(|kind, flags, _, payload| {
            kind == PING && flags & ACK != 0 && payload == opaque
        })
        .await
    }
}

/// An h2 server on the other end of the pipe, answering each request `200` once `go` says
/// so; `shutdown` starts a graceful shutdown after the first request arrived.
fn serve(io: DuplexStream, go: tokio::sync::watch::Receiver<bool>, shutdown: bool) {
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

/// Change 1: a WINDOW_UPDATE for a stream above the last id of the server's GOAWAY is
/// ignored, as that stream's HEADERS are, instead of ending the connection (and every call
/// on it) with PROTOCOL_ERROR. What a gRPC client does when it opened a stream just before it
/// saw the server's first GOAWAY.
#[tokio::test]
async fn a_window_update_above_the_goaways_last_stream_is_ignored() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (go, go_rx) = tokio::sync::watch::channel(false);
    serve(server_io, go_rx, true);
    let mut c = Client::start(client_io).await;
    c.write(&get(1)).await;
    // The graceful shutdown: GOAWAY (2^31-1), a PING (answered by `read`), then GOAWAY with
    // the last stream the server took: 1.
    assert!(
        c.read_until(|kind, _, _, p| kind == GOAWAY && p[0..4] == 1u32.to_be_bytes())
            .await,
        "no GOAWAY with last stream 1: {:?}",
        c.goaways
    );
    // A stream the client opened meanwhile, and a WINDOW_UPDATE for it.
    c.write(&get(3)).await;
    c.write(&window_update(3, 1024)).await;
    let alive = c.round_trip(*b"after-wu").await;
    assert!(
        alive && c.goaways.iter().all(|g| g.1 != PROTOCOL_ERROR),
        "the connection ended for a WINDOW_UPDATE on a stream above the GOAWAY's last id: {:?}",
        c.goaways
    );
    // Stream 1 is still answered, and the connection ends cleanly.
    go.send(true).unwrap();
    assert!(
        c.read_until(|kind, flags, stream, _| kind == DATA
            && stream == 1
            && flags & END_STREAM != 0)
            .await,
        "stream 1 was not answered: {:?}",
        c.goaways
    );
    assert!(c.goaways.iter().all(|g| g.1 == 0), "{:?}", c.goaways);
}

/// Change 2: a connection that sends control frames without useful work is ended with
/// GOAWAY ENHANCE_YOUR_CALM (`too_many_control_frames`) once more than 1,000 units in debt.
#[tokio::test]
async fn a_window_update_flood_is_ended_with_enhance_your_calm() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (_go, go_rx) = tokio::sync::watch::channel(true);
    serve(server_io, go_rx, false);
    let mut c = Client::start(client_io).await;
    let flood: Vec<u8> = (0..2_000).flat_map(|_| window_update(0, 1)).collect();
    c.write(&flood).await;
    let answered = c.round_trip(*b"floodend").await;
    assert!(
        c.goaways.contains(&GoAway(
            0,
            ENHANCE_YOUR_CALM,
            "too_many_control_frames".into()
        )),
        "2,000 WINDOW_UPDATE(+1) frames, and no GOAWAY ENHANCE_YOUR_CALM (PING answered: \
         {answered}): {:?}",
        c.goaways
    );
    // A well-behaved peer's share: a WINDOW_UPDATE per request is far inside the budget.
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (_go, go_rx) = tokio::sync::watch::channel(true);
    serve(server_io, go_rx, false);
    let mut c = Client::start(client_io).await;
    for i in 0..200u32 {
        let stream = 2 * i + 1;
        c.write(&get(stream)).await;
        c.write(&window_update(0, 1024)).await;
        assert!(
            c.read_until(|kind, flags, s, _| kind == DATA
                && s == stream
                && flags & END_STREAM != 0)
                .await,
            "request {i}: {:?}",
            c.goaways
        );
    }
    assert!(c.goaways.is_empty(), "{:?}", c.goaways);
}
