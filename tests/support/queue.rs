//! Holding requests in the waiting queue, for the process tests: slow.pt passes that keep
//! workers busy for longer than any test lasts, short requests that wait behind them, and
//! `/metrics` scraped and read with the Prometheus project's own parser
//! (`tests/support/parse_metrics.py`).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{parse_response, Server};

/// slow.pt iterations (~22 µs each on an idle machine, slower on a busy one): a pass of
/// most of an hour, which the test ends by killing its worker or the server.
pub const FOREVER: u64 = 100_000_000;

/// A slow.pt body running `n` iterations.
pub fn slow(n: u64) -> String {
    format!(r#"{{"inputs": [[{n}]]}}"#)
}

/// One `POST /` on a fresh connection; the status, or what went wrong (a reset when its
/// worker was killed). Waits as long as the answer takes, up to 10 minutes.
pub fn post(port: u16, body: &str) -> Result<u16, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(600)))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "POST / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    parse_response(&raw)
        .map(|r| r.status)
        .map_err(|e| e.to_string())
}

/// A request that keeps a worker busy ([`FOREVER`]), on a thread of its own.
pub fn busy(port: u16) -> JoinHandle<Result<u16, String>> {
    std::thread::spawn(move || post(port, &slow(FOREVER)))
}

/// `n` clients sending a short request each, on threads of their own: they wait while
/// every worker is busy.
pub fn clients(port: u16, n: usize) -> Vec<JoinHandle<Result<u16, String>>> {
    (0..n)
        .map(|_| std::thread::spawn(move || post(port, &slow(1))))
        .collect()
}

/// One scrape of `/metrics` in the Prometheus text format.
pub fn scrape(port: u16) -> String {
    let r = crate::common::http(port, "GET", "/metrics", None);
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

/// A scrape parsed by the Prometheus client library: family name → type and samples.
pub fn parse(text: &str) -> Value {
    let input = json!([{"format": "prometheus", "text": text}]);
    let mut out = crate::common::python_json(
        "parse_metrics.py",
        &[],
        &serde_json::to_vec(&input).unwrap(),
    );
    out[0].take()
}

/// The sum of the samples named `sample` whose labels include `labels`.
pub fn sum(families: &Value, sample: &str, labels: &[(&str, &str)]) -> f64 {
    families
        .as_object()
        .unwrap()
        .values()
        .flat_map(|f| f["samples"].as_array().unwrap())
        .filter(|s| s[0] == sample && labels.iter().all(|(k, v)| s[1][*k] == *v))
        .map(|s| s[2].as_f64().unwrap())
        .sum()
}

/// Scrapes until the parsed scrape satisfies `ok`; returns its text and the parse.
pub fn wait_scrape(
    s: &Server,
    port: u16,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> (String, Value) {
    s.poll(what, || {
        let text = scrape(port);
        let f = parse(&text);
        ok(&f).then_some((text, f))
    })
}

/// `vramfork_requests_waiting` of a scrape: (listen, model).
pub fn waiting(f: &Value) -> (f64, f64) {
    let q = |queue| sum(f, "vramfork_requests_waiting", &[("queue", queue)]);
    (q("listen"), q("model"))
}
