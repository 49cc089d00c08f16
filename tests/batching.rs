//! Dynamic batching end to end: the real `app --production` serving real TorchScript models
//! with `max_batch_size`, concurrent clients over loopback. What a user sees: every request
//! gets its own rows back (equal to unbatched answers), requests of other shapes wait for
//! their own batch, one bad request fails alone, recycling and timeouts keep their meaning,
//! and `/metrics` counts the passes. Tests that depend on requests having met in one pass
//! check it on `/metrics` (`vramfork_batches_total`). Every loop is bounded.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::thread;

use common::*;
use serde_json::{json, Value};

/// The metadata fields of a batched model with a declared `[-1, 4]` float32 input.
const BATCHED_4: &str = r#""input": {"shape": [-1, 4], "dtype": "float32"}, "max_batch_size": 8"#;

/// Starts `app --production --metrics-port 0 ARGS`; returns it and its metrics port.
fn start(app: &App, args: &[&str]) -> (Server, u16) {
    start_env(app, args, &[])
}

fn start_env(app: &App, args: &[&str], env: &[(&str, &str)]) -> (Server, u16) {
    let mut all = vec!["--production", "--metrics-port", "0"];
    all.extend_from_slice(args);
    let s = Server::start_env(app, &all, env);
    let e = s.wait_event("metrics_listening", |_| true);
    let port = e
        .str("addr")
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {:?}", e.fields));
    (s, port)
}

/// One `/metrics` scrape (Prometheus text format).
fn scrape(port: u16) -> String {
    let r = http(port, "GET", "/metrics", None);
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

/// The samples named exactly `name` in a text-format scrape: (labels, value).
fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        if &line[..end] != name {
            continue;
        }
        let mut labels = BTreeMap::new();
        let mut rest = &line[end..];
        if let Some(body) = rest.strip_prefix('{') {
            let close = body.rfind('}').expect("a closing brace");
            for pair in body[..close].split("\",").filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').expect("label=value");
                labels.insert(k.trim().to_string(), v.trim_matches('"').to_string());
            }
            rest = &body[close + 1..];
        }
        let value = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        out.push((labels, value));
    }
    out
}

/// `vramfork_batches_total` by its `size` label.
fn batches(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (labels, v) in samples(text, "vramfork_batches_total") {
        let size = labels.get("size").cloned().unwrap_or_default();
        *out.entry(size).or_default() += v;
    }
    out
}

fn batch_rows(text: &str) -> f64 {
    samples(text, "vramfork_batch_rows_total")
        .iter()
        .map(|s| s.1)
        .sum()
}

fn infer_requests(text: &str) -> f64 {
    samples(text, "vramfork_requests_total")
        .iter()
        .filter(|(l, _)| l.get("endpoint").map(String::as_str) == Some("infer"))
        .map(|s| s.1)
        .sum()
}

/// Whether a scrape counts a forward pass that stacked more than one row.
fn has_multi_row_pass(text: &str) -> bool {
    batches(text)
        .iter()
        .any(|(size, n)| size != "1" && *n > 0.0)
}

/// Waits until a scrape satisfies `ok` (workers report with their heartbeat); returns it.
fn wait_metrics(s: &Server, port: u16, what: &str, ok: impl Fn(&str) -> bool) -> String {
    s.poll(what, || Some(scrape(port)).filter(|t| ok(t)))
}

/// Waits until `/metrics` shows a pass of more than one row: the requests did meet.
fn wait_multi_row_pass(s: &Server, port: u16) -> String {
    wait_metrics(
        s,
        port,
        "a forward pass of more than one row",
        has_multi_row_pass,
    )
}

/// Waits until `rows` rows are counted in batched passes, and checks that no more are.
fn wait_batch_rows(s: &Server, port: u16, rows: usize) -> String {
    let text = wait_metrics(s, port, &format!("{rows} batched rows counted"), |t| {
        batch_rows(t) >= rows as f64
    });
    assert_eq!(batch_rows(&text), rows as f64, "{text}");
    text
}

/// Sends every body at once to `POST /`, each from its own thread on its own connection;
/// the answers in the bodies' order.
fn concurrently(port: u16, bodies: &[String]) -> Vec<Response> {
    let requests: Vec<(String, String)> = bodies.iter().map(|b| ("/".into(), b.clone())).collect();
    concurrently_at(port, &requests)
}

