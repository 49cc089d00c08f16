//! Bounded parsing, kept by process tests: what a hostile or broken client can
//! send to the serving port, and the limit that bounds each, so that no refactor of the
//! decoders or the connection code loses one. Each test starts the real `app --production`
//! with one worker on the MLP fixture (`[N, 4]` float32 in, `[N, 3]` out) and checks, after
//! the hostile request, that the same worker answers the next one and that the master saw
//! no worker end. What each test pins:
//!
//! - JSON nesting depth (serde_json's recursion limit, 128): bodies nested 150,000 deep, in
//!   every place a decoder builds a tree or recurses, are 400s, not a stack overflow.
//! - Bodies in tiny pieces: 200,000 one-byte chunks (one write, or a write each), and a
//!   `Content-Length` body in 200,000 one-byte TCP writes, are answered as the same body
//!   sent at once.
//! - Header limits (hyper 1.x's defaults, which vramfork does not change): at most 100
//!   header lines; a head is refused once hyper has buffered its read-buffer limit of it
//!   (8,192 + 4,096 × 100 = 417,792 bytes) without finding its end (a head a little larger
//!   passes when the read that completes it crosses the limit: 480,000 bytes did here,
//!   500,000 did not; 1 MB never can); a target under 65,534 bytes: beyond, 431 or 414
//!   and the connection closed.
//! - Chunked bodies' trailers (100 fields, 16 KiB) and chunk extensions (16 KiB): beyond,
//!   400.
//! - Deadlines (`worker/src/timeouts.rs`): a head still arriving 10 s after its first byte
//!   is dropped, even while bytes keep coming; a body not complete 30 s after its head gets
//!   408.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{parse_raw, raw, App, Server, MLP_INPUT, PATIENCE};
use serde_json::Value;

/// The nesting depth of the issue's bodies (Triton's own test suite sends such).
const DEPTH: usize = 150_000;

/// The MLP with its declared input; its v2 name is the metadata's (`test app`).
fn mlp() -> App {
    App::new(
        "mlp.pt",
        r#""input": {"shape": [-1, 4], "dtype": "float32"}"#,
    )
}

const V2_INFER: &str = "/v2/models/test%20app/infer";

/// `app --production` with one worker (one torch thread: a loaded 2-core machine runs
/// passes far slower with two); returns the server and its worker's pid.
fn one_worker(app: &App, extra: &[&str]) -> (Server, u32) {
    let mut args = vec!["--production", "--workers", "1", "--torch-threads", "1"];
    args.extend_from_slice(extra);
    let s = Server::start(app, &args);
    let pid = s.wait_workers(1)[0];
    (s, pid)
}

/// The worker `pid` still serves (a valid request answered by it) and the master saw no
/// worker end: the hostile request cost nothing.
fn still_serves(s: &Server, pid: u32, body: &str) {
    let r = s.post("/", body);
    assert_eq!((r.status, r.pid()), (200, pid), "{r:?}");
    for ended in ["worker_exited", "worker_killed"] {
        let e = s.events_named(ended);
        assert!(e.is_empty(), "a worker ended: {e:?}");
    }
    assert_eq!(
        s.wait_workers(1),
        vec![pid],
        "the same worker, never replaced"
    );
}

/// `depth` arrays around `leaf`.
fn nested(depth: usize, leaf: &str) -> String {
    format!("{}{leaf}{}", "[".repeat(depth), "]".repeat(depth))
}

/// `depth` objects `{"a": …}` around `leaf`.
fn nested_objects(depth: usize, leaf: &str) -> String {
    format!("{}{leaf}{}", "{\"a\":".repeat(depth), "}".repeat(depth))
}

/// A 400 whose JSON error says the body is nested too deep, from worker `pid`.
fn assert_too_deep(what: &str, r: &common::Raw, pid: u32) {
    let body = String::from_utf8_lossy(&r.body);
    assert_eq!(r.status, 400, "{what}: {body}");
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    let e = r.json()["error"].as_str().unwrap_or_default().to_string();
    // serde_json's wording today ("recursion limit exceeded"); another parser's may say
    // depth or nesting: any of them tells the client what is wrong.
    assert!(
        ["recursion", "depth", "nest"].iter().any(|w| e.contains(w)),
        "{what}: the error does not say the body is nested too deep: {e:?}"
    );
}

