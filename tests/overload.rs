//! Process tests of `app --production` under crowds and slow clients (issue: fair service,
//! bounded waits, clear refusals, nothing lost on reload): the real binary, real models,
//! HTTP over loopback. Every loop is bounded in count and time.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// A slow.pt body running `n` iterations (~22 µs each on an idle build machine).
fn slow(n: u64) -> String {
    format!(r#"{{"inputs": [[{n}]]}}"#)
}

/// Keep-alive clients never starve each other: with more clients than workers, every client
/// gets answers, and none gets more than three times the mean.
#[test]
fn keep_alive_clients_are_served_in_turn() {
    let app = App::new("slow.pt", "");
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    s.wait_workers(2);
    let (clients, total) = (24, 480);
    let answered = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + PATIENCE;
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (port, answered) = (s.port, Arc::clone(&answered));
            thread::spawn(move || {
                let mut c = KeepAlive::new(port);
                let (mut ok, mut failed) = (0usize, Vec::new());
                while answered.load(Ordering::SeqCst) < total && Instant::now() < deadline {
                    match c.post("/", &slow(100)) {
                        Ok(r) if r.status == 200 => {
                            ok += 1;
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        other => failed.push(format!("{other:?}")),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let results: Vec<(usize, Vec<String>)> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    let counts: Vec<usize> = results.iter().map(|r| r.0).collect();
    let failed: Vec<&String> = results.iter().flat_map(|r| &r.1).collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        answered.load(Ordering::SeqCst) >= total,
        "only {answered:?} answers"
    );
    let mean = counts.iter().sum::<usize>() as f64 / clients as f64;
    let max = *counts.iter().max().unwrap();
    assert!(
        counts.iter().all(|&c| c > 0),
        "a client got no answer: {counts:?}"
    );
    assert!(
        max as f64 <= 3.0 * mean,
        "answers per client {counts:?}: max {max} > 3 × mean {mean:.1}"
    );
}

/// A request that waited past --max-queue-wait is refused at once with 503 and Retry-After,
/// without running; the others are served.
#[test]
fn requests_past_max_queue_wait_are_refused_with_retry_after() {
    let app = App::new("slow.pt", "");
    // One torch thread: two make slow.pt crawl on a machine busy with other tests.
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--max-queue-wait",
            "1",
            "--torch-threads",
            "1",
        ],
    );
    s.wait_workers(1);
    // Ten clients at once, each request ~0.4 s of model time: the later ones wait seconds.
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let port = s.port;
            thread::spawn(move || try_http(port, "POST", "/", Some(&slow(18_000))))
        })
        .collect();
    let answers: Vec<Response> = handles
        .into_iter()
        .map(|h| h.join().unwrap().expect("every request is answered"))
        .collect();
    let ok = answers.iter().filter(|r| r.status == 200).count();
    let refused: Vec<&Response> = answers.iter().filter(|r| r.status == 503).collect();
    assert_eq!(ok + refused.len(), 10, "{answers:?}");
    assert!(ok >= 1, "{answers:?}");
    assert!(!refused.is_empty(), "nothing was refused: {answers:?}");
    for r in refused {
        assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
        let e = r.json()["error"].as_str().unwrap().to_string();
        assert!(
            e.contains("--max-queue-wait") && e.contains("did not run"),
            "{e}"
        );
    }
}

/// A body that takes longer to arrive than --max-queue-wait is not an overload: an idle
/// worker answers it (the wait counts the listen and model queues, not the upload). Found by
/// the bounded-parsing tests: an idle worker refused such uploads with "overloaded".
#[test]
fn a_slow_upload_to_an_idle_worker_is_not_refused_as_overloaded() {
    let app = App::new("mlp.pt", "");
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--max-queue-wait", "1"],
    );
    s.wait_workers(1);
    let body = MLP_INPUT.as_bytes();
    // Six slow clients (before the fix, 5 of 6 such uploads got 503 "overloaded"; one alone
    // sometimes slipped through).
    let conns: Vec<std::net::TcpStream> = (0..6)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            write!(
                c,
                "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .unwrap();
            c.write_all(&body[..body.len() - 1]).unwrap();
            c
        })
        .collect();
    // The clients are slow: their last byte comes after more than --max-queue-wait.
    thread::sleep(Duration::from_millis(1_500));
    let answers: Vec<Response> = conns
        .into_iter()
        .map(|mut c| {
            c.write_all(&body[body.len() - 1..]).unwrap();
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut c, &mut got).unwrap();
            parse_response(&got).unwrap()
        })
        .collect();
    for r in &answers {
        assert_eq!(r.status, 200, "{r:?}");
    }
}

