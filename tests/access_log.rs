//! The access log: the real `app` with `--access-log`, its lines read from its
//! JSON log output. One line per answered request with what the request did; nothing
//! without the flag; lines of a worker that retires are not lost; and a stderr nobody reads
//! never makes a request wait: lines are dropped and counted in `/metrics` instead.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{app_bin, free_port, raw, App, Event, KeepAlive, Server, PATIENCE};

const INPUT: &str = r#"{"inputs": [[0.5, -1.0, 2.0, 0.25]]}"#;

fn with_id(id: &str) -> String {
    format!("X-Request-Id: {id}\r\n")
}

/// Every access line so far (workers write them: not among the master's events).
fn access_lines(s: &Server) -> Vec<Event> {
    s.all_events()
        .into_iter()
        .filter(|e| e.name == "access")
        .collect()
}

/// The access line of request `id` (waiting for it).
fn line_of(s: &Server, id: &str) -> Event {
    s.poll(&format!("the access line of {id}"), || {
        access_lines(s)
            .into_iter()
            .find(|e| e.str("request_id") == Some(id))
    })
}

#[test]
fn every_answer_gets_one_line_with_what_the_request_did() {
    let app = App::new(
        "mlp.pt",
        r#""input": {"shape": [-1, 4], "dtype": "float32"}"#,
    );
    let s = Server::start(&app, &["--production", "--workers", "1", "--access-log"]);
    s.wait_workers(1);
    let ok = raw(
        s.port,
        "POST",
        "/?hwFetch=true",
        &with_id("ok-1"),
        INPUT.as_bytes(),
    );
    assert_eq!(ok.status, 200);
    let bad_body = br#"{"inputs": [[1, 2]]}"#;
    let bad = raw(s.port, "POST", "/", &with_id("bad-2"), bad_body);
    assert_eq!(bad.status, 400);
    let lost = raw(s.port, "GET", "/nowhere", &with_id("lost-3"), b"");
    assert_eq!(lost.status, 404);
    let v2 = r#"{"inputs": [{"name": "input__0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}"#;
    let infer = "/v2/models/test%20app/infer";
    let v = raw(s.port, "POST", infer, &with_id("v2-4"), v2.as_bytes());
    assert_eq!(v.status, 200);

    let pid: u64 = ok.header("x-worker-pid").unwrap().parse().unwrap();
    let cases = [
        (
            "ok-1",
            "POST",
            "/?hwFetch=true",
            200,
            INPUT.len(),
            ok.body.len(),
            true,
        ),
        (
            "bad-2",
            "POST",
            "/",
            400,
            bad_body.len(),
            bad.body.len(),
            false,
        ),
        ("lost-3", "GET", "/nowhere", 404, 0, lost.body.len(), false),
        ("v2-4", "POST", infer, 200, v2.len(), v.body.len(), true),
    ];
    for (id, method, path, status, bytes_in, bytes_out, ran) in cases {
        let e = line_of(&s, id);
        let what = format!("{id}: {:?}", e.fields);
        assert_eq!(e.target, "vramfork::access", "{what}");
        assert_eq!(e.str("method"), Some(method), "{what}");
        assert_eq!(e.str("path"), Some(path), "{what}");
        assert_eq!(e.u64("status"), Some(status), "{what}");
        assert_eq!(e.u64("bytes_in"), Some(bytes_in as u64), "{what}");
        assert_eq!(e.u64("bytes_out"), Some(bytes_out as u64), "{what}");
        assert_eq!(
            (e.u64("slot"), e.u64("pid")),
            (Some(0), Some(pid)),
            "{what}"
        );
        let total = e.f64("total_ms").unwrap();
        assert!(total > 0.0, "{what}");
        if ran {
            let (wait, model) = (e.f64("wait_ms").unwrap(), e.f64("model_ms").unwrap());
            assert!(model > 0.0 && wait >= 0.0, "{what}");
            assert!(wait + model <= total + 0.01, "{what}");
            assert_eq!(e.u64("batch"), Some(1), "{what}");
        } else {
            assert!(e.fields["model_ms"].is_null(), "{what}");
            assert_eq!(e.u64("batch"), Some(0), "{what}");
        }
    }
    // One line per answer.
    assert_eq!(access_lines(&s).len(), cases.len());
}

