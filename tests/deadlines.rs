//! Client deadlines: `X-Request-Timeout` (seconds) on `POST /` and v2, and the v2
//! `parameters.timeout` (microseconds, Triton's) as NVIDIA's own client sends it. A request
//! whose deadline passes before its pass starts is not run and gets the refusal
//! (`DEADLINE_STATUS` in worker/src/error.rs); one whose deadline passes during its pass is
//! answered. With batching on, an expired request never joins a batch. The model is
//! slowcount.pt (tests/support/make_slow_counter_model.py): slow.pt's loop, answering
//! `[passes it ran before, n]`, so the model itself shows which requests ran.

mod common;

use std::thread;
use std::time::Instant;

use common::{raw, App, Event, Server};

/// slow.pt iterations (~22 µs each on an idle machine, once warm, on one torch thread): a
/// pass of a few seconds, long past the deadlines below and the heartbeat that reports it.
const LONG: u64 = 150_000;
/// One torch thread: on a machine whose cores are busy with other work, two OpenMP threads
/// make each of slow.pt's small matmuls wait for a core (passes 20-60× slower, measured).
/// And no --max-queue-wait: on a busy machine the long pass may pass its 10 s default, which
/// would refuse the requests behind it for another reason than the one tested.
const ONE_THREAD: [&str; 4] = ["--torch-threads", "1", "--max-queue-wait", "0"];
/// The refusal's status (worker/src/error.rs `DEADLINE_STATUS`).
const REFUSED: u16 = 503;
/// The passes [`warm`] runs.
const WARM: f64 = 3.0;

/// How many passes the model has run (asked with a pass of its own, not counted).
fn passes(s: &Server) -> f64 {
    let r = raw(s.port, "POST", "/", "", body(1).as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["outputs"][0][0].as_f64().unwrap()
}

/// One worker serving slow.pt, with `extra` arguments (and [`ONE_THREAD`]).
fn server(app: &App, extra: &[&str]) -> Server {
    let mut args = vec!["--production", "--workers", "1"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&ONE_THREAD);
    Server::start(app, &args)
}

fn body(n: u64) -> String {
    format!(r#"{{"inputs": [[{n}]]}}"#)
}

/// Three small passes: TorchScript's profiling executor runs slow.pt's first two passes
/// 10-50× more slowly per iteration than later ones (its loop is profiled, then optimised),
/// which would stretch the long pass past a minute.
fn warm(s: &Server) {
    for i in 0..3 {
        let id = format!("X-Request-Id: warm-{i}\r\n");
        assert_eq!(
            raw(s.port, "POST", "/", &id, body(10).as_bytes()).status,
            200
        );
    }
}

fn timeout(s: &str) -> String {
    format!("X-Request-Timeout: {s}\r\n")
}

/// Starts a long request on its own thread and waits until the master reports it in
/// flight (the worker's heartbeat): the model is busy with it from then on.
fn busy(s: &Server) -> thread::JoinHandle<(u16, Instant)> {
    let port = s.port;
    let long = thread::spawn(move || {
        let r = raw(
            port,
            "POST",
            "/",
            "X-Request-Id: long\r\n",
            body(LONG).as_bytes(),
        );
        (r.status, Instant::now())
    });
    s.wait_pool(|p| p.u64("in_flight") == Some(1));
    long
}

fn access_line(s: &Server, id: &str) -> Event {
    s.poll(&format!("the access line of {id}"), || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "access" && e.str("request_id") == Some(id))
    })
}