/// [`concurrently`] with a path per request: `(path, body)`.
fn concurrently_at(port: u16, requests: &[(String, String)]) -> Vec<Response> {
    let handles: Vec<_> = requests
        .iter()
        .map(|(p, b)| {
            let (p, b) = (p.clone(), b.clone());
            thread::spawn(move || try_http(port, "POST", &p, Some(&b)))
        })
        .collect();
    handles
        .into_iter()
        .zip(requests)
        .map(|(h, (p, b))| {
            h.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("{p} {b}: no answer: {e}"))
        })
        .collect()
}

fn body(inputs: &Value) -> String {
    json!({ "inputs": inputs }).to_string()
}

/// Nested arrays of numbers equal to 1e-5 relative (plus 1e-6 absolute, for values near 0).
fn assert_close(got: &Value, want: &Value, what: &str) {
    match (got, want) {
        (Value::Array(g), Value::Array(w)) => {
            assert_eq!(g.len(), w.len(), "{what}: {got} vs {want}");
            for (g, w) in g.iter().zip(w) {
                assert_close(g, w, what);
            }
        }
        _ => {
            let (g, w) = (got.as_f64(), want.as_f64());
            let (Some(g), Some(w)) = (g, w) else {
                panic!("{what}: {got} vs {want}");
            };
            assert!(
                (g - w).abs() <= 1e-5 * g.abs().max(w.abs()) + 1e-6,
                "{what}: {g} vs {w}"
            );
        }
    }
}

/// `f` applied to every number of a nested array.
fn map_numbers(v: &Value, f: &impl Fn(f64) -> f64) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().map(|x| map_numbers(x, f)).collect()),
        x => json!(f(x.as_f64().unwrap())),
    }
}

/// Nested arrays of the same numbers (`1` and `1.0` alike).
fn same_numbers(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_numbers(a, b))
        }
        _ => a.as_f64().is_some() && a.as_f64() == b.as_f64(),
    }
}

/// An answer is 200 with exactly `want` as its outputs.
fn assert_outputs(r: &Response, want: &Value, what: &str) {
    assert_eq!(r.status, 200, "{what}: {r:?}");
    let got = &r.json()["outputs"];
    assert!(same_numbers(got, want), "{what}: want {want}, got {r:?}");
}

/// A 500 carrying the model's own message.
fn assert_model_error(r: &Response, message: &str, what: &str) {
    assert_eq!(r.status, 500, "{what}: {r:?}");
    let e = r.json()["error"].as_str().unwrap_or_default().to_string();
    assert!(e.contains(message), "{what}: {e}");
}

/// Waits until the one worker `old` has retired for `reason` and another is ready in its
/// place; returns the new worker's pid.
fn replaced(s: &Server, old: u32, reason: &str) -> u32 {
    let retiring = s.wait_event("worker_retiring", |e| e.u64("pid") == Some(old.into()));
    assert_eq!(retiring.str("reason"), Some(reason), "{retiring:?}");
    s.wait_workers_where(1, |p| p != [old])[0]
}

/// The MLP's cases computed by torch (`scripts/make_models.py`): (inputs, outputs).
fn mlp_cases() -> Vec<(Value, Value)> {
    let text = std::fs::read_to_string(fixtures().join("mlp_expected.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["inputs"].clone(), c["outputs"].clone()))
        .collect()
}

/// Requests of 1, 2 and 3 rows, and single rows taken out of the larger cases, sent at once
/// to a worker batching up to 8 rows: each answer equals torch's outputs for its own rows,
/// and equals what a server without batching answers. The server without batching (the
/// metadata's `max_batch_size` overridden by `--max-batch-size 0`) counts no batches.
#[test]
fn batched_outputs_equal_unbatched_outputs() {
    let cases = mlp_cases();
    assert_eq!(cases.len(), 3);
    // 1 + 2 + 3 + 1 + 1 = 8 rows: one full batch.
    let requests: Vec<(Value, Value)> = vec![
        cases[0].clone(),
        cases[1].clone(),
        cases[2].clone(),
        (json!([cases[2].0[1]]), json!([cases[2].1[1]])),
        (json!([cases[1].0[0]]), json!([cases[1].1[0]])),
    ];
    let bodies: Vec<String> = requests.iter().map(|(i, _)| body(i)).collect();
    let rows: usize = requests
        .iter()
        .map(|(i, _)| i.as_array().unwrap().len())
        .sum();
    assert_eq!(rows, 8);

    let app = App::new("mlp.pt", BATCHED_4);
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "500"]);
    let pid = s.wait_workers(1)[0];
    let rounds = 5;
    let mut batched = Vec::new();
    for round in 0..rounds {
        let answers = concurrently(s.port, &bodies);
        for ((r, (inputs, want)), i) in answers.iter().zip(&requests).zip(0..) {
            let what = format!("round {round}, request {i} {inputs}");
            assert_eq!(r.status, 200, "{what}: {r:?}");
            assert_eq!(r.pid(), pid, "{what}");
            assert_close(&r.json()["outputs"], want, &what);
        }
        batched.push(answers);
    }
    wait_multi_row_pass(&s, mport);
    wait_batch_rows(&s, mport, rounds * rows);

    // The same requests, one at a time, on a server whose batching is turned off.
    let (plain, pport) = start(&app, &["--workers", "1", "--max-batch-size", "0"]);
    plain.wait_workers(1);
    for (i, b) in bodies.iter().enumerate() {
        let r = plain.post("/", b);
        assert_eq!(r.status, 200, "{b}: {r:?}");
        for (round, answers) in batched.iter().enumerate() {
            assert_close(
                &answers[i].json()["outputs"],
                &r.json()["outputs"],
                &format!("round {round}, request {i} {b}: batched vs unbatched"),
            );
        }
    }
    let text = wait_metrics(&plain, pport, "the requests counted", |t| {
        infer_requests(t) >= bodies.len() as f64
    });
    assert!(
        batches(&text).values().all(|n| *n == 0.0) && batch_rows(&text) == 0.0,
        "batches counted without batching:\n{text}"
    );
}

