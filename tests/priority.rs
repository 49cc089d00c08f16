//! Priority lanes: the real `app` with one worker serving slowcount.pt
//! (tests/support/make_slow_counter_model.py: each answer is `[passes the model ran before
//! it, n]`, so the model itself shows the order requests ran in). Requests wait on kept-alive
//! connections behind a long pass; `vramfork_requests_waiting_by_lane` shows them by lane;
//! a high-priority request sent last runs next (with batching, it leads the next batch and
//! the oldest low one joins it); a low one that waited past its age limit runs before the
//! high ones queued after it. Each door reads its clients' way of asking:
//! `X-Request-Priority` on `POST /` (and any HTTP door), `parameters.priority` on v2 REST and
//! gRPC through tritonclient, vLLM's `priority` on `/v1/embeddings` through the openai SDK
//! and on the rerank doors; the access log carries the lane, and a bad value is a 400 naming
//! the field.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::{made_once, python_json, raw, read_one, App, Event, Response, Server};
use serde_json::{json, Value};

/// slowcount.pt iterations (~22 µs each once warm, on one torch thread, 26 µs on a busy
/// one): a pass of about 10 s, long enough for the queue behind it to form and be seen in
/// `/metrics` (a heartbeat or three), and to outlast the default age limit (5 s), even on a
/// fast machine.
const LONGER: u64 = 500_000;

/// One worker, one torch thread, its passes on its model thread (slowcount.pt's input is the
/// same size whatever its length: a long pass must not be taken for a small one and run on
/// the event loop), the access log on, `/metrics` on a port of its own.
fn server(app: &App, extra: &[&str]) -> (Server, u16) {
    let mut args = vec![
        "--production",
        "--workers",
        "1",
        "--torch-threads",
        "1",
        "--inline-passes",
        "off",
        "--access-log",
        "--metrics-port",
        "0",
    ];
    args.extend_from_slice(extra);
    let s = Server::start(app, &args);
    s.wait_workers(1);
    let port = s.metrics_port();
    (s, port)
}

fn body(n: u64) -> String {
    format!(r#"{{"inputs": [[{n}]]}}"#)
}

/// A kept-alive connection to the worker, taken by it before the test queues anything on it.
struct Conn(TcpStream);

impl Conn {
    /// Opens a connection and has one small request answered on it: from then on the worker
    /// holds it open, and what it sends reaches the model's queue (a busy worker without
    /// batching takes no new connection).
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
        let mut c = Conn(s);
        c.send(&body(1), "normal", "opening");
        let r = c.answer();
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.header("connection").is_none(), "kept alive: {r:?}");
        c
    }

    fn send(&mut self, body: &str, lane: &str, id: &str) {
        let req = format!(
            "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Request-Priority: {lane}\r\nX-Request-Id: {id}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.0.write_all(req.as_bytes()).unwrap();
    }

    fn answer(&mut self) -> Response {
        read_one(&mut self.0).unwrap()
    }

    /// The answer's count of passes the model ran before it.
    fn ran_after(&mut self) -> u64 {
        let r = self.answer();
        assert_eq!(r.status, 200, "{r:?}");
        r.json()["outputs"][0][0].as_f64().unwrap() as u64
    }
}

/// `vramfork_requests_waiting_by_lane{lane}` in a scrape of the master's `/metrics` (the
/// Prometheus text of a gauge: `0.0`).
fn lane_waiting(port: u16, lane: &str) -> Option<u64> {
    let text = common::http(port, "GET", "/metrics", None).body;
    let row = format!("vramfork_requests_waiting_by_lane{{lane=\"{lane}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(row.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Waits until the gauge shows `n` requests waiting in `lane`.
fn wait_lane(s: &Server, port: u16, lane: &str, n: u64) {
    s.poll(&format!("{n} waiting in the {lane} lane"), || {
        (lane_waiting(port, lane) == Some(n)).then_some(())
    });
}

/// Three small passes: TorchScript's profiling executor runs slowcount.pt's first passes
/// far more slowly per iteration than later ones.
fn warm(s: &Server) {
    for _ in 0..3 {
        assert_eq!(
            raw(s.port, "POST", "/", "", body(10).as_bytes()).status,
            200
        );
    }
}

fn access_line(s: &Server, id: &str) -> Event {
    s.poll(&format!("the access line of {id}"), || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "access" && e.str("request_id") == Some(id))
    })
}