#[test]
fn a_deadline_that_passes_during_the_pass_still_gets_its_answer() {
    let app = App::new("slowcount.pt", "");
    let s = server(&app, &[]);
    s.wait_workers(1);
    warm(&s);
    // ~0.4 s of work against a 0.05 s deadline: it starts at once, so it runs and answers.
    let r = raw(
        s.port,
        "POST",
        "/",
        &timeout("0.05"),
        body(20_000).as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"], serde_json::json!([[WARM, 20000.0]]));
}

#[test]
fn bad_timeouts_are_refused_with_400() {
    let app = App::new("slowcount.pt", "");
    let s = server(&app, &[]);
    s.wait_workers(1);
    warm(&s);
    for bad in ["0", "-1", "soon", "nan", "1e9"] {
        let r = raw(s.port, "POST", "/", &timeout(bad), body(1).as_bytes());
        assert_eq!(r.status, 400, "{bad}");
        let e = r.json()["error"].as_str().unwrap().to_string();
        assert!(e.contains("X-Request-Timeout"), "{e}");
    }
    let infer = "/v2/models/test%20app/infer";
    // Over a day (86,400,000,000 µs), the header's bound too.
    for bad in ["-1", "1.5", "\"100\"", "true", "86400000001"] {
        let v2 = format!(
            r#"{{"parameters": {{"timeout": {bad}}}, "inputs": [{{"name": "input__0", "shape": [1, 1], "datatype": "FP32", "data": [1]}}]}}"#
        );
        let r = raw(s.port, "POST", infer, "", v2.as_bytes());
        assert_eq!(r.status, 400, "{bad}: {}", String::from_utf8_lossy(&r.body));
        let e = r.json()["error"].as_str().unwrap().to_string();
        assert!(e.contains("parameter timeout"), "{e}");
    }
    // 0 is Triton's "no timeout".
    let v2 = r#"{"parameters": {"timeout": 0}, "inputs": [{"name": "input__0", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}"#;
    assert_eq!(raw(s.port, "POST", infer, "", v2.as_bytes()).status, 200);
}

/// Without batching a worker takes one request at a time: the second waits in the listen
/// queue while the first runs, and is refused when the worker takes it (its deadline,
/// counted from its arrival in the queue, has passed), without running.
#[test]
fn a_request_past_its_deadline_is_not_run() {
    let app = App::new("slowcount.pt", "");
    let s = server(&app, &["--access-log"]);
    s.wait_workers(1);
    warm(&s);
    let long = busy(&s);
    let r = raw(
        s.port,
        "POST",
        "/",
        &format!("{}X-Request-Id: late\r\n", timeout("0.2")),
        body(1).as_bytes(),
    );
    assert_eq!(r.status, REFUSED, "{}", String::from_utf8_lossy(&r.body));
    let e = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        e.contains("deadline")
            && e.contains("X-Request-Timeout 200 ms")
            && e.contains("did not run"),
        "{e}"
    );
    assert_eq!(long.join().unwrap().0, 200);
    // The model ran the warm-up passes and the long one: the late request never ran.
    assert_eq!(passes(&s), WARM + 1.0);
    let line = access_line(&s, "late");
    assert!(line.fields["model_ms"].is_null(), "{:?}", line.fields);
}

/// With batching on the worker takes requests while the model is busy; one whose deadline
/// passes while it waits for the model is refused at its deadline (not when the model is
/// free), and never joins the batch that the request queued beside it runs in.
#[test]
fn with_batching_an_expired_request_never_joins_a_batch() {
    let app = App::new("slowcount.pt", "");
    let s = server(&app, &["--max-batch-size", "4", "--access-log"]);
    s.wait_workers(1);
    warm(&s);
    let long = busy(&s);
    let port = s.port;
    let late = thread::spawn(move || {
        let r = raw(
            port,
            "POST",
            "/",
            &format!("{}X-Request-Id: late\r\n", timeout("0.3")),
            body(1).as_bytes(),
        );
        (r, Instant::now())
    });
    let mate = thread::spawn(move || {
        raw(
            port,
            "POST",
            "/",
            "X-Request-Id: mate\r\n",
            body(2).as_bytes(),
        )
    });
    let (late, late_at) = late.join().unwrap();
    assert_eq!(
        late.status,
        REFUSED,
        "{}",
        String::from_utf8_lossy(&late.body)
    );
    let (long_status, long_at) = long.join().unwrap();
    assert_eq!(long_status, 200);
    assert!(
        late_at < long_at,
        "refused at its deadline, while the model was still busy"
    );
    let mate = mate.join().unwrap();
    assert_eq!(mate.status, 200);
    // The warm-up passes and the long one ran before it; the late one never did.
    assert_eq!(
        mate.json()["outputs"],
        serde_json::json!([[WARM + 1.0, 2.0]])
    );
    assert_eq!(passes(&s), WARM + 2.0);
    let line = access_line(&s, "mate");
    assert_eq!(line.u64("batch"), Some(1), "ran alone: {:?}", line.fields);
    assert!(access_line(&s, "late").fields["model_ms"].is_null());
}

/// NVIDIA's client: `infer(..., timeout=µs)` sends `parameters.timeout`; vramfork honours
/// it, and the client reports the refusal with its status.
#[test]
fn tritonclients_timeout_argument_is_honoured() {
    let app = App::new("slowcount.pt", "");
    let s = server(&app, &["--max-batch-size", "4"]);
    s.wait_workers(1);
    warm(&s);
    let url = format!("127.0.0.1:{}", s.port);
    // Idle: a generous timeout is no obstacle.
    let ok = common::python_json(
        "triton_timeout.py",
        &[&url, "test app", "3", "10000000"],
        b"",
    );
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(ok["output"], serde_json::json!([[WARM, 3.0]]));
    // Busy: a 0.2 s timeout passes while the long request runs.
    let long = busy(&s);
    let late = common::python_json("triton_timeout.py", &[&url, "test app", "1", "200000"], b"");
    assert_eq!(late["ok"], false, "{late}");
    assert_eq!(late["status"], REFUSED.to_string(), "{late}");
    let m = late["message"].as_str().unwrap();
    assert!(
        m.contains("parameters.timeout 200 ms") && m.contains("did not run"),
        "{m}"
    );
    assert_eq!(long.join().unwrap().0, 200);
    // The warm-up passes, the idle request and the long one ran; the late one never did.
    assert_eq!(passes(&s), WARM + 2.0);
}