/// A model without a declared shape (fail.pt: x * 2) gets requests of rows of 2 and of 3
/// numbers interleaved: each is answered 200 with its own doubled rows.
#[test]
fn requests_of_two_shapes_are_each_answered_right() {
    let app = App::new("fail.pt", r#""max_batch_size": 8"#);
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "300"]);
    let pid = s.wait_workers(1)[0];
    let rounds = 3;
    let per_round = 8;
    for round in 0..rounds {
        let inputs: Vec<Value> = (0..per_round)
            .map(|i| {
                let x = (round * per_round + i) as f64;
                if i % 2 == 0 {
                    json!([[x, x + 0.5]])
                } else {
                    json!([[x, x + 0.5, x + 0.25]])
                }
            })
            .collect();
        let bodies: Vec<String> = inputs.iter().map(body).collect();
        let answers = concurrently(s.port, &bodies);
        for (r, x) in answers.iter().zip(&inputs) {
            let what = format!("round {round}, {x}");
            assert_outputs(r, &map_numbers(x, &|v| v * 2.0), &what);
            assert_eq!(r.pid(), pid, "{what}");
        }
    }
    wait_multi_row_pass(&s, mport);
    wait_batch_rows(&s, mport, rounds * per_round);
}

/// fail.pt raises when its whole input sums below zero, so a batch holding a request of
/// large negative numbers raises: only that request gets 500 (with the model's message),
/// the others of its batch get 200 and their own outputs, and the worker lives on.
#[test]
fn a_failing_request_in_a_batch_fails_alone() {
    let app = App::new("fail.pt", r#""max_batch_size": 4"#);
    // Four requests fill a batch and run at once; the long timeout only keeps a thread
    // that is late on a busy machine in the same batch.
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "5000"]);
    let pid = s.wait_workers(1)[0];
    // First, four good requests meet in one pass (they fill the batch).
    let good = |k: usize| json!([[k as f64 + 1.0, 2.0]]);
    let bodies: Vec<String> = (0..4).map(|k| body(&good(k))).collect();
    for (k, r) in concurrently(s.port, &bodies).iter().enumerate() {
        assert_outputs(r, &map_numbers(&good(k), &|v| v * 2.0), "warm-up round");
        assert_eq!(r.pid(), pid);
    }
    wait_multi_row_pass(&s, mport);
    wait_batch_rows(&s, mport, 4);
    // Then rounds of three good requests and one bad, the bad one in every position.
    let bad = json!([[-1000.0, -1000.0]]);
    for culprit in 0..4 {
        let inputs: Vec<Value> = (0..4)
            .map(|k| if k == culprit { bad.clone() } else { good(k) })
            .collect();
        let bodies: Vec<String> = inputs.iter().map(body).collect();
        let answers = concurrently(s.port, &bodies);
        for (k, (r, x)) in answers.iter().zip(&inputs).enumerate() {
            let what = format!("culprit at {culprit}, request {k} {x}");
            if k == culprit {
                assert_model_error(r, "negative input sum is not allowed by fail.pt", &what);
            } else {
                assert_outputs(r, &map_numbers(x, &|v| v * 2.0), &what);
            }
            assert_eq!(r.pid(), pid, "{what}: the worker changed");
        }
        // The four met in one pass, which failed, and ran again one by one: one more pass
        // of 3-4 rows and four more of 1 (4 + 4 rows).
        let rounds = culprit as f64 + 1.0;
        let text = wait_batch_rows(&s, mport, 4 + 8 * (culprit + 1));
        let b = batches(&text);
        assert_eq!(b.get("3-4").copied(), Some(1.0 + rounds), "{text}");
        assert_eq!(b.get("1").copied(), Some(4.0 * rounds), "{text}");
    }
    let r = s.post("/", &body(&good(0)));
    assert_outputs(&r, &json!([[2.0, 4.0]]), "after the failures");
    assert_eq!(r.pid(), pid);
    assert_eq!(s.wait_workers(1), vec![pid]);
    assert!(
        s.events_named("worker_exited").is_empty(),
        "{}",
        s.log_text()
    );
}