#[test]
fn a_high_priority_request_sent_last_runs_before_ten_queued_low_ones() {
    let app = App::new("slowcount.pt", "");
    // A long --max-queue-wait: its half is the age limit, which must not promote the low
    // requests while this test holds them.
    let (s, mport) = server(&app, &["--max-queue-wait", "1200"]);
    warm(&s);
    let mut conns: Vec<Conn> = (0..12).map(|_| Conn::open(s.port)).collect();
    let (blocker, rest) = conns.split_first_mut().unwrap();
    let (high, lows) = rest.split_last_mut().unwrap();
    blocker.send(&body(LONGER), "low", "blocker");
    s.wait_pool(|p| p.u64("in_flight") == Some(1));
    for (i, c) in lows.iter_mut().enumerate() {
        c.send(&body(1000), "low", &format!("low-{i}"));
    }
    wait_lane(&s, mport, "low", 10);
    assert_eq!(lane_waiting(mport, "high"), Some(0));
    assert_eq!(lane_waiting(mport, "normal"), Some(0));
    high.send(&body(1000), "high", "high");
    wait_lane(&s, mport, "high", 1);
    let first = blocker.ran_after();
    let high_at = high.ran_after() - first;
    let mut low_at: Vec<u64> = lows.iter_mut().map(|c| c.ran_after() - first).collect();
    low_at.sort_unstable();
    eprintln!("after the blocker: high ran at {high_at}, the low ones at {low_at:?}");
    assert_eq!(
        high_at, 1,
        "the high request runs at the first pass boundary"
    );
    assert_eq!(low_at, (2..12).collect::<Vec<u64>>(), "then the low ones");
    assert_eq!(access_line(&s, "high").str("lane"), Some("high"));
    assert_eq!(access_line(&s, "low-3").str("lane"), Some("low"));
    wait_lane(&s, mport, "low", 0);
}

/// With batching the batch's head is the first by lane, and the queued requests of its lane
/// join it in the same order, never a lower lane's (a larger pass would make the head wait):
/// the high request runs next on a pass of its own, then the two oldest low ones together.
#[test]
fn with_batching_the_high_request_runs_next_alone_then_the_oldest_low_ones_together() {
    let app = App::new("slowcount.pt", "");
    let (s, mport) = server(&app, &["--max-queue-wait", "1200", "--max-batch-size", "2"]);
    warm(&s);
    let mut conns: Vec<Conn> = (0..12).map(|_| Conn::open(s.port)).collect();
    let (blocker, rest) = conns.split_first_mut().unwrap();
    let (high, lows) = rest.split_last_mut().unwrap();
    // A pass that outlasts three heartbeats by far: the test waits for one after the first
    // low request (so that it is known to be the oldest), one after the other nine and one
    // after the high one.
    blocker.send(&body(LONGER), "low", "blocker");
    s.wait_pool(|p| p.u64("in_flight") == Some(1));
    lows[0].send(&body(1000), "low", "low-0");
    wait_lane(&s, mport, "low", 1);
    for (i, c) in lows.iter_mut().enumerate().skip(1) {
        c.send(&body(1000), "low", &format!("low-{i}"));
    }
    wait_lane(&s, mport, "low", 10);
    high.send(&body(1000), "high", "high");
    wait_lane(&s, mport, "high", 1);
    let first = blocker.ran_after();
    let high_at = high.ran_after() - first;
    let low_at: Vec<u64> = lows.iter_mut().map(|c| c.ran_after() - first).collect();
    eprintln!("after the blocker: high ran at {high_at}, the low ones at {low_at:?}");
    assert_eq!(
        high_at, 1,
        "the high request leads the first pass after the blocker"
    );
    assert_eq!(
        access_line(&s, "high").u64("batch"),
        Some(1),
        "no low request joins it"
    );
    assert_eq!(
        low_at[..2],
        [2, 2],
        "the two oldest low requests share the next: {low_at:?}"
    );
    assert!(low_at[2..].iter().all(|&l| l >= 3), "{low_at:?}");
    assert_eq!(access_line(&s, "low-0").u64("batch"), Some(2));
}