/// Connections that send half a request, and bodies that drip, cost a worker nothing: a
/// normal client is answered while they are all still open and unanswered.
#[test]
fn slow_and_silent_clients_do_not_hold_a_worker() {
    let app = App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#);
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    s.wait_workers(1);
    let half_open: Vec<_> = (0..300)
        .map(|_| connect_and_send(s.port, b"POST / HT"))
        .collect();
    let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{";
    let drips: Vec<_> = (0..2)
        .map(|_| connect_and_send(s.port, head.as_bytes()))
        .collect();
    // The drips go on, a byte at a time, while the test runs.
    let stop = Arc::new(AtomicBool::new(false));
    let dripper = {
        let mut streams: Vec<_> = drips.iter().map(|d| d.try_clone().unwrap()).collect();
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            for _ in 0..40 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                for d in &mut streams {
                    let _ = d.write_all(b" ");
                }
                thread::sleep(Duration::from_millis(250));
            }
        })
    };
    for _ in 0..5 {
        let r = s.post("/", MLP_INPUT);
        assert_eq!(r.status, 200, "{r:?}");
    }
    let closed = half_open.iter().filter(|c| !nothing_from_server(c)).count();
    assert_eq!(
        closed, 0,
        "half-open connections were closed (their deadline passed) before a normal client was served"
    );
    assert!(
        drips.iter().all(nothing_from_server),
        "a dripping body was answered before the normal client"
    );
    stop.store(true, Ordering::SeqCst);
    dripper.join().unwrap();
}

/// HUPs under keep-alive clients lose no request, and no reload runs more than one worker
/// beyond the plan.
#[test]
fn reloads_under_keep_alive_clients_lose_nothing() {
    let app = App::new("mlp.pt", r#""version": "0""#);
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    s.wait_workers(2);
    let monitor = WorkerCountMonitor::start(s.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (port, stop, outcomes) = (s.port, Arc::clone(&stop), Arc::clone(&outcomes));
            thread::spawn(move || {
                let mut c = KeepAlive::new(port);
                let deadline = Instant::now() + Duration::from_secs(300);
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    let r = c
                        .post("/", MLP_INPUT)
                        .map(|r| r.status)
                        .map_err(|e| e.to_string());
                    outcomes.lock().unwrap().push(r);
                }
            })
        })
        .collect();
    for v in 1..=5 {
        let mark = s.mark();
        app.write_metadata("mlp.pt", &format!(r#""version": "{v}""#));
        s.signal(libc::SIGHUP);
        s.wait_event_after(mark, "reload_complete", |_| true);
    }
    s.wait_workers(2);
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let max = monitor.finish();
    let outcomes = outcomes.lock().unwrap();
    let failed: Vec<_> = outcomes.iter().filter(|o| !matches!(o, Ok(200))).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        outcomes.len()
    );
    assert!(outcomes.len() > 100, "{}", outcomes.len());
    assert!(max <= 3, "{max} worker processes for a plan of 2");
    let most = s.max_pool_processes();
    assert!(most <= 3, "the master had {most} workers for a plan of 2");
    assert_eq!(s.get("/").json()["version"], "5");
}