/// rowfail.pt refuses any input holding 13: one request with a row holding 13, sent with
/// single-row requests that fill the batch, fails alone; the others get x * 2 + 1.
#[test]
fn a_request_with_a_refused_row_fails_alone() {
    let app = App::new("rowfail.pt", BATCHED_4);
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "500"]);
    let pid = s.wait_workers(1)[0];
    let twice_plus_one = |x: &Value| map_numbers(x, &|v| v * 2.0 + 1.0);
    // Four requests of two rows: 8 rows, one full batch.
    let inputs: Vec<Value> = (0..4)
        .map(|k| {
            let k = k as f64;
            json!([[k, k + 0.5, 1.0, 2.0], [-k, 3.0, 4.0, 5.0]])
        })
        .collect();
    let bodies: Vec<String> = inputs.iter().map(body).collect();
    for (r, x) in concurrently(s.port, &bodies).iter().zip(&inputs) {
        assert_outputs(r, &twice_plus_one(x), &format!("{x}"));
        assert_eq!(r.pid(), pid);
    }
    wait_multi_row_pass(&s, mport);
    // Six single rows and one request of two rows, its second holding 13: 8 rows.
    for round in 0..2 {
        let bad = json!([[1.0, 2.0, 3.0, 4.0], [5.0, 13.0, 7.0, 8.0]]);
        let mut inputs: Vec<Value> = (0..6)
            .map(|k| json!([[k as f64 + 0.25, 10.0 * round as f64, -1.0, 100.0]]))
            .collect();
        inputs.insert(round * 3, bad);
        let bodies: Vec<String> = inputs.iter().map(body).collect();
        let answers = concurrently(s.port, &bodies);
        for (k, (r, x)) in answers.iter().zip(&inputs).enumerate() {
            let what = format!("round {round}, request {k} {x}");
            if k == round * 3 {
                assert_model_error(r, "row value 13 is refused by rowfail.pt", &what);
            } else {
                assert_outputs(r, &twice_plus_one(x), &what);
            }
            assert_eq!(r.pid(), pid, "{what}: the worker changed");
        }
    }
    let r = s.post("/", &body(&json!([[0.0, 0.0, 0.0, 0.0]])));
    assert_outputs(&r, &json!([[1.0, 1.0, 1.0, 1.0]]), "after the failures");
    assert_eq!(r.pid(), pid);
}