#[test]
fn a_low_request_past_its_age_limit_runs_before_high_ones_queued_after_it() {
    let app = App::new("slowcount.pt", "");
    // No --max-queue-wait: the age limit is its default, 5 s, which the long pass outlasts.
    let (s, mport) = server(&app, &["--max-queue-wait", "0"]);
    warm(&s);
    let mut conns: Vec<Conn> = (0..12).map(|_| Conn::open(s.port)).collect();
    let (blocker, rest) = conns.split_first_mut().unwrap();
    let (low, highs) = rest.split_first_mut().unwrap();
    blocker.send(&body(LONGER), "normal", "blocker");
    s.wait_pool(|p| p.u64("in_flight") == Some(1));
    low.send(&body(1000), "low", "old-low");
    wait_lane(&s, mport, "low", 1);
    for (i, c) in highs.iter_mut().enumerate() {
        c.send(&body(1000), "high", &format!("high-{i}"));
    }
    wait_lane(&s, mport, "high", 10);
    let first = blocker.ran_after();
    let low_at = low.ran_after() - first;
    let high_at: Vec<u64> = highs.iter_mut().map(|c| c.ran_after() - first).collect();
    eprintln!("after the blocker: the low request ran at {low_at}, the high ones at {high_at:?}");
    let waited_ms = access_line(&s, "old-low").f64("wait_ms").unwrap();
    assert!(
        waited_ms > 5000.0,
        "the long pass outlasts the age limit: {waited_ms} ms"
    );
    assert_eq!(
        low_at, 1,
        "aged past its limit, it runs as if high, the oldest of them"
    );
    assert!(high_at.iter().all(|&h| h >= 2));
}

#[test]
fn bad_priorities_are_refused_naming_the_field_and_the_worker_serves_on() {
    let app = App::new("slowcount.pt", "");
    let (s, _) = server(&app, &[]);
    for bad in ["urgent", "1", ""] {
        let h = format!("X-Request-Priority: {bad}\r\n");
        let r = raw(s.port, "POST", "/", &h, body(1).as_bytes());
        assert_eq!(r.status, 400, "{bad:?}");
        let e = r.json()["error"].as_str().unwrap().to_string();
        assert!(
            e.contains("x-request-priority") && e.contains("high, normal or low"),
            "{e}"
        );
    }
    let infer = "/v2/models/test%20app/infer";
    for bad in ["4", "-1", "1.5", "\"high\"", "true"] {
        let v2 = format!(
            r#"{{"parameters": {{"priority": {bad}}}, "inputs": [{{"name": "input__0", "shape": [1, 1], "datatype": "FP32", "data": [1]}}]}}"#
        );
        let r = raw(s.port, "POST", infer, "", v2.as_bytes());
        assert_eq!(r.status, 400, "{bad}");
        let e = r.json()["error"].as_str().unwrap().to_string();
        assert!(e.contains("parameter priority"), "{e}");
    }
    // The header on a door whose body has a field of its own: the body's wins.
    let v2 = r#"{"parameters": {"priority": 1}, "inputs": [{"name": "input__0", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}"#;
    let h = "X-Request-Priority: low\r\nX-Request-Id: body-wins\r\n";
    assert_eq!(raw(s.port, "POST", infer, h, v2.as_bytes()).status, 200);
    assert_eq!(access_line(&s, "body-wins").str("lane"), Some("high"));
    let h = "X-Request-Priority: low\r\nX-Request-Id: header-only\r\n";
    assert_eq!(raw(s.port, "POST", "/", h, body(1).as_bytes()).status, 200);
    assert_eq!(access_line(&s, "header-only").str("lane"), Some("low"));
    assert_eq!(s.ready_pids().len(), 1, "the worker serves on");
}

#[test]
fn tritonclient_asks_for_a_level_over_rest_and_grpc() {
    let app = App::new("slowcount.pt", "");
    let (s, _) = server(&app, &[]);
    let url = format!("127.0.0.1:{}", s.port);
    let r = python_json("priority_clients.py", &["triton", &url, "test app"], b"");
    eprintln!("{r}");
    for (id, lane) in [
        ("rest-1", "high"),
        ("rest-3", "low"),
        ("grpc-1", "high"),
        ("grpc-3", "low"),
    ] {
        assert_eq!(access_line(&s, id).str("lane"), Some(lane), "{id}");
    }
    let errors = &r["errors"];
    assert_eq!(errors["rest"]["status"], "400", "{r}");
    assert_eq!(
        errors["grpc"]["status"], "StatusCode.INVALID_ARGUMENT",
        "{r}"
    );
    assert_eq!(errors["rest_string"]["status"], 400, "{r}");
    for e in ["rest", "grpc", "rest_string"] {
        let m = errors[e]["message"].as_str().unwrap_or_default();
        assert!(m.contains("parameter priority"), "{e}: {m}");
    }
}

