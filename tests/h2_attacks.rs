//! Attacks on the serving port's HTTP/2 (and HTTP/1.1), as public h2 servers are attacked,
//! by clients written with the Python h2 library (`tests/support/h2_attacks.py`)
//! against the real `app --production`: clients that never read their answers are dropped
//! and their memory returned; a WINDOW_UPDATE flood gets GOAWAY `ENHANCE_YOUR_CALM` (the
//! control-frame budget of the vendored h2) while a normal client is served, and Rapid Reset
//! too (h2's reset limit); such closes are counted in `/metrics` and logged at most once per
//! interval with their count, never by h2 itself.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{App, KeepAlive, Server, MLP_INPUT};
use serde_json::Value;

fn attacks(args: &[&str]) -> Value {
    common::python_json("h2_attacks.py", args, b"")
}

/// The resident memory of these processes together, in MB.
fn rss_mb(pids: &[u32]) -> f64 {
    pids.iter()
        .map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no VmRSS in {status}"))
                / 1024.0
        })
        .sum()
}

/// A counter's value in the master's `/metrics` (0 while it has no row).
fn counter(port: u16, row: &str) -> u64 {
    let body = common::http(port, "GET", "/metrics", None).body;
    body.lines()
        .find_map(|l| l.strip_prefix(row))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

/// 10 HTTP/2 connections with a zero window park 50 answers of about 90 kB each; 2 HTTP/1.1
/// connections pipeline 200 such requests (16 MB of answers, more than the sockets'
/// buffers hold) and read nothing. The worker drops all of them once
/// they have taken nothing for the keep-alive idle limit (`UNREAD`), counts them, hands the
/// memory back, and serves on.
#[test]
fn clients_that_read_nothing_are_dropped_and_their_memory_returned() {
    let app = App::new("mlp.pt", "");
    let s = Server::start(
        &app,
        &["--production", "--workers", "2", "--metrics-port", "0"],
    );
    let pids = s.wait_workers(2);
    let rows = 2000;
    let body = format!(
        r#"{{"inputs": [{}]}}"#,
        vec!["[1.5, 2.25, -3.125, 4.0625]"; rows].join(",")
    );
    // Each worker's working set for such requests, before the baseline: until each has
    // answered four (which worker takes a request is the kernel's and the load's call; a
    // worker that had answered none would keep its working set after the attack, above a
    // baseline taken without it).
    let mut answered = std::collections::HashMap::new();
    for _ in 0..400 {
        if pids
            .iter()
            .all(|p| answered.get(p).copied().unwrap_or(0) >= 4)
        {
            break;
        }
        let r = s.post("/", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        *answered.entry(r.pid()).or_insert(0) += 1;
    }
    assert!(
        pids.iter()
            .all(|p| answered.get(p).copied().unwrap_or(0) >= 4),
        "each worker answers: {answered:?}"
    );
    let baseline = rss_mb(&pids);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/h2_attacks.py");
    let url = format!("127.0.0.1:{}", s.port);
    let mut child = Command::new(common::python())
        .arg(script)
        .args([
            "unread",
            &url,
            "10",
            "2",
            "50",
            "200",
            &rows.to_string(),
            "240",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut line = || lines.next().expect("the attack's output").unwrap();
    assert_eq!(line(), "parked");
    let parked = rss_mb(&pids);
    assert_eq!(line(), "h2 closed");
    // The HTTP/1.1 connections, which it has not read yet, are closed too.
    let port = s.metrics_port();
    s.poll("12 unread closes in /metrics", || {
        (counter(
            port,
            r#"vramfork_connections_closed_total{reason="unread"}"#,
        ) >= 12)
            .then_some(())
    });
    writeln!(child.stdin.take().unwrap(), "read").unwrap();
    let last = line();
    assert!(child.wait().unwrap().success());
    let r: Value = serde_json::from_str(&last).unwrap();
    for c in r["h2"].as_array().unwrap() {
        assert_eq!(c["heads"], 50, "every answer was made and parked: {r}");
        assert_eq!(c["data"], 0, "{r}");
        assert_eq!(c["statuses"], serde_json::json!(["200"]), "{r}");
        assert!(c["closed"].is_string(), "the worker closed it: {r}");
    }
    for c in r["h1"].as_array().unwrap() {
        assert!(c["end"].is_string(), "{r}");
        assert!(
            c["answers"].as_u64().unwrap() < 200,
            "cut off before its answers were all out: {r}"
        );
    }
    // The answers were parked in the workers, and went back with their connections.
    assert!(
        parked > baseline + 20.0,
        "the attack parked little: {baseline:.0} MB → {parked:.0} MB"
    );
    s.poll("the workers' memory back near its baseline", || {
        (rss_mb(&pids) < baseline + 10.0).then_some(())
    });
    let e = s.poll("a worker's connections_closed line", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "connections_closed" && e.u64("unread") > Some(0))
    });
    assert_eq!(e.level, "WARN");
    assert_eq!(s.ready_pids(), pids, "no worker died");
    let ok = s.post("/", MLP_INPUT);
    assert_eq!(ok.status, 200, "{}", ok.body);
    eprintln!(
        "RSS of the 2 workers: {baseline:.0} MB before, {parked:.0} MB parked, {:.0} MB after; {r}",
        rss_mb(&pids)
    );
}

/// 20 connections flood WINDOW_UPDATE(+1) frames while a normal client posts on its own
/// connection: each flooder gets GOAWAY `ENHANCE_YOUR_CALM` ("too_many_control_frames"),
/// the normal client's requests all succeed, the closes are counted in `/metrics`, and the
/// log has fewer lines about them than closes (one per worker at most per 10 s, with the
/// counts), never one per connection.
#[test]
fn a_window_update_flood_gets_goaway_enhance_your_calm_and_the_log_one_line_per_interval() {
    let app = App::new("mlp.pt", "");
    let s = Server::start(
        &app,
        &["--production", "--workers", "2", "--metrics-port", "0"],
    );
    let pids = s.wait_workers(2);
    let port = s.port;
    let stop = Arc::new(AtomicBool::new(false));
    let normal = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = KeepAlive::new(port);
            let mut served = 0u64;
            while !stop.load(Ordering::SeqCst) || served == 0 {
                let r = c.post("/", MLP_INPUT).expect("the normal client's request");
                assert_eq!(r.status, 200, "{}", r.body);
                served += 1;
            }
            served
        })
    };
    let url = format!("127.0.0.1:{port}");
    let flooders = 20;
    let r = attacks(&["window-flood", &url, &flooders.to_string(), "60"]);
    stop.store(true, Ordering::SeqCst);
    let served = normal.join().unwrap();
    for c in r["conns"].as_array().unwrap() {
        assert_eq!(c["goaway"]["name"], "ENHANCE_YOUR_CALM", "{r}");
        assert_eq!(c["goaway"]["debug"], "too_many_control_frames", "{r}");
    }
    let metrics = s.metrics_port();
    s.poll("the flood's closes in /metrics", || {
        (counter(
            metrics,
            r#"vramfork_connections_closed_total{reason="abuse"}"#,
        ) >= flooders)
            .then_some(())
    });
    // Every close is in the log's counts, in fewer lines than closes.
    let lines = s.poll("the log's count of every close", || {
        let lines: Vec<_> = s
            .all_events()
            .into_iter()
            .filter(|e| e.name == "connections_closed")
            .collect();
        let counted: u64 = lines.iter().filter_map(|e| e.u64("abuse")).sum();
        (counted == flooders).then_some(lines)
    });
    assert!(
        (lines.len() as u64) < flooders,
        "{} log lines for {flooders} closes",
        lines.len()
    );
    assert!(lines.iter().all(|e| e.level == "WARN"));
    assert_eq!(s.ready_pids(), pids, "no worker died");
    eprintln!(
        "normal client: {served} requests beside the flood; log lines: {}; {r}",
        lines.len()
    );
}