/// A CUDA error that leaves the context usable (cudaerr.pt raises
/// libtorch's text for `invalid configuration argument` on a row starting with 7) fails the
/// request that causes it alone — 500 `cuda_request_error`, its batch-mates answered after
/// running alone — and the worker serves on; a sticky one (666: an illegal address) is 500
/// `cuda_error` and ends the worker (`cuda-fatal`), which is replaced.
#[test]
fn a_recoverable_cuda_error_fails_its_request_alone_and_the_worker_serves_on() {
    let app = App::new("cudaerr.pt", BATCHED_4);
    let (s, _) = start(&app, &["--workers", "1", "--batch-timeout-ms", "500"]);
    let pid = s.wait_workers(1)[0];
    let twice_plus_one = |x: &Value| map_numbers(x, &|v| v * 2.0 + 1.0);
    let bad = json!([[7.0, 1.0, 2.0, 3.0]]);
    let mut inputs: Vec<Value> = (0..7)
        .map(|k| json!([[k as f64 + 0.25, 1.0, -1.0, 100.0]]))
        .collect();
    inputs.insert(3, bad.clone());
    let bodies: Vec<String> = inputs.iter().map(body).collect();
    for (k, (r, x)) in concurrently(s.port, &bodies)
        .iter()
        .zip(&inputs)
        .enumerate()
    {
        let what = format!("request {k} {x}");
        if k == 3 {
            assert_model_error(r, "CUDA error: invalid configuration argument", &what);
            assert_eq!(r.json()["type"], "cuda_request_error", "{what}: {r:?}");
        } else {
            assert_outputs(r, &twice_plus_one(x), &what);
        }
        assert_eq!(r.pid(), pid, "{what}: the worker changed");
    }
    // Alone too, and the same worker answers the next request.
    let r = s.post("/", &body(&bad));
    assert_eq!(r.json()["type"], "cuda_request_error", "{r:?}");
    let r = s.post("/", &body(&json!([[0.0, 0.0, 0.0, 0.0]])));
    assert_outputs(&r, &json!([[1.0, 1.0, 1.0, 1.0]]), "after the CUDA errors");
    assert_eq!(r.pid(), pid);
    assert!(
        s.events_named("worker_exited").is_empty(),
        "{}",
        s.log_text()
    );
    // A sticky error ends the worker.
    let r = s.post("/", &body(&json!([[666.0, 0.0, 0.0, 0.0]])));
    assert_model_error(&r, "an illegal memory access was encountered", "sticky");
    assert_eq!(r.json()["type"], "cuda_error", "{r:?}");
    let gone = s.wait_event("worker_exited", |e| e.u64("pid") == Some(pid.into()));
    assert_eq!(gone.u64("code"), Some(5), "{gone:?}");
    let now = s.wait_workers_where(1, |p| p != [pid])[0];
    let r = s.post("/", &body(&json!([[0.0, 0.0, 0.0, 0.0]])));
    assert_outputs(&r, &json!([[1.0, 1.0, 1.0, 1.0]]), "after the replacement");
    assert_eq!(r.pid(), now);
}

/// A request of more rows than `max_batch_size` runs alone (and right), beside single-row
/// requests that are batched; `/metrics` counts its pass in the `9-16` range.
#[test]
fn a_request_larger_than_the_batch_runs_alone() {
    let app = App::new("rowfail.pt", BATCHED_4);
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "300"]);
    s.wait_workers(1);
    let big: Vec<Value> = (0..10)
        .map(|k| json!([k as f64, 0.5, -(k as f64), 2.0]))
        .collect();
    let mut inputs = vec![Value::Array(big)];
    inputs.extend((0..4).map(|k| json!([[k as f64, 1.0, 2.0, 3.0]])));
    let bodies: Vec<String> = inputs.iter().map(body).collect();
    for (r, x) in concurrently(s.port, &bodies).iter().zip(&inputs) {
        assert_outputs(r, &map_numbers(x, &|v| v * 2.0 + 1.0), &format!("{x}"));
    }
    let text = wait_metrics(&s, mport, "the 10-row pass counted", |t| {
        batches(t).get("9-16").is_some_and(|n| *n >= 1.0)
    });
    assert_eq!(batches(&text).get("9-16"), Some(&1.0), "{text}");
    wait_batch_rows(&s, mport, 14);
}

/// Open Inference Protocol requests and `POST /` requests meet in one batch, and each gets
/// its own rows back in its own protocol.
#[test]
fn v2_and_plain_requests_are_batched_together() {
    let app = App::new(
        "rowfail.pt",
        r#""input": {"shape": [-1, 4], "dtype": "float32"}, "max_batch_size": 4"#,
    );
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "500"]);
    s.wait_workers(1);
    let row = |k: usize| vec![k as f64 + 0.5, -1.0, 2.0, k as f64 * 10.0];
    let twice_plus_one = |r: Vec<f64>| r.into_iter().map(|v| v * 2.0 + 1.0).collect::<Vec<_>>();
    let infer = "/v2/models/test%20app/infer".to_string();
    let requests: Vec<(String, String)> = (0..4)
        .map(|k| {
            if k % 2 == 0 {
                ("/".to_string(), body(&json!([row(k)])))
            } else {
                let v2 = json!({"id": format!("r{k}"), "inputs": [
                    {"name": "input__0", "shape": [1, 4], "datatype": "FP32", "data": row(k)}
                ]});
                (infer.clone(), v2.to_string())
            }
        })
        .collect();
    for (k, r) in concurrently_at(s.port, &requests).iter().enumerate() {
        let want = json!(twice_plus_one(row(k)));
        if k % 2 == 0 {
            assert_outputs(r, &json!([want]), &format!("request {k}"));
        } else {
            assert_eq!(r.status, 200, "request {k}: {r:?}");
            let v = r.json();
            assert_eq!(v["id"], format!("r{k}"), "{v}");
            let out = &v["outputs"][0];
            assert_eq!(out["shape"], json!([1, 4]), "{v}");
            assert!(
                same_numbers(&out["data"], &want),
                "request {k}: want {want}, got {v}"
            );
        }
    }
    // Two of each protocol: a pass of 3 or 4 rows held both.
    wait_metrics(&s, mport, "a pass of 3 or 4 rows", |t| {
        batches(t).get("3-4").is_some_and(|n| *n >= 1.0)
    });
    wait_batch_rows(&s, mport, 4);
}