/// HUPs that come while a reload runs supersede it: the newest configuration wins, and the
/// worker count never goes past the plan plus one.
#[test]
fn a_hup_during_a_reload_supersedes_it() {
    let app = App::new("mlp.pt", r#""version": "0""#);
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    s.wait_workers(2);
    let monitor = WorkerCountMonitor::start(s.pid());
    let mut last_start = 0;
    for v in 1..=10 {
        let mark = s.mark();
        app.write_metadata("mlp.pt", &format!(r#""version": "{v}""#));
        s.signal(libc::SIGHUP);
        // The master has taken this HUP before the next one comes.
        last_start = s.wait_event_after(mark, "reload_started", |_| true).0;
    }
    s.wait_event_after(last_start, "reload_complete", |_| true);
    let workers = s.wait_workers(2);
    let max = monitor.finish();
    assert!(max <= 3, "{max} worker processes for a plan of 2");
    let most = s.max_pool_processes();
    assert!(most <= 3, "the master had {most} workers for a plan of 2");
    for _ in 0..4 {
        let r = s.get("/");
        assert_eq!(r.json()["version"], "10", "{r:?}");
        assert!(workers.contains(&r.pid()));
    }
    // Nothing failed to boot: superseded boots were stopped, not counted as failures.
    let failed: Vec<_> = s
        .events_named("worker_exited")
        .into_iter()
        .filter(|e| e.str("phase") == Some("booting") && e.str("killed") != Some("superseded"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
}

/// When a request gets stuck past --request-timeout, a request queued behind it in the same
/// worker never ran: it gets 503 with Retry-After: 0 (safe to retry), not 504.
#[test]
fn requests_queued_behind_a_stuck_one_get_503_not_504() {
    let app = App::new("slow.pt", "");
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--request-timeout", "3"],
    );
    let first = s.wait_workers(1);
    // Two connections to the one worker, kept alive.
    let mut a = KeepAlive::new(s.port);
    let mut b = KeepAlive::new(s.port);
    assert_eq!(a.request("GET", "/healthz", "").unwrap().status, 200);
    assert_eq!(b.request("GET", "/healthz", "").unwrap().status, 200);
    let stuck = thread::spawn(move || a.post("/", &slow(10_000_000)));
    s.wait_event("pool", |e| e.u64("in_flight") == Some(1));
    let r = b.post("/", &slow(1)).expect("answered");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("retry-after"), Some("0"), "{r:?}");
    assert_eq!(r.pid(), first[0]);
    assert!(
        r.json()["error"].as_str().unwrap().contains("did not run"),
        "{r:?}"
    );
    let r = stuck.join().unwrap().expect("answered");
    assert_eq!(r.status, 504, "{r:?}");
    let now = s.wait_workers_where(1, |p| p != first);
    assert_eq!(s.post("/", &slow(1)).pid(), now[0]);
}

/// A worker's memory for a large JSON body is about the body and its tensor (not a tree of
/// JSON values), and goes back near where it was once the request is answered.
#[test]
fn a_large_body_costs_about_its_tensor_and_memory_comes_back() {
    let app = App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#);
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--max-body-mb", "8"],
    );
    let pid = s.wait_workers(1)[0];
    // Warm up the large-body path (parsed off the event loop) with a 200 kB body.
    let warm = format!(
        r#"{{"inputs": [{}[1,2,3,4]]}}"#,
        "[0,0,0,0],".repeat(20_000)
    );
    assert_eq!(s.post("/", &warm).status, 200);
    let (rss0, hwm0) = memory_mb(pid);
    // The densest float body (two bytes a number), ragged at its very end: refused (400)
    // only after every number was parsed.
    let rows = (7 << 20) / 10;
    let mut bad = String::from(r#"{"inputs": ["#);
    bad.push_str(&"[0,0,0,0],".repeat(rows));
    bad.push_str("[1,2,3]]}");
    let body_mb = bad.len() as f64 / f64::from(1 << 20);
    let r = s.post("/", &bad);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("inputs["), "{r:?}");
    let (_, hwm1) = memory_mb(pid);
    assert!(
        hwm1 - hwm0 <= 3.0 * body_mb,
        "peak grew by {:.0} MB for a {body_mb:.1} MB body",
        hwm1 - hwm0
    );
    // A valid large request: answered, and the worker's memory comes back.
    let good = bad.replace(",[1,2,3]]}", "]}");
    let r = s.post("/", &good);
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(200)]);
    assert_eq!(r.pid(), pid);
    let (rss2, _) = memory_mb(pid);
    eprintln!(
        "body {body_mb:.1} MB: peak +{:.1} MB, resident {rss0:.1} -> {rss2:.1} MB",
        hwm1 - hwm0
    );
    assert!(
        rss2 <= rss0 + body_mb,
        "resident {rss2:.0} MB after the request, {rss0:.0} MB before"
    );
}