/// Rapid Reset (CVE-2023-44487): streams opened and reset at once end with GOAWAY
/// `ENHANCE_YOUR_CALM` from h2's limit on streams reset before they are answered, counted as
/// abuse, with no WARN line of h2's own; the worker serves on.
#[test]
fn rapid_reset_gets_goaway_enhance_your_calm_counted_as_abuse() {
    let app = App::new("mlp.pt", "");
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--metrics-port", "0"],
    );
    let pids = s.wait_workers(1);
    let url = format!("127.0.0.1:{}", s.port);
    let r = attacks(&["rapid-reset", &url, "100000", "60"]);
    assert_eq!(r["goaway"]["name"], "ENHANCE_YOUR_CALM", "{r}");
    let metrics = s.metrics_port();
    s.poll("the close counted as abuse", || {
        (counter(
            metrics,
            r#"vramfork_connections_closed_total{reason="abuse"}"#,
        ) >= 1)
            .then_some(())
    });
    // h2's own lines carry no `event`: look at the raw JSON lines.
    let log = s.log_text();
    let h2_warnings = log
        .lines()
        .filter(|l| l.contains(r#""level":"WARN""#) && l.contains(r#""target":"h2"#))
        .count();
    assert_eq!(h2_warnings, 0, "{log}");
    eprintln!("{r}");
    let ok = s.post("/", MLP_INPUT);
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(s.ready_pids(), pids);
}