/// `--max-batch-size` and `VRAMFORK_MAX_BATCH_SIZE` (with the batch timeout as a flag or
/// from the environment) turn batching on for a model whose metadata does not.
#[test]
fn the_flag_and_the_environment_turn_batching_on() {
    let app = App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#);
    let flag: (&[&str], &[(&str, &str)]) =
        (&["--max-batch-size", "4", "--batch-timeout-ms", "500"], &[]);
    let env: (&[&str], &[(&str, &str)]) = (
        &[],
        &[
            ("VRAMFORK_MAX_BATCH_SIZE", "4"),
            ("VRAMFORK_BATCH_TIMEOUT_MS", "500"),
        ],
    );
    let cases = mlp_cases();
    for (args, env) in [flag, env] {
        let mut all = vec!["--workers", "1"];
        all.extend_from_slice(args);
        let (s, mport) = start_env(&app, &all, env);
        s.wait_workers(1);
        let rows = cases[2].0.as_array().unwrap();
        let bodies: Vec<String> = rows
            .iter()
            .chain([&cases[0].0[0]])
            .map(|row| body(&json!([row])))
            .collect();
        let want: Vec<&Value> = cases[2]
            .1
            .as_array()
            .unwrap()
            .iter()
            .chain([&cases[0].1[0]])
            .collect();
        for (r, w) in concurrently(s.port, &bodies).iter().zip(want) {
            assert_eq!(r.status, 200, "{args:?} {env:?}: {r:?}");
            assert_close(
                &r.json()["outputs"],
                &json!([w]),
                &format!("{args:?} {env:?}"),
            );
        }
        wait_multi_row_pass(&s, mport);
        wait_batch_rows(&s, mport, 4);
    }
}