#[test]
fn no_lines_without_the_flag() {
    let app = App::new("mlp.pt", "");
    let mut s = Server::start(&app, &["--production", "--workers", "1"]);
    s.wait_workers(1);
    for _ in 0..3 {
        assert_eq!(raw(s.port, "POST", "/", "", INPUT.as_bytes()).status, 200);
    }
    s.signal(libc::SIGTERM);
    assert!(s.wait_exit(PATIENCE).success());
    // The output has ended (every process gone): anything logged is in it.
    assert!(
        s.events_named("worker_exited").len() == 1,
        "{}",
        s.log_text()
    );
    assert!(
        s.all_events().iter().any(|e| e.name == "ready"),
        "the workers' own lines are read: {}",
        s.log_text()
    );
    assert!(access_lines(&s).is_empty(), "{}", s.log_text());
}

/// A worker that retires after its last request writes that request's line before it
/// exits: the master reaps it only after, so the line is in the output by the time
/// `worker_exited` is.
#[test]
fn a_retiring_workers_last_lines_are_written() {
    let app = App::new("mlp.pt", "");
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1", "--max-requests", "3"],
        &[("VRAMFORK_ACCESS_LOG", "1")],
    );
    s.wait_workers(1);
    let mut c = KeepAlive::new(s.port);
    for _ in 0..3 {
        let r = c.post("/", INPUT).unwrap();
        assert_eq!(r.status, 200, "{r:?}");
    }
    let exited = s.wait_event("worker_exited", |_| true);
    let pid = exited.u64("pid").unwrap();
    let lines: Vec<Event> = access_lines(&s)
        .into_iter()
        .filter(|e| e.u64("pid") == Some(pid))
        .collect();
    assert_eq!(lines.len(), 3, "{}", s.log_text());
}

