//! A peer that sends control frames without useful work (WINDOW_UPDATE +1 floods) is ended
//! with GOAWAY ENHANCE_YOUR_CALM, while a well-behaved peer's share is far inside the budget.

mod raw;

use raw::*;

/// A connection that sends control frames without useful work is ended with
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