/// `--max-requests` counts requests, not batches: 8 clients × 25 requests (1 to 3 rows
/// each) on 2 workers that batch and recycle every 5 requests fail none, every answer
/// holds its own rows, workers are replaced, and none served more than 5.
#[test]
fn max_requests_counts_requests_under_batching() {
    let app = App::new("rowfail.pt", BATCHED_4);
    let (s, mport) = start(
        &app,
        &[
            "--workers",
            "2",
            "--max-requests",
            "5",
            "--batch-timeout-ms",
            "200",
        ],
    );
    s.wait_workers(2);
    let (threads, each) = (8, 25);
    let port = s.port;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            thread::spawn(move || {
                (0..each)
                    .map(|j| {
                        // Never 13: every first and second value has a fraction.
                        let rows: Vec<Value> = (0..j % 3 + 1)
                            .map(|r| json!([t as f64 + 0.5, j as f64 + 0.25, r as f64, 2.0]))
                            .collect();
                        let x = Value::Array(rows);
                        let r = try_http(port, "POST", "/", Some(&body(&x)));
                        (x, r.map_err(|e| e.to_string()))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<(Value, Result<Response, String>)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let failed: Vec<String> = results
        .iter()
        .filter(|(x, r)| {
            !matches!(r, Ok(r) if r.status == 200
                && same_numbers(&r.json()["outputs"], &map_numbers(x, &|v| v * 2.0 + 1.0)))
        })
        .map(|(x, r)| format!("{x}: {r:?}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        results.len()
    );
    let pids: BTreeSet<u32> = results
        .iter()
        .map(|(_, r)| r.as_ref().unwrap().pid())
        .collect();
    // 200 requests, at most 5 per worker: at least 40 workers served.
    assert!(
        pids.len() >= 40,
        "{} distinct workers: {pids:?}",
        pids.len()
    );
    let exited = s.events_named("worker_exited");
    assert!(
        exited
            .iter()
            .any(|e| e.str("reason") == Some("max_requests")),
        "{}",
        s.log_text()
    );
    for e in &exited {
        assert!(
            e.u64("served").is_some_and(|n| n <= 5),
            "a worker served more than --max-requests: {e:?}"
        );
    }
    let rows: usize = results
        .iter()
        .map(|(x, _)| x.as_array().unwrap().len())
        .sum();
    wait_metrics(&s, mport, "every request counted", |t| {
        infer_requests(t) >= (threads * each) as f64
    });
    wait_batch_rows(&s, mport, rows);
}

/// slow.pt with a batch dimension: three requests that fill a batch and run far past
/// `--request-timeout` all get 504 (a request merely queued behind a stuck one would get
/// 503), and a new worker answers afterwards.
#[test]
fn a_stuck_batch_answers_504_to_every_member_and_the_worker_is_replaced() {
    let app = App::new(
        "slow.pt",
        r#""input": {"shape": [-1, 1], "dtype": "float32"}, "max_batch_size": 3"#,
    );
    let (s, _) = start(
        &app,
        &[
            "--workers",
            "1",
            "--request-timeout",
            "1",
            // The batch is full (and runs) once the three have arrived; the long timeout
            // only keeps a late thread on a busy machine in the same batch.
            "--batch-timeout-ms",
            "5000",
        ],
    );
    let old = s.wait_workers(1)[0];
    // slow.pt runs as many iterations (~22 µs each) as its first row says: ~40 minutes.
    let bodies: Vec<String> = (0..3).map(|_| body(&json!([[100_000_000]]))).collect();
    for r in concurrently(s.port, &bodies) {
        assert_eq!(r.status, 504, "{r:?}");
        assert_eq!(r.pid(), old);
        let e = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(e.contains("request-timeout"), "{e}");
    }
    let now = replaced(&s, old, "request_timeout");
    let r = s.post("/", &body(&json!([[1]])));
    assert_outputs(&r, &json!([[1.0]]), "after the replacement");
    assert_eq!(r.pid(), now);
}

/// oom.pt raises PyTorch's CUDA out-of-memory message when its input sums above 0: a batch
/// of such requests answers 507 to each of them (no one-by-one re-run), and the worker
/// recycles itself; its replacement serves.
#[test]
fn cuda_out_of_memory_in_a_batch_answers_507_and_the_worker_recycles() {
    let app = App::new("oom.pt", r#""max_batch_size": 3"#);
    // Batches of three fill at once; the long timeout only waits for a late thread.
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "5000"]);
    let old = s.wait_workers(1)[0];
    // Three requests the model returns as they are meet in one pass.
    let fine: Vec<Value> = (1..=3).map(|k| json!([[-(k as f64)]])).collect();
    let bodies: Vec<String> = fine.iter().map(body).collect();
    for (r, x) in concurrently(s.port, &bodies).iter().zip(&fine) {
        assert_outputs(r, x, &format!("{x}"));
        assert_eq!(r.pid(), old);
    }
    wait_multi_row_pass(&s, mport);
    wait_batch_rows(&s, mport, 3);
    let bodies: Vec<String> = (1..=3).map(|k| body(&json!([[k as f64]]))).collect();
    for r in concurrently(s.port, &bodies) {
        assert_eq!(r.status, 507, "{r:?}");
        assert_eq!(r.pid(), old);
        let e = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(e.contains("CUDA out of memory"), "{e}");
    }
    // One batched pass ran out of memory, and no request ran again alone.
    let text = wait_batch_rows(&s, mport, 6);
    let b = batches(&text);
    assert_eq!(b.get("3-4").copied(), Some(2.0), "{text}");
    assert_eq!(b.get("1").copied().unwrap_or(0.0), 0.0, "{text}");
    let now = replaced(&s, old, "out_of_memory");
    let r = s.post("/", &body(&json!([[-1.0]])));
    assert_outputs(&r, &json!([[-1.0]]), "after the replacement");
    assert_eq!(r.pid(), now);
}

/// A batch timeout without batching, and a `max_batch_size` that is not a whole number
/// ≥ 0, exit 2 before binding, naming the setting.
#[test]
fn batching_config_errors_exit_2_naming_the_setting() {
    let plain = App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#);
    let batched = App::new("mlp.pt", BATCHED_4);
    type Case<'a> = (&'a App, &'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let mut cases: Vec<Case> = vec![
        (
            &plain,
            &["--batch-timeout-ms", "5"],
            &[],
            "--batch-timeout-ms",
        ),
        (
            &plain,
            &[],
            &[("VRAMFORK_BATCH_TIMEOUT_MS", "5")],
            "BATCH_TIMEOUT_MS",
        ),
        (
            &batched,
            &["--max-batch-size", "0", "--batch-timeout-ms", "5"],
            &[],
            "--batch-timeout-ms",
        ),
        (&plain, &["--max-batch-size", "-1"], &[], "--max-batch-size"),
        (&plain, &["--max-batch-size", "x"], &[], "--max-batch-size"),
    ];
    let bad_metadata: Vec<App> = [r#"-1"#, r#""8""#, "1.5"]
        .iter()
        .map(|v| {
            App::new(
                "mlp.pt",
                &format!(r#""input": {{"shape": [-1, 4]}}, "max_batch_size": {v}"#),
            )
        })
        .collect();
    for app in &bad_metadata {
        cases.push((app, &[], &[], "max_batch_size"));
    }
    for (app, args, env, name) in cases {
        let meta = std::fs::read_to_string(app.metadata()).unwrap();
        let mut a = vec!["--production"];
        a.extend_from_slice(args);
        let mut s = Server::spawn(app, &a, env);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(2), "{args:?} {env:?} {meta}: {log}");
        assert!(
            log.contains(name) && log.contains("app: "),
            "{args:?} {env:?} {meta}: {log}"
        );
        assert!(
            !log.contains("\"listening\""),
            "bound before validating: {log}"
        );
    }
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

/// The fixture `name` (`docs` or `pair`) with the signature its metadata file declares, and
/// batching up to `max_batch_size` rows.
fn signature_app(name: &str, max_batch_size: u32) -> App {
    let meta = fixture_json(&format!("{name}.json"));
    App::new(
        &format!("{name}.pt"),
        &format!(
            r#""inputs": {}, "outputs": {}, "max_batch_size": {max_batch_size}"#,
            meta["inputs"], meta["outputs"]
        ),
    )
}

/// Text (`BYTES`, a `List[str]` for the model) is batched by joining the requests' lists:
/// each request gets its own documents' lengths and first words back.
#[test]
fn text_requests_are_batched_by_joining_their_lists() {
    let exp = fixture_json("docs_expected.json");
    let app = signature_app("docs", 5);
    // The five documents fill the batch (2 + 1 + 2 rows); the timeout only waits for a
    // late thread.
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "5000"]);
    s.wait_workers(1);
    let groups: [&[usize]; 3] = [&[0, 1], &[2], &[3, 4]];
    let bodies: Vec<String> = groups
        .iter()
        .map(|g| {
            let docs: Vec<&Value> = g.iter().map(|i| &exp["docs"][*i]).collect();
            json!({ "inputs": docs }).to_string()
        })
        .collect();
    for (g, r) in groups.iter().zip(concurrently(s.port, &bodies)) {
        assert_eq!(r.status, 200, "{g:?}: {r:?}");
        let lengths: Vec<&Value> = g.iter().map(|i| &exp["lengths"][*i]).collect();
        let firsts: Vec<&Value> = g.iter().map(|i| &exp["first_word"][*i]).collect();
        assert_eq!(r.json()["outputs"], json!([lengths, firsts]), "{g:?}");
    }
    let text = wait_batch_rows(&s, mport, 5);
    assert_eq!(
        batches(&text).get("5-8"),
        Some(&1.0),
        "one pass of 5 rows: {text}"
    );
}

/// A model of two inputs: each is stacked along its first dimension, in declared order,
/// and both outputs are cut back per request.
#[test]
fn several_inputs_are_stacked_together() {
    let app = signature_app("pair", 4);
    let (s, mport) = start(&app, &["--workers", "1", "--batch-timeout-ms", "5000"]);
    s.wait_workers(1);
    // Request k: one or two rows of features, each with its scale.
    let reqs: Vec<(Vec<[f64; 3]>, Vec<i64>)> = vec![
        (vec![[1.0, 2.0, 3.0]], vec![3]),
        (vec![[-0.5, 0.25, 4.0], [2.0, 2.0, 2.0]], vec![-2, 5]),
        (vec![[0.0, 1.5, -1.0]], vec![1]),
    ];
    let bodies: Vec<String> = reqs
        .iter()
        .map(|(f, sc)| json!({"inputs": {"scale": sc, "features": f}}).to_string())
        .collect();
    for ((f, sc), r) in reqs.iter().zip(concurrently(s.port, &bodies)) {
        assert_eq!(r.status, 200, "{f:?}: {r:?}");
        let scaled: Vec<Vec<f64>> = f
            .iter()
            .zip(sc)
            .map(|(row, k)| row.iter().map(|v| v * *k as f64).collect())
            .collect();
        let total: Vec<f64> = f
            .iter()
            .zip(sc)
            .map(|(row, k)| row.iter().sum::<f64>() + *k as f64)
            .collect();
        let out = r.json()["outputs"].clone();
        assert!(same_numbers(&out[0], &json!(scaled)), "{f:?}: {out}");
        assert!(same_numbers(&out[1], &json!(total)), "{f:?}: {out}");
    }
    let text = wait_batch_rows(&s, mport, 4);
    assert_eq!(
        batches(&text).get("3-4"),
        Some(&1.0),
        "one pass of 4 rows: {text}"
    );
}
