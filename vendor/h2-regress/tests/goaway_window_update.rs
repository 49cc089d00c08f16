//! A WINDOW_UPDATE for a stream above the last stream id of a GOAWAY the server sent is
//! ignored, as that stream's HEADERS, DATA and RST_STREAM are (RFC 9113 section 6.8).

mod raw;

use raw::*;

/// A WINDOW_UPDATE for a stream above the last id of the server's GOAWAY is
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