/// Bodies with named inputs (`POST /` with several inputs) and v2 JSON bodies are read in one
/// pass too, not as a tree of JSON values (which costs about 80 bytes an element, some 40×
/// these bodies): a worker's peak grows by about the body and its tensors.
#[test]
fn large_named_and_v2_json_bodies_cost_about_their_tensors() {
    let app = App::pair();
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--max-body-mb", "8"],
    );
    let pid = s.wait_workers(1)[0];
    let v2 = "/v2/models/test%20app/infer";
    // Warm up both paths with small valid bodies.
    let named = |rows: usize, tail: &str| {
        format!(
            r#"{{"inputs": {{"features": [{}[1,2,3]{tail}], "scale": [{}1]}}}}"#,
            "[0,0,0],".repeat(rows),
            "0,".repeat(rows)
        )
    };
    let v2_body = |rows: usize, said: usize| {
        format!(
            r#"{{"inputs": [{{"name": "features", "shape": [{said}, 3], "datatype": "FP32", "data": [{}1,2,3]}}, {{"name": "scale", "shape": [{}], "datatype": "INT64", "data": [{}1]}}]}}"#,
            "0,0,0,".repeat(rows),
            rows + 1,
            "0,".repeat(rows)
        )
    };
    let r = s.post("/", &named(1000, ""));
    assert_eq!(r.status, 200, "{r:?}");
    let r = s.post(v2, &v2_body(1000, 1001));
    assert_eq!(r.status, 200, "{r:?}");
    // About 7 MB each, refused only once every element was read: a ragged last row (named),
    // a shape that says one row more than the data holds (v2).
    let rows = (7 << 20) / 10;
    for (path, body, want) in [
        ("/", named(rows, ",[1,2]"), "ragged array"),
        (
            v2,
            v2_body(rows, rows + 2),
            &format!("shape [{}, 3] takes", rows + 2),
        ),
    ] {
        // Resets the peak (VmHWM) to what is resident now.
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
        let (rss0, hwm0) = memory_mb(pid);
        let body_mb = body.len() as f64 / f64::from(1 << 20);
        let r = s.post(path, &body);
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.body.contains(want), "{path}: {r:?}");
        let (rss1, hwm1) = memory_mb(pid);
        eprintln!(
            "{path}: body {body_mb:.1} MB, peak +{:.1} MB, resident after the refusal {:+.1} MB",
            hwm1 - hwm0,
            rss1 - rss0
        );
        // A refused body is given back like an answered one (the trim after an unusually
        // large body ran only after answers before).
        assert!(
            rss1 - rss0 <= 0.5 * body_mb,
            "{path}: {:.1} MB stayed resident after refusing a {body_mb:.1} MB body",
            rss1 - rss0
        );
        assert!(
            hwm1 - hwm0 <= 3.0 * body_mb,
            "{path}: peak grew by {:.0} MB for a {body_mb:.1} MB body",
            hwm1 - hwm0
        );
        assert_eq!(r.pid(), pid);
    }
    // The same sizes, valid: answered.
    let r = s.post("/", &named(rows, ""));
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(200)]);
    let r = s.post(v2, &v2_body(rows, rows + 1));
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(200)]);
}

/// (VmRSS, VmHWM) of a process, in MB.
fn memory_mb(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {k} in {status}"))
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Every request gets its answer, also from a client that shuts its sending side once the
/// request is out (as fuzzers and some clients do), and with a malformed chunk extension (a
/// control character, which hyper skips as RFC 9112 lets a recipient ignore extensions: the
/// body that follows decides the answer).
#[test]
fn half_closed_and_malformed_chunked_requests_always_get_an_answer() {
    let app = App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#);
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    let workers = s.wait_workers(2);
    let chunked = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1 ; a=\x01\r\nx\r\n0\r\n\r\n";
    let valid = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{MLP_INPUT}",
        MLP_INPUT.len()
    );
    let mut statuses = BTreeMap::new();
    for i in 0..300 {
        let (req, half_close) = match i % 3 {
            0 => (&chunked[..], false),
            1 => (&chunked[..], true),
            _ => (valid.as_bytes(), true),
        };
        let mut c = connect_and_send(s.port, req);
        if half_close {
            c.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let r = read_one(&mut c)
            .map(|r| r.status)
            .map_err(|e| e.to_string());
        *statuses.entry(format!("{r:?}")).or_insert(0) += 1;
    }
    assert_eq!(
        statuses,
        BTreeMap::from([("Ok(200)".to_string(), 100), ("Ok(400)".to_string(), 200)]),
        "every try answered"
    );
    assert_eq!(s.wait_workers(2), workers, "no worker died of it");
}