/// stderr is a pipe nobody reads: once it is full, the access log's writer waits and its
/// buffer fills; requests are still answered, and the lines that could not be kept are
/// dropped and counted in `/metrics`.
#[test]
fn a_stderr_nobody_reads_never_holds_a_request() {
    let app = App::new("mlp.pt", "");
    let port = free_port();
    let metrics = free_port();
    let mut child = Command::new(app_bin())
        .arg("--metadata")
        .arg(app.metadata())
        .args(["--production", "--workers", "1", "--access-log"])
        .args([
            "--port",
            &port.to_string(),
            "--metrics-port",
            &metrics.to_string(),
        ])
        .current_dir(app.dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // Only errors besides the access log, so that nothing else needs the pipe.
        .env("VRAMFORK_LOG", "error")
        .env("VRAMFORK_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // Held, never read.
    let stderr = child.stderr.take().unwrap();
    let stop = |child: &mut std::process::Child| {
        // SAFETY: kill(2) on the process group this test started.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.wait();
    };
    let deadline = Instant::now() + PATIENCE;
    while common::try_http(port, "GET", "/healthz", None).map_or(true, |r| r.status != 200) {
        if Instant::now() > deadline {
            stop(&mut child);
            panic!("never answered /healthz");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // More answers than the pipe (64 KiB, a few hundred lines) and the buffer can hold.
    let n = vramfork_access_log_capacity() + 2_000;
    let mut c = KeepAlive::new(port);
    for i in 0..n {
        let r = c.post("/", INPUT).unwrap_or_else(|e| {
            stop(&mut child);
            panic!("request {i}: {e}")
        });
        assert_eq!(r.status, 200);
    }
    // The count reaches the master with the heartbeats.
    let dropped = loop {
        let text = scrape(metrics);
        let v = text
            .lines()
            .find_map(|l| l.strip_prefix("vramfork_access_log_dropped_total "))
            .map(|v| v.trim().parse::<f64>().unwrap());
        match v {
            Some(v) if v > 0.0 => break v,
            _ if Instant::now() > deadline + PATIENCE => {
                stop(&mut child);
                panic!("no drops counted:\n{text}");
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    stop(&mut child);
    // What was kept was written in whole lines: read what the pipe holds.
    let mut held = String::new();
    let _ = BufReader::new(stderr).read_to_string(&mut held);
    let lines: Vec<&str> = held.lines().collect();
    assert!(!lines.is_empty());
    for l in &lines {
        let e = Event::parse(l).unwrap_or_else(|| panic!("not a whole line: {l:?}"));
        assert_eq!(e.name, "access");
    }
    assert!(
        dropped as usize + lines.len() <= n,
        "{dropped} dropped + {} written > {n}",
        lines.len()
    );
}

/// The buffer's capacity (`worker/src/observe/access_log.rs`).
fn vramfork_access_log_capacity() -> usize {
    16_384
}

fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    common::parse_response(&raw).unwrap().body
}

/// W3C Trace Context: a request's `traceparent` is continued on
/// its answer (the same trace id and flags, this worker's own span id) and its trace id
/// written in its access line — on HTTP and gRPC alike; a request without one, or with one
/// that is not valid, gets a new unsampled trace, never a refusal.
#[test]
fn a_traceparent_is_continued_on_the_answer_and_written_in_the_access_line() {
    let app = App::new(
        "mlp.pt",
        r#""input": {"shape": [-1, 4], "dtype": "float32"}"#,
    );
    let s = Server::start(&app, &["--production", "--workers", "1", "--access-log"]);
    s.wait_workers(1);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = format!("00-{trace}-00f067aa0ba902b7-01");
    let extra = format!("{}traceparent: {caller}\r\n", with_id("traced-1"));
    let r = raw(s.port, "POST", "/", &extra, INPUT.as_bytes());
    assert_eq!(r.status, 200);
    let back = r
        .header("traceparent")
        .expect("a traceparent on the answer");
    assert!(
        back.starts_with(&format!("00-{trace}-")) && back.ends_with("-01") && back != caller,
        "{back}"
    );
    assert_eq!(line_of(&s, "traced-1").str("trace_id"), Some(trace));
    // None, or one that is not valid: a new trace, not sampled, in the line too.
    for (id, header) in [
        ("untraced-2", String::new()),
        (
            "bad-trace-3",
            "traceparent: 00-not-a-trace-01\r\n".to_string(),
        ),
    ] {
        let r = raw(
            s.port,
            "POST",
            "/",
            &(with_id(id) + &header),
            INPUT.as_bytes(),
        );
        assert_eq!(r.status, 200, "{id}");
        let back = r
            .header("traceparent")
            .expect("a traceparent on the answer");
        let fields: Vec<&str> = back.split('-').collect();
        assert_eq!((fields.len(), fields[3]), (4, "00"), "{back}");
        assert_eq!(fields[1].len(), 32, "{back}");
        assert_ne!(fields[1], trace);
        assert_eq!(line_of(&s, id).str("trace_id"), Some(fields[1]));
    }
    // gRPC: the same in its metadata (a call the server answers with an error still carries
    // it).
    let url = format!("127.0.0.1:{}", s.port);
    let got = common::python_json(
        "grpc_raw.py",
        &[
            &url,
            "/inference.GRPCInferenceService/ModelInfer",
            "application/grpc",
            &format!("traceparent={caller}"),
            "x-request-id=grpc-traced-4",
        ],
        b"",
    );
    let back = got["headers"]["traceparent"].as_str().unwrap_or_default();
    assert!(back.starts_with(&format!("00-{trace}-")), "{got}");
    assert_eq!(line_of(&s, "grpc-traced-4").str("trace_id"), Some(trace));
}
