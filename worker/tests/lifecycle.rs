//! The worker's life as the master sees it: ready and heartbeats on the control channel,
//! retirement after max_requests, on SIGTERM with a request in flight, after a request
//! timeout; accepting only when idle; and the exit statuses for bad config and bad models.

mod util;

use std::time::{Duration, Instant};

use serde_json::json;
use util::{config, ms, Start, Worker, PATIENCE};
use vramfork::protocol::{worker_exit, ControlMsg, RetireReason};

/// Iterations that outlast every test (~4 min).
const FOREVER: u64 = 10_000_000;

const MLP_REQ: &str = r#"{"inputs": [[1, 2, 3, 4]]}"#;

/// A slow.pt request body running `n` iterations (~22 µs each on the build machine, so
/// 100_000 ≈ 2 s; [`FOREVER`] outlasts any test).
fn slow(n: u64) -> String {
    json!({"inputs": [[n]]}).to_string()
}

#[test]
fn ready_then_heartbeats_with_counts() {
    let mut w = Worker::ready(config("mlp", |_| {}));
    assert_eq!(w.post("/", MLP_REQ).status, 200);
    assert_eq!(w.get("/").status, 200, "metadata requests do not count");
    let deadline = Instant::now() + PATIENCE;
    loop {
        match w.next_any(PATIENCE) {
            Some(ControlMsg::Heartbeat {
                served: 1,
                in_flight: 0,
                ..
            }) => break,
            Some(ControlMsg::Heartbeat { .. }) if Instant::now() < deadline => continue,
            other => panic!("expected a heartbeat with served 1, got {other:?}"),
        }
    }
}

#[test]
fn max_requests_retires_with_connection_close_and_exits_0() {
    let mut w = Worker::ready(config("mlp", |c| c["max_requests"] = json!(2)));
    let mut c = w.connect();
    assert_eq!(c.request("GET", "/", "").status, 200);
    assert_eq!(c.request("GET", "/healthz", "").status, 200);
    let r1 = c.request("POST", "/", MLP_REQ);
    assert_eq!(r1.status, 200);
    assert_eq!(r1.header("connection"), None, "{r1:?}");
    let r2 = c.request("POST", "/", MLP_REQ);
    assert_eq!(r2.status, 200);
    assert_eq!(r2.header("connection"), Some("close"));
    assert!(c.closed_by_server(PATIENCE));
    assert_eq!(
        w.next_msg(PATIENCE),
        Some(ControlMsg::Retiring {
            reason: RetireReason::MaxRequests,
            served: 2,
            in_flight: 1,
            own_memory: None
        })
    );
    let st = w.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(worker_exit::OK));
}

#[test]
fn sigterm_finishes_the_request_in_flight_then_exits_0() {
    let mut w = Worker::ready(config("slow", |_| {}));
    let mut c = w.connect();
    c.send("POST", "/", &[], slow(100_000).as_bytes());
    w.wait_in_flight(1);
    w.signal(libc::SIGTERM);
    // The worker says it stopped accepting with the request in flight…
    assert_eq!(
        w.next_msg(PATIENCE),
        Some(ControlMsg::Retiring {
            reason: RetireReason::Asked,
            served: 1,
            in_flight: 1,
            own_memory: None
        })
    );
    // …and finishes it.
    let r = c.read_response();
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"], json!([[100000.0]]));
    assert_eq!(r.pid(), w.pid());
    let st = w.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(0));
}

#[test]
fn sigint_exits_at_once() {
    // A graceful stop would wait 60 s for the request (which would run for minutes).
    let mut w = Worker::ready(config("slow", |c| {
        c["limits"]["graceful_timeout"] = ms(60_000)
    }));
    let mut c = w.connect();
    c.send("POST", "/", &[], slow(FOREVER).as_bytes());
    w.wait_in_flight(1);
    let t = Instant::now();
    w.signal(libc::SIGINT);
    let st = w.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(0));
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "INT waited like a graceful stop: {:?}",
        t.elapsed()
    );
    assert!(c.closed_by_server(PATIENCE));
}