#[test]
fn the_openai_sdk_sends_vllms_priority_on_embeddings() {
    let art = made_once("make_embeddings.py", &["wordpiece.py"], "embeddings");
    let app = App {
        dir: tempfile::tempdir().unwrap(),
    };
    for f in std::fs::read_dir(&art).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, app.dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let metadata = json!({
        "name": "text-embedder",
        "model": "bert.pt",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                    "tokenizer": {"file": "tokenizer.json", "max_length": 24, "truncation": true}}],
        "embeddings": {"pooling": "mean"},
    });
    std::fs::write(app.metadata(), serde_json::to_vec(&metadata).unwrap()).unwrap();
    let (s, _) = server(&app, &[]);
    let r: Value = python_json("priority_clients.py", &["openai", &s.port.to_string()], b"");
    eprintln!("{r}");
    assert_eq!(r["ok"][0]["vectors"], 1);
    assert_eq!(access_line(&s, "sdk-high").str("lane"), Some("high"));
    assert_eq!(access_line(&s, "sdk-low").str("lane"), Some("low"));
    assert_eq!(r["error"]["status"], 400, "{r}");
    assert_eq!(r["error"]["param"], "priority", "{r}");
    let m = r["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains("`priority` must be an integer"), "{m}");
    // Raw JSON: 0 is the normal lane; a float is refused.
    let post = |b: &Value, id: &str| {
        let h = format!("Content-Type: application/json\r\nX-Request-Id: {id}\r\n");
        raw(
            s.port,
            "POST",
            "/v1/embeddings",
            &h,
            &serde_json::to_vec(b).unwrap(),
        )
    };
    let ok = post(
        &json!({"model": "m", "input": "zero", "priority": 0}),
        "raw-0",
    );
    assert_eq!(ok.status, 200);
    assert_eq!(access_line(&s, "raw-0").str("lane"), Some("normal"));
    let bad = post(
        &json!({"model": "m", "input": "x", "priority": 0.5}),
        "raw-bad",
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "priority");
}

/// The rerank doors read vLLM's `priority` too (`/score`, `/rerank`), and the header.
#[test]
fn the_rerank_doors_read_vllms_priority_and_the_header() {
    let art = made_once("make_rerank.py", &["wordpiece.py"], "rerank");
    let app = App {
        dir: tempfile::tempdir().unwrap(),
    };
    for f in std::fs::read_dir(&art).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, app.dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let metadata = json!({
        "name": "cross", "model": "cross.pt", "rerank": {},
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                    "tokenizer": {"file": "tokenizer.json", "max_length": 40,
                                  "feeds": ["input_ids", "attention_mask", "token_type_ids"]}}],
    });
    std::fs::write(app.metadata(), serde_json::to_vec(&metadata).unwrap()).unwrap();
    let (s, _) = server(&app, &[]);
    let post = |path: &str, b: Value, extra: &str| {
        raw(
            s.port,
            "POST",
            path,
            extra,
            &serde_json::to_vec(&b).unwrap(),
        )
    };
    let score = json!({"text_1": "a query", "text_2": ["one document", "another"], "priority": -3});
    let r = post(
        "/score",
        score,
        "X-Request-Priority: low\r\nX-Request-Id: score-high\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        access_line(&s, "score-high").str("lane"),
        Some("high"),
        "the body wins"
    );
    let rerank = json!({"query": "a query", "documents": ["one document"], "priority": 2});
    let r = post("/rerank", rerank, "X-Request-Id: rerank-low\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(access_line(&s, "rerank-low").str("lane"), Some("low"));
    let plain = json!({"query": "a query", "documents": ["one document"]});
    let r = post(
        "/v1/rerank",
        plain,
        "X-Request-Priority: high\r\nX-Request-Id: header\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(access_line(&s, "header").str("lane"), Some("high"));
    let bad = json!({"text_1": "a query", "text_2": "a document", "priority": "soon"});
    let r = post("/score", bad, "");
    assert_eq!(r.status, 400);
    let e = &r.json()["error"];
    assert_eq!(e["param"], "priority", "{e}");
}
