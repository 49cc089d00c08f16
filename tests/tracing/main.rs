//! Traces: the real `app` exporting its workers' spans over OTLP/HTTP to a
//! receiver that decodes them with the official protobuf definitions
//! (`tests/support/otlp_receiver.py`, opentelemetry-proto). A traced request shows up as
//! one trace with its queue, forward and answer time under the caller's span; a batched
//! pass is one span linking its members; a gRPC call handed to a sibling stays in its trace;
//! `/v1/embeddings` has a `tokenize` span and documents' pre-processing on `POST /` and v2
//! a `preprocess` span; probes are not exported; the sampled flag is
//! honoured both ways; a collector that never answers, or answers 503, costs no
//! request (the spans are dropped and counted); no span carries the payload; a
//! configuration that cannot export is a start-up error; over https (a receiver with a
//! certificate made on the spot) spans arrive verified by the CA given (or one of
//! `SSL_CERT_DIR`), with a client certificate, and a collector certificate from another CA
//! costs no request; exports keep one connection (http and https), and a collector that
//! closes its connections still gets every batch.

#[path = "../common/mod.rs"]
mod common;
#[path = "../otlp/mod.rs"]
mod otlp;

mod collector;
mod one_trace;
mod spans;
mod transport;

use std::process::Command;

use common::pki::Pki;
use common::{raw, App, Server, PATIENCE};
use otlp::Receiver;
use serde_json::Value;

const INPUT: &str = r#"{"inputs": [[0.5, -1.0, 2.0, 0.25]]}"#;
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn mlp() -> App {
    App::new(
        "mlp.pt",
        r#""input": {"shape": [-1, 4], "dtype": "float32"}"#,
    )
}

fn traceparent(trace: &str, flags: &str) -> String {
    format!("traceparent: 00-{trace}-{CALLER_SPAN}-{flags}\r\n")
}

/// `INPUT` POSTed to `/` on `port` in trace `trace`, sampled: its 200 answer.
fn post_traced(port: u16, trace: &str) -> common::Raw {
    let r = raw(
        port,
        "POST",
        "/",
        &traceparent(trace, "01"),
        INPUT.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r
}

fn by_name<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    spans
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
}

fn hex_span(answer_traceparent: &str) -> &str {
    answer_traceparent.split('-').nth(2).unwrap()
}

fn scrape(port: u16) -> String {
    common::http(port, "GET", "/metrics", None).body
}

fn dropped(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("vramfork_trace_spans_dropped_total "))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}