#[test]
fn a_request_past_the_timeout_gets_504_and_the_worker_retires() {
    let mut w = Worker::ready(config("slow", |c| c["limits"]["request_timeout"] = ms(800)));
    // Two keep-alive connections while idle: B will be mid-request when A times out.
    let mut a = w.connect();
    assert_eq!(a.request("GET", "/healthz", "").status, 200);
    let mut b = w.connect();
    assert_eq!(b.request("GET", "/healthz", "").status, 200);

    // B's request is in flight (its body still on the way) before A's starts.
    let body = slow(1);
    let (head, tail) = body.as_bytes().split_at(5);
    b.send(
        "POST",
        "/",
        &[("Content-Length", &body.len().to_string())],
        head,
    );
    w.wait_in_flight(1);
    let t = Instant::now();
    a.send("POST", "/", &[], slow(FOREVER).as_bytes());

    let r = a.read_response();
    assert_eq!(r.status, 504, "{:?}", String::from_utf8_lossy(&r.body));
    assert!(
        r.error().contains("request timeout of 800 ms"),
        "{}",
        r.error()
    );
    assert_eq!(r.pid(), w.pid());
    // At the request timeout, not after the minutes the pass would take.
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(30),
        "{took:?}"
    );
    assert_eq!(
        w.next_msg(PATIENCE),
        Some(ControlMsg::Retiring {
            reason: RetireReason::RequestTimeout,
            served: 2,
            in_flight: 2,
            own_memory: None
        })
    );

    // The model thread is stuck: a request that arrives now is refused, not queued.
    use std::io::Write;
    b.stream.write_all(tail).unwrap();
    let r = b.read_response();
    assert_eq!(r.status, 503, "{:?}", String::from_utf8_lossy(&r.body));
    assert!(r.error().contains("did not run"), "{}", r.error());
    assert_eq!(r.header("retry-after"), Some("0"), "safe to retry at once");
    assert_eq!(r.pid(), w.pid());

    let st = w.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(0));
}

#[test]
fn a_busy_worker_leaves_new_connections_to_its_siblings() {
    let mut w = Worker::ready(config("slow", |_| {}));
    let mut a = w.connect();
    a.send("POST", "/", &[], slow(150_000).as_bytes());
    w.wait_in_flight(1);
    assert!(!a.has_data_now(), "A must still be running when B comes");
    // B waits in the listen queue until A's request is done: when B has its answer, A's
    // answer has already arrived.
    let r = w.get("/healthz");
    assert_eq!(r.status, 200);
    assert!(
        a.has_data_now(),
        "B was served while A's request was still running"
    );
    let ra = a.read_response();
    assert_eq!(ra.status, 200);
}

fn exits_with(start: Start, code: i32, needle: &str) -> String {
    let mut w = Worker::spawn(start);
    let st = w.wait_exit(PATIENCE);
    let log = w.log();
    assert_eq!(st.code(), Some(code), "{log}");
    assert!(log.contains(needle), "stderr {log:?} lacks {needle:?}");
    log
}

#[test]
fn model_load_failures_exit_3_naming_the_file() {
    let cfg = config("not-a-model", |_| {});
    let log = exits_with(
        Start {
            config: Some(cfg.to_string()),
            listen_fd: true,
        },
        worker_exit::MODEL_LOAD,
        "not-a-model.pt",
    );
    let line = log.lines().find(|l| l.contains("app-worker:")).unwrap();
    assert!(line.contains("cannot load model"), "{line}");

    let cfg = config("mlp", |c| c["model_path"] = json!("/nonexistent/model.pt"));
    exits_with(
        Start {
            config: Some(cfg.to_string()),
            listen_fd: true,
        },
        worker_exit::MODEL_LOAD,
        "cannot load model /nonexistent/model.pt: no such file",
    );
}

/// A worker told to run on a GPU (the master does so for every worker it placed on one)
/// that finds no CUDA exits 7, so that the master stops instead of serving on the CPU.
#[test]
fn a_gpu_worker_without_cuda_exits_7() {
    let cfg = config("mlp", |c| c["device"] = json!("cuda"));
    if !std::path::Path::new("/dev/nvidia0").exists() {
        exits_with(
            Start {
                config: Some(cfg.to_string()),
                listen_fd: true,
            },
            worker_exit::NO_CUDA,
            "this worker must run on a GPU, but libtorch sees no CUDA device",
        );
    }
}

/// `Ready` says where the model really runs: on the CPU, or on the CPU standing in for a
/// simulated GPU (`--simulated-gpus`).
#[test]
fn ready_names_the_device_the_model_runs_on() {
    for (simulated, want) in [(false, "cpu"), (true, "cpu (simulated GPU)")] {
        let cfg = config("mlp", |c| {
            if simulated {
                c["device"] = json!("cuda");
                c["simulated_gpu"] = json!(true);
            }
        });
        let mut w = Worker::spawn(Start {
            config: Some(cfg.to_string()),
            listen_fd: true,
        });
        match w.next_msg(Duration::from_secs(60)) {
            Some(ControlMsg::Ready { device, .. }) => assert_eq!(device, want),
            other => panic!("expected ready, got {other:?}\n{}", w.log()),
        }
        assert_eq!(w.post("/", MLP_REQ).status, 200);
    }
}