/// `POST /` and v2 bodies nested 150,000 deep wherever a decoder recurses: 400 naming the
/// nesting, from the same worker, which then serves on. Pins serde_json's recursion limit
/// (128) on the streaming `POST /` parser (`decode/numeric.rs`, both inline for bodies up
/// to 64 kB and on a blocking thread above) and on v2's `data` (`decode/elements.rs`). A
/// deep value in a field no decoder reads (v2 `parameters` are kept as JSON text and only
/// the ones vramfork knows are read) is skipped without recursion (serde_json's
/// `ignore_value` keeps its own stack, bounded by the body): answered as if absent.
#[test]
fn bodies_nested_150000_deep_get_400_and_the_worker_serves_on() {
    let app = mlp();
    let (s, pid) = one_worker(&app, &[]);
    let deep = nested(DEPTH, "1");
    // Under 64 kB: parsed on the event loop.
    let shallower = nested(20_000, "1");
    let post_cases = [
        ("POST / inputs", format!(r#"{{"inputs": {deep}}}"#)),
        (
            "POST / inputs, inline",
            format!(r#"{{"inputs": {shallower}}}"#),
        ),
    ];
    assert!(post_cases[1].1.len() < 64 << 10);
    for (what, body) in &post_cases {
        let r = raw(s.port, "POST", "/", "", body.as_bytes());
        assert_too_deep(what, &r, pid);
        still_serves(&s, pid, MLP_INPUT);
    }

    let input = |data: &str, params: &str| {
        format!(
            r#"{{"inputs":[{{"name":"input__0","shape":[1,4],"datatype":"FP32","data":{data}}}]{params}}}"#
        )
    };
    let r = raw(s.port, "POST", V2_INFER, "", input(&deep, "").as_bytes());
    assert_too_deep("v2 data", &r, pid);
    still_serves(&s, pid, MLP_INPUT);

    // Fields no decoder reads: skipped, the request answered as without them.
    let plain = raw(s.port, "POST", "/", "", MLP_INPUT.as_bytes());
    assert_eq!(plain.status, 200);
    let ignored = format!(r#"{{"inputs": [[1.0, 2.0, 3.0, 4.0]], "extra": {deep}}}"#);
    let r = raw(s.port, "POST", "/", "", ignored.as_bytes());
    assert_eq!(
        (r.status, r.json()),
        (200, plain.json()),
        "a deep unread field"
    );
    let v2_plain = raw(
        s.port,
        "POST",
        V2_INFER,
        "",
        input("[1,2,3,4]", "").as_bytes(),
    );
    assert_eq!(v2_plain.status, 200);
    let v2_ignored = [
        (
            "v2 extra field",
            input("[1,2,3,4]", &format!(r#","extra":{deep}"#)),
        ),
        (
            "v2 parameters",
            input("[1,2,3,4]", &format!(r#","parameters":{{"x":{deep}}}"#)),
        ),
        (
            "v2 parameters of objects",
            input(
                "[1,2,3,4]",
                &format!(r#","parameters":{{"x":{}}}"#, nested_objects(DEPTH, "1")),
            ),
        ),
        (
            "v2 input parameters",
            format!(
                r#"{{"inputs":[{{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{{"x":{deep}}},"data":[1,2,3,4]}}]}}"#
            ),
        ),
    ];
    for (what, body) in &v2_ignored {
        let r = raw(s.port, "POST", V2_INFER, "", body.as_bytes());
        assert_eq!(
            r.status,
            200,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["outputs"], v2_plain.json()["outputs"], "{what}");
        assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    }
    // The binary extension: a deep unread parameter in the JSON header, then 16 bytes of
    // tensor data (zeros).
    let head = format!(
        r#"{{"inputs":[{{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{{"binary_data_size":16,"x":{deep}}}}}]}}"#
    );
    let (extra, body) = common::binary(&head, &[0u8; 16]);
    let r = raw(s.port, "POST", V2_INFER, &extra, &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let zeros = raw(
        s.port,
        "POST",
        V2_INFER,
        "",
        input("[0,0,0,0]", "").as_bytes(),
    );
    assert_eq!(r.json()["outputs"], zeros.json()["outputs"]);
    still_serves(&s, pid, MLP_INPUT);
}

/// A model with several named inputs: each input's value is read by the streaming walk of
/// `decode/elements.rs`; nested 150,000 deep in an input, 400 naming the nesting (serde_json's
/// recursion limit there too); a deep value under a name the model does not take is never
/// read: 400 saying which input is missing.
#[test]
fn named_inputs_nested_150000_deep_get_400_and_the_worker_serves_on() {
    let app = App::pair();
    let (s, pid) = one_worker(&app, &[]);
    let ok = r#"{"inputs": {"features": [[1, 2, 3]], "scale": [2]}}"#;
    let r = raw(s.port, "POST", "/", "", ok.as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = format!(
        r#"{{"inputs": {{"features": {}, "scale": [2]}}}}"#,
        nested(DEPTH, "1")
    );
    let r = raw(s.port, "POST", "/", "", body.as_bytes());
    assert_too_deep("features", &r, pid);
    still_serves(&s, pid, ok);
    let body = format!(r#"{{"inputs": {}}}"#, nested_objects(DEPTH, "1"));
    let r = raw(s.port, "POST", "/", "", body.as_bytes());
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let e = r.json()["error"].as_str().unwrap_or_default().to_string();
    assert!(e.contains(r#"`inputs` lacks input "features""#), "{e}");
    still_serves(&s, pid, ok);
}

/// A valid `POST /` body of at least `min` bytes: rows of four distinct numbers.
fn rows_body(min: usize) -> (String, usize) {
    let mut rows = Vec::new();
    let mut len = 0;
    while len < min {
        let i = rows.len() as f64;
        let row = format!(
            "[{},{},{},{}]",
            i * 0.5 - 3.0,
            (i % 7.0) * 0.25,
            -(i % 13.0),
            1.0 / (i + 1.0)
        );
        len += row.len() + 1;
        rows.push(row);
    }
    let n = rows.len();
    (format!(r#"{{"inputs": [{}]}}"#, rows.join(",")), n)
}

/// Sends `head` then `pieces` one write each (Nagle off, so each is a segment of its own),
/// and reads the answer.
fn send_in_pieces(port: u16, head: &str, pieces: impl Iterator<Item = Vec<u8>>) -> common::Raw {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    c.write_all(head.as_bytes()).unwrap();
    for p in pieces {
        c.write_all(&p).unwrap();
    }
    let mut all = Vec::new();
    c.read_to_end(&mut all).unwrap();
    let (status, headers, body) = parse_raw(&all).unwrap();
    common::Raw {
        status,
        headers,
        body: body.to_vec(),
    }
}

/// One-byte chunks: `1\r\n<byte>\r\n` each, then the last chunk.
fn one_byte_chunks(body: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    body.iter()
        .map(|b| {
            let mut c = b"1\r\n".to_vec();
            c.push(*b);
            c.extend_from_slice(b"\r\n");
            c
        })
        .chain(std::iter::once(b"0\r\n\r\n".to_vec()))
}

/// A valid 200,000-byte body in one-byte pieces is answered as the same body sent at
/// once: as 200,000 one-byte chunks (chunked transfer encoding) in one write and in a
/// write each, and with `Content-Length` in 200,000 one-byte TCP writes, on `POST /` and
/// v2. Pins that the body reader (`http/request.rs`'s `read_body`) and hyper's chunk
/// decoder neither lose, reorder nor refuse tiny frames, and that such a body is read
/// within the 30 s body deadline.
///
/// `--max-queue-wait 0`: today the queue wait counts from the request's head, so a body
/// that takes longer than `--max-queue-wait` (10 s) to arrive can be refused with 503 as if
/// it had waited for a worker; a loaded machine takes seconds to decode 200,000 chunks in a
/// debug build, and this test is about reading them.
#[test]
fn bodies_in_200000_one_byte_pieces_are_answered_as_sent_at_once() {
    let app = mlp();
    let (s, pid) = one_worker(&app, &["--max-queue-wait", "0"]);
    let (body, n) = rows_body(200_000);
    assert!(body.len() >= 200_000);
    let at_once = raw(s.port, "POST", "/", "", body.as_bytes());
    assert_eq!(
        at_once.status,
        200,
        "{}",
        String::from_utf8_lossy(&at_once.body)
    );
    let want = at_once.json()["outputs"].clone();
    assert_eq!(want.as_array().unwrap().len(), n);

    let chunked_head = "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    // All the chunks in one write: 1.2 MB of chunk framing for 200 kB of body.
    let framing: Vec<u8> = one_byte_chunks(body.as_bytes()).flatten().collect();
    let r = send_in_pieces(s.port, chunked_head, std::iter::once(framing));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"], want, "200,000 chunks in one write");
    // A write, and a TCP segment, each.
    let r = send_in_pieces(s.port, chunked_head, one_byte_chunks(body.as_bytes()));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"], want, "200,000 chunks in a write each");
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));

    // v2 with Content-Length, one byte a write.
    let rows = &body[r#"{"inputs": "#.len()..body.len() - 1];
    let v2 = format!(
        r#"{{"inputs":[{{"name":"input__0","shape":[{n},4],"datatype":"FP32","data":{rows}}}]}}"#
    );
    let v2_once = raw(s.port, "POST", V2_INFER, "", v2.as_bytes());
    assert_eq!(
        v2_once.status,
        200,
        "{}",
        String::from_utf8_lossy(&v2_once.body)
    );
    let head = format!(
        "POST {V2_INFER} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        v2.len()
    );
    let r = send_in_pieces(s.port, &head, v2.bytes().map(|b| vec![b]));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"], v2_once.json()["outputs"]);
    assert_eq!(
        r.json()["outputs"][0]["data"].as_array().unwrap().len(),
        n * 3
    );
    still_serves(&s, pid, MLP_INPUT);
}

/// Writes `request` from a thread of its own (the server may stop reading and close under
/// it: a failed write is expected then) and reads what comes back until the server closes
/// or resets the connection. Returns the bytes read and whether it ended in a reset.
fn send_hostile(port: u16, request: Vec<u8>) -> (Vec<u8>, bool) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&request);
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let reset = loop {
        match c.read(&mut buf) {
            Ok(0) => break false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("no answer and no close: {e}"),
        }
    };
    writer.join().unwrap();
    (got, reset)
}

/// A `GET` head of `lines` header lines in all (`Host` and `Connection` among them), the
/// others `X-Pad-<i>: <value>`.
fn head_with(path: &str, lines: usize, value: &str) -> Vec<u8> {
    let mut h = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for i in 0..lines - 2 {
        h.push_str(&format!("X-Pad-{i}: {value}\r\n"));
    }
    h.push_str("\r\n");
    h.into_bytes()
}

/// The status of an answer to a hostile request.
fn status_of(what: &str, got: &[u8], reset: bool) -> u16 {
    match parse_raw(got) {
        Ok((status, _, _)) => status,
        Err(e) => panic!("{what}: no answer ({e}; reset: {reset}): {got:?}"),
    }
}

/// Header limits, on the serving port (the worker) and on the metrics port (the master):
/// hyper 1.x's defaults, which vramfork does not change (`worker/src/server.rs` and
/// `src/metrics/endpoint.rs` build `http1::Builder::new()` without `max_headers` or
/// `max_buf_size`). Pinned:
/// - 100 header lines are served; 101 get 431 (hyper's `max_headers` default, 100);
/// - a 64 KiB header value is served; a 1 MB one gets 431 once hyper has buffered 417,792
///   bytes of the head (`max_buf_size` default: 8,192 + 4,096 × 100) without its end, the
///   rest unread (a read that completes the head may cross that limit, so the largest head
///   that passes is somewhat larger and varies; a read takes at most the limit, so 1 MB is
///   always refused);
/// - a request target over 65,534 bytes gets 414;
///
/// and after each refusal the connection is closed and the same worker serves on.
#[test]
fn too_many_or_too_large_headers_are_refused_and_the_worker_serves_on() {
    let app = mlp();
    let (s, pid) = one_worker(&app, &["--metrics-port", "0"]);
    let e = s.wait_event("metrics_listening", |_| true);
    let mport: u16 = e
        .str("addr")
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let big = "v".repeat(1 << 20);
    let kib64 = "v".repeat(64 << 10);
    let long_target = format!("/healthz?{}", "q".repeat(70_000));
    for (port, path) in [(s.port, "/healthz"), (mport, "/health/live")] {
        let cases: [(&str, Vec<u8>, u16); 5] = [
            ("100 header lines", head_with(path, 100, "v"), 200),
            ("101 header lines", head_with(path, 101, "v"), 431),
            ("a 64 KiB header", head_with(path, 3, &kib64), 200),
            ("a 1 MB header", head_with(path, 3, &big), 431),
            (
                "a 70,000-byte target",
                format!("GET {long_target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .into_bytes(),
                414,
            ),
        ];
        for (what, req, want) in cases {
            let what = format!("{what} to port {port}");
            let (got, reset) = send_hostile(port, req);
            assert_eq!(status_of(&what, &got, reset), want, "{what}");
            still_serves(&s, pid, MLP_INPUT);
        }
    }
    let live = common::http(mport, "GET", "/health/live", None);
    assert_eq!(live.status, 200, "the master's listener serves on");
}

/// Trailers and chunk extensions of a chunked body, bounded by hyper's chunk decoder
/// (`proto/h1/decode.rs` in hyper 1.x): trailer fields at most 100 and 16 KiB in all,
/// chunk extensions at most 16 KiB. Beyond, the body cannot be read: 400 ("could not read
/// the request body"), from the same worker, which serves on. A small trailer is fine.
#[test]
fn trailers_and_chunk_extensions_are_bounded() {
    let app = mlp();
    let (s, pid) = one_worker(&app, &[]);
    let body = MLP_INPUT.as_bytes();
    let head = "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    let chunked = |ext: &str, trailers: &str| -> Vec<u8> {
        let mut r = format!("{head}{:x}{ext}\r\n", body.len()).into_bytes();
        r.extend_from_slice(body);
        r.extend_from_slice(format!("\r\n0\r\n{trailers}\r\n").as_bytes());
        r
    };
    let many: String = (0..101).map(|i| format!("X-T{i}: 1\r\n")).collect();
    let cases = [
        ("a small trailer", chunked("", "X-T: 1\r\n"), 200),
        ("101 trailer fields", chunked("", &many), 400),
        (
            "a 20 kB trailer",
            chunked("", &format!("X-T: {}\r\n", "v".repeat(20_000))),
            400,
        ),
        (
            "a 1 MB chunk extension",
            chunked(&format!(";a={}", "v".repeat(1 << 20)), ""),
            400,
        ),
    ];
    for (what, req, want) in cases {
        let (got, reset) = send_hostile(s.port, req);
        let (status, headers, answer) =
            parse_raw(&got).unwrap_or_else(|e| panic!("{what}: no answer ({e}; reset: {reset})"));
        let answer = String::from_utf8_lossy(answer);
        assert_eq!(status, want, "{what}: {answer}");
        let from = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("x-worker-pid"));
        assert_eq!(
            from.map(|(_, v)| v.as_str()),
            Some(pid.to_string().as_str())
        );
        if want == 400 {
            assert!(
                answer.contains("could not read the request body"),
                "{what}: {answer}"
            );
        }
        still_serves(&s, pid, MLP_INPUT);
    }
}

/// Sends `first` then drips `drip` one byte at a time (every 100 ms, at most `max` bytes)
/// until the server answers or closes; returns what came back and whether the dripping
/// was still going on when it did.
fn drip_until_answered(port: u16, first: &[u8], drip: u8, max: usize) -> (Vec<u8>, bool) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_nodelay(true).unwrap();
    // A hang guard well past the server's deadlines (10 s head, 30 s body).
    c.set_read_timeout(Some(2 * PATIENCE)).unwrap();
    c.write_all(first).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let still_dripping = Arc::new(AtomicBool::new(true));
    let dripper = {
        let mut w = c.try_clone().unwrap();
        let (done, dripping) = (done.clone(), still_dripping.clone());
        std::thread::spawn(move || {
            for _ in 0..max {
                if done.load(Ordering::SeqCst) || w.write_all(&[drip]).is_err() {
                    return;
                }
                // The client's pace, not a wait for the server.
                std::thread::sleep(Duration::from_millis(100));
            }
            dripping.store(false, Ordering::SeqCst);
        })
    };
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("neither answered nor closed: {e}"),
        }
    }
    let dripping = still_dripping.load(Ordering::SeqCst);
    done.store(true, Ordering::SeqCst);
    dripper.join().unwrap();
    (got, dripping)
}

/// Deadlines that bound a slow client (`worker/src/timeouts.rs`): a request head that keeps
/// arriving, a byte every 100 ms, is dropped without an answer at its 10 s deadline
/// (counted from its first byte, not moved by later bytes: slowloris); a body that keeps
/// arriving a byte every 100 ms gets 408 at its 30 s deadline. Both while the client is
/// still sending (it would go on for 120 s), and the worker serves on.
#[test]
fn heads_and_bodies_that_drip_are_cut_off_at_their_deadlines() {
    let app = mlp();
    let (s, pid) = one_worker(&app, &[]);
    let (got, dripping) = drip_until_answered(
        s.port,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Drip: ",
        b'a',
        1200,
    );
    assert!(
        got.is_empty(),
        "a head past its deadline was answered: {got:?}"
    );
    assert!(
        dripping,
        "the head was not cut off while it was still arriving"
    );
    still_serves(&s, pid, MLP_INPUT);

    let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"inputs\": ";
    let (got, dripping) = drip_until_answered(s.port, head.as_bytes(), b' ', 1200);
    let (status, _, body) = parse_raw(&got).expect("an answer to the dripping body");
    assert_eq!(status, 408, "{}", String::from_utf8_lossy(body));
    let e: Value = serde_json::from_slice(body).unwrap();
    assert!(e["error"].is_string(), "{e}");
    assert!(
        dripping,
        "the body was not cut off while it was still arriving"
    );
    still_serves(&s, pid, MLP_INPUT);
}