#[test]
fn bad_configuration_exits_2_with_one_clear_line() {
    exits_with(
        Start {
            config: None,
            listen_fd: true,
        },
        worker_exit::CONFIG,
        "VRAMFORK_WORKER_CONFIG is not set",
    );
    exits_with(
        Start {
            config: Some("{not json".into()),
            listen_fd: true,
        },
        worker_exit::CONFIG,
        "not a valid worker configuration",
    );
    let cfg = config("mlp", |c| c["torch_threads"] = json!(0));
    exits_with(
        Start {
            config: Some(cfg.to_string()),
            listen_fd: true,
        },
        worker_exit::CONFIG,
        "`torch_threads` must be at least 1",
    );
    let cfg = config("mlp", |_| {});
    exits_with(
        Start {
            config: Some(cfg.to_string()),
            listen_fd: false,
        },
        worker_exit::CONFIG,
        "LISTEN_FDS is not set",
    );
}

#[test]
fn a_silent_client_neither_stalls_the_worker_nor_outlives_the_header_deadline() {
    let w = Worker::ready(config("mlp", |_| {}));
    let mut silent = w.connect();
    let t = Instant::now();
    // A silent connection does not keep others waiting until its header deadline: another
    // client is served while the silent one is still open.
    assert_eq!(w.post("/", MLP_REQ).status, 200);
    assert!(
        !silent.has_data_now(),
        "the silent connection was closed before the other client was served"
    );
    assert!(
        silent.closed_by_server(PATIENCE),
        "a connection that sends nothing must be closed"
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(30),
        "closed after {took:?}, the header deadline is 10 s"
    );
    // The worker takes new connections again.
    assert_eq!(w.post("/", MLP_REQ).status, 200);
}

#[test]
fn a_request_waiting_for_the_model_past_max_queue_wait_is_refused_at_once() {
    let mut w = Worker::ready(config("slow", |c| c["limits"]["max_queue_wait"] = ms(300)));
    // Two keep-alive connections, both taken while the worker was idle.
    let mut a = w.connect();
    assert_eq!(a.request("GET", "/healthz", "").status, 200);
    let mut b = w.connect();
    assert_eq!(b.request("GET", "/healthz", "").status, 200);
    // A keeps the model busy for seconds; B waits behind it for the model.
    a.send("POST", "/", &[], slow(150_000).as_bytes());
    w.wait_in_flight(1);
    let r = b.request("POST", "/", &slow(1));
    assert_eq!(r.status, 503, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.error().contains("--max-queue-wait"), "{}", r.error());
    // At once: A is still running when B is refused.
    assert!(!a.has_data_now(), "B was answered only after A");
    let ra = a.read_response();
    assert_eq!(ra.status, 200);
}

#[test]
fn an_idle_keep_alive_connection_outlives_the_header_deadline() {
    let w = Worker::ready(config("mlp", |_| {}));
    let mut c = w.connect();
    assert_eq!(c.request("POST", "/", MLP_REQ).status, 200);
    // Idle past the 10 s a request head may take: still open (idle limit 60 s)…
    assert!(
        !c.closed_by_server(Duration::from_secs(12)),
        "an idle kept-alive connection was closed at the header deadline"
    );
    // …and it serves the next request.
    let r = c.request("POST", "/", MLP_REQ);
    assert_eq!((r.status, r.pid()), (200, w.pid()));
}

/// The request's X-Request-Id comes back on refusals too (here a 503 for waiting
/// past `--max-queue-wait`), and a worker makes one for a request that has none.
#[test]
fn request_ids_come_back_on_refusals_and_are_made_when_missing() {
    let mut w = Worker::ready(config("slow", |c| c["limits"]["max_queue_wait"] = ms(300)));
    let mut a = w.connect();
    assert_eq!(a.request("GET", "/healthz", "").status, 200);
    let mut b = w.connect();
    let made = b.request("GET", "/healthz", "");
    let made = made.header("x-request-id").expect("a made id").to_string();
    assert!(
        made.len() == 32 && made.bytes().all(|c| c.is_ascii_hexdigit()),
        "{made}"
    );
    a.send(
        "POST",
        "/",
        &[("X-Request-Id", "busy-1")],
        slow(150_000).as_bytes(),
    );
    w.wait_in_flight(1);
    b.send(
        "POST",
        "/",
        &[("X-Request-Id", "queued-2")],
        slow(1).as_bytes(),
    );
    let r = b.read_response();
    assert_eq!(r.status, 503, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-request-id"), Some("queued-2"));
    let ra = a.read_response();
    assert_eq!(
        (ra.status, ra.header("x-request-id")),
        (200, Some("busy-1"))
    );
}
