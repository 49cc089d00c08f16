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

mod common;
mod otlp;

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

#[test]
fn a_traced_request_is_one_trace_with_its_queue_forward_and_answer_time() {
    let rx = Receiver::start("ok");
    let app = mlp();
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint()),
            ("OTEL_SERVICE_NAME", "mlp-under-test"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=t%201"),
        ],
    );
    s.wait_workers(1);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let extra = format!("X-Request-Id: traced-1\r\n{}", traceparent(trace, "01"));
    let r = raw(s.port, "POST", "/", &extra, INPUT.as_bytes());
    assert_eq!(r.status, 200);
    let back = r.header("traceparent").unwrap().to_string();
    let spans = rx.spans_of(trace, 4);
    assert_eq!(
        spans.len(),
        4,
        "one SERVER span and its three children: {spans:#?}"
    );
    let server = by_name(&spans, "POST /");
    assert_eq!(server["kind"], 2, "SERVER");
    assert_eq!(
        server["span_id"],
        hex_span(&back),
        "the answer names the SERVER span"
    );
    assert_eq!(
        server["parent_span_id"], CALLER_SPAN,
        "a child of the caller's span"
    );
    let a = &server["attributes"];
    assert_eq!(a["http.request.method"], "POST");
    assert_eq!(a["http.route"], "/");
    assert_eq!(a["http.response.status_code"], 200);
    assert_eq!(a["vramfork.request_id"], "traced-1");
    assert_eq!(a["vramfork.batch.size"], 1);
    assert_eq!(
        a["process.pid"],
        u64::from(r.header("X-Worker-Pid").unwrap().parse::<u32>().unwrap())
    );
    assert_eq!(server["resource"]["service.name"], "mlp-under-test");
    assert_eq!(server["path"], "/v1/traces");
    assert_eq!(server["content_type"], "application/x-protobuf");
    assert_eq!(
        server["header_x_tenant"], "t 1",
        "OTEL_EXPORTER_OTLP_HEADERS, decoded"
    );
    assert_eq!(server["scope"], "vramfork");
    // The children, in order, inside the SERVER span.
    let (start, end) = (
        server["start"].as_u64().unwrap(),
        server["end"].as_u64().unwrap(),
    );
    let mut at = start;
    for name in ["queue", "forward", "answer"] {
        let c = by_name(&spans, name);
        assert_eq!(c["parent_span_id"], server["span_id"], "{name}");
        assert_eq!(c["kind"], 1, "{name}: INTERNAL");
        let (cs, ce) = (c["start"].as_u64().unwrap(), c["end"].as_u64().unwrap());
        assert!(
            cs >= at && ce >= cs && ce <= end,
            "{name}: {cs}..{ce} after {at}, within {start}..{end}"
        );
        at = ce;
    }
    assert_eq!(
        by_name(&spans, "forward")["attributes"]["vramfork.batch.size"],
        1
    );
    // A v2 request: its route names no model.
    let v2 = r#"{"inputs": [{"name": "input__0", "shape": [1, 4], "datatype": "FP32", "data": [0.5, -1.0, 2.0, 0.25]}]}"#;
    let trace2 = "5bf92f3577b34da6a3ce929d0e0e4737";
    let r = raw(
        s.port,
        "POST",
        "/v2/models/test%20app/infer",
        &traceparent(trace2, "01"),
        v2.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let spans = rx.spans_of(trace2, 4);
    let server = by_name(&spans, "POST /v2/models/{model_name}/infer");
    assert_eq!(
        server["attributes"]["http.route"],
        "/v2/models/{model_name}/infer"
    );
    // A refusal: a span with the ERROR status and its error type.
    let trace3 = "6bf92f3577b34da6a3ce929d0e0e4738";
    let r = raw(
        s.port,
        "POST",
        "/",
        &traceparent(trace3, "01"),
        br#"{"inputs": [[1, 2]]}"#,
    );
    assert_eq!(r.status, 400);
    let spans = rx.spans_of(trace3, 1);
    let server = by_name(&spans, "POST /");
    assert_eq!(server["status_code"], 2, "ERROR");
    assert_eq!(server["attributes"]["error.type"], "400");
    // No payload in any attribute: none of the inputs' values, no body.
    for span in rx.all() {
        let text = span["attributes"].to_string();
        for payload in ["0.25", "-1.0", "inputs", "input__0"] {
            assert!(!text.contains(payload), "{payload} in {text}");
        }
    }
}

#[test]
fn the_sampled_flag_is_honoured_both_ways() {
    let rx = Receiver::start("ok");
    let app = mlp();
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())],
    );
    s.wait_workers(1);
    // The caller did not sample: nothing exported, and the answer says not sampled.
    let unsampled = "7bf92f3577b34da6a3ce929d0e0e4739";
    let r = raw(
        s.port,
        "POST",
        "/",
        &traceparent(unsampled, "00"),
        INPUT.as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert!(r.header("traceparent").unwrap().ends_with("-00"));
    // No caller: the root sampler (always on by default) samples it, and says so.
    let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
    assert_eq!(r.status, 200);
    let back = r.header("traceparent").unwrap();
    assert!(back.ends_with("-01"), "{back}");
    let started_here = back.split('-').nth(1).unwrap();
    let spans = rx.spans_of(started_here, 4);
    assert_eq!(
        by_name(&spans, "POST /")["parent_span_id"],
        "",
        "a root span"
    );
    // The sampled trace's spans came after the unsampled request was answered, in the
    // worker's queue order: the unsampled one would have been exported before them.
    assert!(
        rx.all().iter().all(|l| l["trace_id"] != unsampled),
        "spans of a trace its caller did not sample were exported"
    );
    // OTEL_TRACES_SAMPLER=always_off: nothing, whatever the caller says.
    let rx2 = Receiver::start("ok");
    let s2 = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &rx2.endpoint()),
            ("OTEL_TRACES_SAMPLER", "always_off"),
        ],
    );
    s2.wait_workers(1);
    let r = raw(
        s2.port,
        "POST",
        "/",
        &traceparent(unsampled, "01"),
        INPUT.as_bytes(),
    );
    assert!(r.status == 200 && r.header("traceparent").unwrap().ends_with("-00"));
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

/// A collector that never answers, and one that answers 503: every request is answered
/// 200 as before, and the spans are dropped and counted.
#[test]
fn a_dead_or_refusing_collector_costs_no_request() {
    for mode in ["hang", "503"] {
        let rx = Receiver::start(mode);
        let app = mlp();
        let s = Server::start_env(
            &app,
            &["--production", "--workers", "1", "--metrics-port", "0"],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint()),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "300"),
            ],
        );
        s.wait_workers(1);
        let mport = s.metrics_port();
        for i in 0..40 {
            let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
            assert_eq!(r.status, 200, "{mode}: request {i}");
        }
        let n = s.poll(&format!("{mode}: spans dropped and counted"), || {
            let d = dropped(&scrape(mport));
            (d > 0).then_some(d)
        });
        assert!(n <= 160, "{mode}: {n} dropped of 160 spans");
        if mode == "503" {
            assert!(
                rx.all().iter().any(|l| l["refused"].is_u64()),
                "the receiver was asked"
            );
        }
        let warned = s.poll(&format!("{mode}: the warning"), || {
            s.all_events()
                .into_iter()
                .find(|e| e.name == "trace_export_failing")
        });
        assert!(
            warned.message().contains("dropped and counted"),
            "{:?}",
            warned.fields
        );
    }
}

/// A collector that refused an export and then takes them again: after the first refusal
/// (its spans dropped and counted, `trace_export_failing` logged) the exporter pauses, then
/// its next export goes through: newer requests' spans arrive and `trace_export_recovered`
/// says how many were dropped meanwhile.
#[test]
fn a_collector_that_comes_back_gets_spans_again_and_the_recovery_is_logged() {
    let rx = Receiver::start("503-once");
    let app = mlp();
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1", "--metrics-port", "0"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())],
    );
    s.wait_workers(1);
    let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
    assert_eq!(r.status, 200);
    let warned = s.poll("the refusal", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "trace_export_failing")
    });
    assert!(warned.message().contains("503"), "{:?}", warned.fields);
    // Requests go on being answered; once the exporter tries again, their spans arrive.
    let arrived = s.poll("spans after the refusal", || {
        let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
        assert_eq!(r.status, 200);
        let spans = rx.all();
        spans.iter().any(|l| l["name"] == "POST /").then_some(spans)
    });
    assert_eq!(
        rx.all().iter().filter(|l| l["refused"].is_u64()).count(),
        1,
        "one refusal: {arrived:#?}"
    );
    let recovered = s.poll("the recovery", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "trace_export_recovered")
    });
    let dropped_then = recovered.u64("dropped").expect("dropped");
    assert!(
        dropped_then >= 4,
        "the refused export's spans: {:?}",
        recovered.fields
    );
    assert!(
        dropped(&scrape(s.metrics_port())) >= dropped_then,
        "the counter holds them"
    );
}

/// What cannot be exported to stops the start (exit 2) naming the variable; what the
/// standard makes a warning is logged, and the server starts.
#[test]
fn an_export_that_cannot_work_is_a_start_up_error_and_a_bad_sampler_a_warning() {
    let app = mlp();
    let junk = app.dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let junk = junk.display().to_string();
    let empty = app.dir.path().join("no-certs");
    std::fs::create_dir(&empty).unwrap();
    let empty = empty.display().to_string();
    let https = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4318");
    for (env, want) in [
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            "OTLP/HTTP with protobuf only".to_string(),
        ),
        (
            vec![
                https,
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
            ],
            "OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem: cannot be read".to_string(),
        ),
        (
            vec![https, ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &junk)],
            format!("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE={junk}: holds no PEM certificate"),
        ),
        (
            vec![https, ("SSL_CERT_DIR", "/nonexistent/certs")],
            "SSL_CERT_DIR=/nonexistent/certs: cannot be read".to_string(),
        ),
        (
            vec![https, ("SSL_CERT_DIR", &empty)],
            format!("SSL_CERT_DIR={empty}: holds no PEM certificate"),
        ),
    ] {
        let mut s = Server::spawn(&app, &["--production", "--workers", "1"], &env);
        let st = s.wait_exit(PATIENCE);
        assert_eq!(st.code(), Some(2), "{env:?}: {}", s.log_text());
        assert!(s.log_text().contains(&want), "{env:?}: {}", s.log_text());
    }
    let rx = Receiver::start("ok");
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint()),
            ("OTEL_TRACES_SAMPLER", "sometimes"),
        ],
    );
    let w = s.wait_event("trace_export_setting_ignored", |_| true);
    assert!(
        w.message().contains("OTEL_TRACES_SAMPLER=sometimes"),
        "{:?}",
        w.fields
    );
    s.wait_workers(1);
    let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
    assert!(
        r.status == 200 && r.header("traceparent").unwrap().ends_with("-01"),
        "the default sampler"
    );
}

/// Four requests batched into one pass: the pass is ONE `forward` span, in a trace of its
/// own, linking to each member's SERVER span; each member's trace keeps its queue and answer
/// spans and names the pass (its batch size, the pass's trace and span ids).
#[test]
fn a_batched_pass_is_one_forward_span_linking_every_member() {
    let rx = Receiver::start("ok");
    let app = App::new(
        "mlp.pt",
        r#""input": {"shape": [-1, 4], "dtype": "float32"}, "max_batch_size": 4"#,
    );
    // The pass waits (up to 5 s) until its four rows are there.
    let s = Server::start_env(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--batch-timeout-ms",
            "5000",
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())],
    );
    s.wait_workers(1);
    let port = s.port;
    let traces: Vec<String> = (0..4)
        .map(|k| format!("{k}bf92f3577b34da6a3ce929d0e0e47{k}0"))
        .collect();
    let members: Vec<(String, String)> = traces
        .iter()
        .map(|t| {
            let t = t.clone();
            std::thread::spawn(move || {
                let r = raw(port, "POST", "/", &traceparent(&t, "01"), INPUT.as_bytes());
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                (t, hex_span(r.header("traceparent").unwrap()).to_string())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let passes = rx.wait("a forward span with links", 1, |l| {
        l["name"] == "forward" && !l["links"].as_array().unwrap().is_empty()
    });
    assert_eq!(
        passes.len(),
        1,
        "one forward span for the pass: {passes:#?}"
    );
    let pass = &passes[0];
    let mut links: Vec<(String, String)> = pass["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["trace_id"].as_str().unwrap().to_string(),
                l["span_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    links.sort();
    let mut want = members.clone();
    want.sort();
    assert_eq!(links, want, "a link to each member's SERVER span");
    assert_eq!(pass["attributes"]["vramfork.batch.size"], 4);
    assert_eq!(pass["parent_span_id"], "", "the pass's own trace: {pass:#}");
    assert!(!traces.contains(&pass["trace_id"].as_str().unwrap().to_string()));
    for (trace, span) in &members {
        let spans = rx.spans_of(trace, 3);
        let server = by_name(&spans, "POST /");
        assert_eq!(&server["span_id"], span);
        let a = &server["attributes"];
        assert_eq!(a["vramfork.batch.size"], 4, "{server:#}");
        assert_eq!(a["vramfork.pass.trace_id"], pass["trace_id"], "{server:#}");
        assert_eq!(a["vramfork.pass.span_id"], pass["span_id"], "{server:#}");
        for name in ["queue", "answer"] {
            assert_eq!(by_name(&spans, name)["parent_span_id"], server["span_id"]);
        }
        assert!(
            spans.iter().all(|x| x["name"] != "forward"),
            "no forward span of its own in a member's trace: {spans:#?}"
        );
    }
    assert_eq!(
        rx.all().iter().filter(|l| l["name"] == "forward").count(),
        1,
        "one forward span in all: {:#?}",
        rx.all()
    );
}

/// A gRPC call handed to a sibling (two calls at once on one channel, two workers: the
/// worker that took the connection hands the one it would queue) stays in its caller's
/// trace: the handing worker's SERVER span (a child of the caller's span, with
/// `vramfork.handoff.seat`) is the parent of the sibling's SERVER span, under which are the
/// sibling's queue, forward and answer spans; the answer's `traceparent` names the
/// sibling's span.
#[test]
fn a_grpc_call_handed_to_a_sibling_stays_in_its_trace() {
    let rx = Receiver::start("ok");
    let app = App::new(
        "slow.pt",
        r#""input": {"shape": [1, 1], "dtype": "float32"}"#,
    );
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "2", "--torch-threads", "1"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())],
    );
    s.wait_workers(2);
    let url = format!("127.0.0.1:{}", s.port);
    let prefix = "4bf92f3577b34da6a3ce929d0e0e";
    let r = common::python_json(
        "triton_grpc.py",
        &["traced", &url, "test app", "2", "20000", "20", prefix],
        b"",
    );
    assert_eq!(r["errors"], serde_json::json!([]), "{r}");
    let round = r["rounds"].as_array().unwrap().last().unwrap().clone();
    let calls = round.as_array().unwrap();
    assert_ne!(
        calls[0]["pid"], calls[1]["pid"],
        "a round with a hand-off: {r}"
    );
    let traces: Vec<&str> = calls.iter().map(|c| c["trace"].as_str().unwrap()).collect();
    let handed = rx.wait("the handing worker's span", 1, |l| {
        traces.contains(&l["trace_id"].as_str().unwrap_or(""))
            && l["attributes"]["vramfork.handoff.seat"].is_u64()
    });
    let h = &handed[0];
    let trace = h["trace_id"].as_str().unwrap();
    assert_eq!(h["kind"], 2, "SERVER");
    assert_eq!(h["parent_span_id"], CALLER_SPAN, "{h:#}");
    assert_eq!(h["name"], "inference.GRPCInferenceService/ModelInfer");
    let spans = rx.spans_of(trace, 5);
    assert_eq!(
        spans.len(),
        5,
        "the hand-off, the sibling's span and its three: {spans:#?}"
    );
    let sibling = spans
        .iter()
        .find(|x| x["parent_span_id"] == h["span_id"])
        .unwrap_or_else(|| panic!("no span under the hand-off: {spans:#?}"));
    assert_eq!(sibling["kind"], 2);
    assert_eq!(sibling["name"], "inference.GRPCInferenceService/ModelInfer");
    assert_ne!(
        sibling["attributes"]["process.pid"], h["attributes"]["process.pid"],
        "answered by another worker"
    );
    let call = calls.iter().find(|c| c["trace"] == trace).unwrap();
    let pid: u64 = call["pid"].as_str().unwrap().parse().unwrap();
    assert_eq!(sibling["attributes"]["process.pid"], pid, "{call}");
    assert_eq!(
        sibling["span_id"],
        hex_span(call["traceparent"].as_str().unwrap()),
        "the answer names the sibling's span"
    );
    for name in ["queue", "forward", "answer"] {
        assert_eq!(
            by_name(&spans, name)["parent_span_id"],
            sibling["span_id"],
            "{name}"
        );
    }
}

/// An app of the files in `art` (linked) with `metadata`.
fn app_of(art: &std::path::Path, metadata: Value) -> App {
    let app = App {
        dir: tempfile::tempdir().unwrap(),
    };
    for f in std::fs::read_dir(art).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, app.dir.path().join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(app.metadata(), serde_json::to_vec(&metadata).unwrap()).unwrap();
    app
}

/// `POST /` and v2 with documents: their pre-processing (texts tokenized, images decoded)
/// is a `preprocess` span under the SERVER span, within the request and before its pass,
/// with the counts of texts and images — never the documents.
#[test]
fn documents_pre_processing_is_a_preprocess_span_with_counts_and_no_document() {
    let art = common::made_once("make_documents.py", &["wordpiece.py"], "documents");
    let input = |name: &str, kind: &str, doc: Value| serde_json::json!([{"name": name, "datatype": "BYTES", "shape": [-1], kind: doc}]);
    let text = app_of(
        &art,
        serde_json::json!({"name": "text app", "model": "bert.pt",
            "inputs": input("text", "tokenizer", serde_json::json!({"file": "tokenizer.json", "max_length": 16}))}),
    );
    let image = app_of(
        &art,
        serde_json::json!({"name": "image app", "model": "ident.pt",
            "inputs": input("image", "image", serde_json::json!({"size": [24, 36]}))}),
    );
    let rx = Receiver::start("ok");
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = ["--production", "--workers", "1", "--torch-threads", "1"];
    let (ts, is) = (
        Server::start_env(&text, &args, &env),
        Server::start_env(&image, &args, &env),
    );
    ts.wait_workers(1);
    is.wait_workers(1);
    let png = std::fs::read(art.join("wide.png")).unwrap();
    let v2 = serde_json::json!({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3],
        "data": ["a secret sentence", "another private text", "a third"]}]});
    let cases = [
        (
            &ts,
            "/",
            "text/plain",
            b"one secret sentence".to_vec(),
            1,
            0,
        ),
        (
            &ts,
            "/v2/models/text%20app/infer",
            "application/json",
            serde_json::to_vec(&v2).unwrap(),
            3,
            0,
        ),
        (&is, "/", "image/png", png, 0, 1),
    ];
    for (k, (s, path, ct, body, texts, images)) in cases.into_iter().enumerate() {
        let trace = format!("{:032x}", 0x5eed_0000 + k);
        let extra = format!("Content-Type: {ct}\r\n{}", traceparent(&trace, "01"));
        let r = raw(s.port, "POST", path, &extra, &body);
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let spans = rx.spans_of(&trace, 5);
        let server = spans
            .iter()
            .find(|s| s["kind"] == 2)
            .expect("a SERVER span");
        let pre = by_name(&spans, "preprocess");
        assert_eq!(pre["parent_span_id"], server["span_id"], "{path}");
        assert_eq!(pre["kind"], 1, "INTERNAL");
        let a = &pre["attributes"];
        assert_eq!(a["vramfork.preprocess.texts"], texts, "{path}: {pre:#}");
        assert_eq!(a["vramfork.preprocess.images"], images, "{path}: {pre:#}");
        let forward = by_name(&spans, "forward");
        let at = |s: &Value, k: &str| s[k].as_u64().unwrap();
        assert!(
            at(server, "start") <= at(pre, "start")
                && at(pre, "start") < at(pre, "end")
                && at(pre, "end") <= at(forward, "start"),
            "{path}: pre-processed within the request, before its pass: {spans:#?}"
        );
    }
    for span in rx.all() {
        let text = span.to_string();
        for word in ["secret", "private", "PNG", "iVBOR"] {
            assert!(!text.contains(word), "{word} in {text}");
        }
    }
}

/// `/v1/embeddings`: its tokenizing is a `tokenize` span under the SERVER span, before the
/// pass, with the counts of inputs and tokens (what `usage` says) — never the text.
#[test]
fn an_embeddings_request_has_a_tokenize_span_with_counts_and_no_text() {
    let art = common::made_once("make_embeddings.py", &["wordpiece.py"], "embeddings");
    let app = app_of(
        &art,
        serde_json::json!({
            "name": "text-embedder",
            "model": "bert.pt",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                        "tokenizer": {"file": "tokenizer.json", "max_length": 24, "truncation": true}}],
            "embeddings": {"pooling": "mean", "normalize": true},
            "max_batch_size": 2,
        }),
    );
    let rx = Receiver::start("ok");
    let s = Server::start_env(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--torch-threads",
            "1",
            "--access-log",
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())],
    );
    s.wait_workers(1);
    // `input` embedded in a request of trace `trace`, sampled: the answer.
    let embed = |trace: &str, input: Value| {
        let body = serde_json::json!({"model": "text-embedder", "input": input});
        let extra = format!(
            "Content-Type: application/json\r\n{}",
            traceparent(trace, "01")
        );
        let r = raw(
            s.port,
            "POST",
            "/v1/embeddings",
            &extra,
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        serde_json::from_slice::<Value>(&r.body).unwrap()
    };
    let trace = "8bf92f3577b34da6a3ce929d0e0e4731";
    let answer = embed(
        trace,
        serde_json::json!(["a secret sentence", "another private text here"]),
    );
    let spans = rx.spans_of(trace, 5);
    let server = by_name(&spans, "POST /v1/embeddings");
    let tok = by_name(&spans, "tokenize");
    assert_eq!(tok["parent_span_id"], server["span_id"]);
    assert_eq!(tok["kind"], 1, "INTERNAL");
    let a = &tok["attributes"];
    assert_eq!(a["vramfork.tokenize.inputs"], 2, "{tok:#}");
    assert_eq!(
        a["vramfork.tokenize.tokens"], answer["usage"]["prompt_tokens"],
        "{tok:#}"
    );
    assert_eq!(a["vramfork.tokenize.truncated"], 0, "{tok:#}");
    let forward = by_name(&spans, "forward");
    let (ts, te) = (tok["start"].as_u64().unwrap(), tok["end"].as_u64().unwrap());
    assert!(
        server["start"].as_u64().unwrap() <= ts
            && ts <= te
            && te <= forward["start"].as_u64().unwrap(),
        "tokenized within the request, before its pass: {spans:#?}"
    );
    // Five inputs, two a pass: three passes, each its queue and forward, one after another.
    let trace = "8bf92f3577b34da6a3ce929d0e0e4732";
    embed(trace, serde_json::json!(["a", "b", "c", "d", "e"]));
    let spans = rx.spans_of(trace, 9);
    let named = |name: &str| -> Vec<&Value> {
        let mut v: Vec<&Value> = spans.iter().filter(|s| s["name"] == name).collect();
        v.sort_by_key(|s| s["start"].as_u64());
        v
    };
    let (queues, forwards, answers) = (named("queue"), named("forward"), named("answer"));
    assert_eq!(
        (queues.len(), forwards.len(), answers.len()),
        (3, 3, 1),
        "{spans:#?}"
    );
    let at = |s: &Value, k: &str| s[k].as_u64().unwrap();
    for (k, f) in forwards.iter().enumerate() {
        assert_eq!(f["attributes"]["vramfork.batch.size"], 1, "{f:#}");
        assert!(at(queues[k], "end") <= at(f, "start"), "{spans:#?}");
        if let Some(next) = queues.get(k + 1) {
            assert!(
                at(f, "end") <= at(next, "end"),
                "pass {k} before the next: {spans:#?}"
            );
        }
    }
    assert!(
        at(forwards[2], "end") <= at(answers[0], "start"),
        "{spans:#?}"
    );
    // Its access line's model_ms is its three passes (µs, as the spans are).
    let line = s.poll("the access line of the three passes", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "access" && e.str("trace_id") == Some(trace))
    });
    let passes_us: u64 = forwards
        .iter()
        .map(|f| (at(f, "end") - at(f, "start")) / 1000)
        .sum();
    let model_us = (line.f64("model_ms").unwrap() * 1000.0).round() as u64;
    assert_eq!(model_us, passes_us, "{line:?} {forwards:#?}");
    for span in rx.all() {
        let text = span.to_string();
        for word in ["secret", "private", "sentence"] {
            assert!(!text.contains(word), "{word} in {text}");
        }
    }
}

/// Probes on the serving port (`/healthz`, `/v2/health/live`, `/v2/health/ready`, a model's
/// `ready`) are not exported, even from a sampled caller; their answers still carry
/// `traceparent` (not sampled here: as without an export).
#[test]
fn health_probes_are_not_exported() {
    let rx = Receiver::start("ok");
    let app = mlp();
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())],
    );
    s.wait_workers(1);
    let probes = [
        "/healthz",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/test%20app/ready",
    ];
    let mut traces = Vec::new();
    for (k, path) in probes.iter().enumerate() {
        let trace = format!("9bf92f3577b34da6a3ce929d0e0e47{k:02}");
        let r = raw(s.port, "GET", path, &traceparent(&trace, "01"), b"");
        assert_eq!(r.status, 200, "{path}");
        let back = r.header("traceparent").unwrap_or_else(|| panic!("{path}"));
        assert!(back.starts_with(&format!("00-{trace}-")), "{path}: {back}");
        traces.push(trace);
    }
    // Not sampled here: a probe without a caller's trace gets a new one, flags 00.
    let r = raw(s.port, "GET", "/healthz", "", b"");
    let back = r.header("traceparent").unwrap();
    assert!(back.ends_with("-00"), "{back}");
    // A model request after them: once its spans are in, the probes' would have been.
    let after = "9bf92f3577b34da6a3ce929d0e0e4799";
    post_traced(s.port, after);
    rx.spans_of(after, 4);
    let probed: Vec<Value> = rx
        .all()
        .into_iter()
        .filter(|l| traces.iter().any(|t| l["trace_id"] == t.as_str()))
        .collect();
    assert!(probed.is_empty(), "probes exported: {probed:#?}");
}

/// The receiver over TLS with a certificate `ca` signed (`server`), in `app`'s directory;
/// `client_ca`: a client certificate signed by it is required.
fn tls_receiver(pki: &Pki, client_ca: Option<&str>) -> Receiver {
    tls_receiver_in("ok", pki, client_ca)
}

/// [`tls_receiver`] in another mode of the receiver's.
fn tls_receiver_in(mode: &str, pki: &Pki, client_ca: Option<&str>) -> Receiver {
    let mut args = vec![
        "--tls".into(),
        pki.path("server.pem"),
        pki.path("server.key"),
    ];
    args.extend(client_ca.map(|ca| pki.path(&format!("{ca}.pem"))));
    Receiver::start_with(mode, &args)
}

/// An https endpoint whose CA is given by the variable, with a client certificate (mutual
/// TLS): a traced request's spans arrive, sent by the client certificate's owner.
#[test]
fn spans_go_over_https_verified_by_the_given_ca_with_a_client_certificate() {
    let app = mlp();
    let pki = Pki::new(app.dir.path(), "ca");
    pki.issue("ca", "server");
    pki.issue("ca", "exporter");
    let rx = tls_receiver(&pki, Some("ca"));
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("exporter.pem"),
        pki.path("exporter.key"),
    );
    let endpoint = format!("https://127.0.0.1:{}", rx.port);
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                &format!("{endpoint}/v1/traces"),
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &ca),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
        ],
    );
    s.wait_workers(1);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    post_traced(s.port, trace);
    let spans = rx.spans_of(trace, 1);
    let server = by_name(&spans, "POST /");
    assert_eq!(server["parent_span_id"], CALLER_SPAN, "{server:#?}");
    assert_eq!(
        server["client"], "exporter",
        "the client certificate was sent"
    );
}

/// A collector whose certificate the given CA did not sign, and one whose certificate is
/// for another host: every request is still answered 200, the spans are dropped and
/// counted, and the warning names the certificate problem.
#[test]
fn a_collector_certificate_that_cannot_be_verified_costs_no_request_and_is_named() {
    for (case, want) in [
        ("another CA", "invalid peer certificate: UnknownIssuer"),
        (
            "another host",
            "invalid peer certificate: certificate not valid for name",
        ),
    ] {
        let app = mlp();
        let pki = Pki::new(app.dir.path(), "ca");
        let ca = if case == "another CA" {
            pki.issue("ca", "server");
            Pki::new(app.dir.path(), "other");
            pki.path("other.pem")
        } else {
            pki.issue_for("ca", "server", "DNS:collector.example");
            pki.path("ca.pem")
        };
        let rx = tls_receiver(&pki, None);
        let endpoint = format!("https://127.0.0.1:{}", rx.port);
        let s = Server::start_env(
            &app,
            &["--production", "--workers", "1", "--metrics-port", "0"],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
            ],
        );
        s.wait_workers(1);
        for i in 0..20 {
            let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
            assert_eq!(r.status, 200, "{case}: request {i}");
        }
        let mport = s.metrics_port();
        s.poll(&format!("{case}: spans dropped and counted"), || {
            let d = dropped(&scrape(mport));
            (d > 0).then_some(d)
        });
        let warned = s.poll(&format!("{case}: the warning"), || {
            s.all_events()
                .into_iter()
                .find(|e| e.name == "trace_export_failing")
        });
        let why = warned.message();
        assert!(
            why.contains("TLS handshake") && why.contains(want),
            "{case}: {why}"
        );
        assert!(
            rx.all().iter().all(|l| l["trace_id"].is_null()),
            "{case}: a span reached a collector the exporter cannot trust: {:?}",
            rx.all()
        );
    }
}

/// Three traced requests one after another, each one's spans waited for: three exports.
fn three_exports(s: &Server, rx: &Receiver, case: &str) {
    for i in 0..3 {
        let trace = format!("5bf92f3577b34da6a3ce929d0e0e47{i:02}");
        let r = raw(
            s.port,
            "POST",
            "/",
            &traceparent(&trace, "01"),
            INPUT.as_bytes(),
        );
        assert_eq!(r.status, 200, "{case}: request {i}");
        rx.spans_of(&trace, 4);
    }
}

/// The receiver's lines with `key` (`connection`: one per connection it accepted).
fn lines_with(rx: &Receiver, key: &str) -> Vec<Value> {
    rx.all().into_iter().filter(|l| l[key].is_u64()).collect()
}

/// Exports keep their connection (HTTP/1.1 keep-alive): three exports one after another
/// reach the collector over ONE connection, over http and over https (one TLS handshake).
#[test]
fn exports_keep_one_connection_over_http_and_https() {
    for scheme in ["http", "https"] {
        let app = mlp();
        let pki = Pki::new(app.dir.path(), "ca");
        pki.issue("ca", "server");
        let ca = pki.path("ca.pem");
        let (rx, mut env) = if scheme == "http" {
            (Receiver::start("ok"), vec![])
        } else {
            (
                tls_receiver(&pki, None),
                vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str())],
            )
        };
        let endpoint = format!("{scheme}://127.0.0.1:{}", rx.port);
        env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint));
        let s = Server::start_env(&app, &["--production", "--workers", "1"], &env);
        s.wait_workers(1);
        three_exports(&s, &rx, scheme);
        let connections = lines_with(&rx, "connection");
        assert_eq!(connections.len(), 1, "{scheme}: {connections:?}");
    }
}

/// A collector that closes its connections — after every answer, unannounced (`close`), or
/// just as the next export arrives on it, unanswered (`once`, an idle connection closed at
/// the wrong moment) — still gets every batch: the exporter finds the connection closed and
/// opens a new one at once; nothing is dropped, nothing is logged as failing. Over http and
/// over https (where the closed connection reads as TLS's end, without close_notify).
#[test]
fn a_collector_closing_its_connections_still_gets_every_batch() {
    for (mode, scheme) in [
        ("close", "http"),
        ("once", "http"),
        ("close", "https"),
        ("once", "https"),
    ] {
        let app = mlp();
        let pki = Pki::new(app.dir.path(), "ca");
        pki.issue("ca", "server");
        let ca = pki.path("ca.pem");
        let (rx, mut env) = if scheme == "http" {
            (Receiver::start(mode), vec![])
        } else {
            (
                tls_receiver_in(mode, &pki, None),
                vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str())],
            )
        };
        let endpoint = format!("{scheme}://127.0.0.1:{}", rx.port);
        env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint));
        let s = Server::start_env(
            &app,
            &["--production", "--workers", "1", "--metrics-port", "0"],
            &env,
        );
        s.wait_workers(1);
        let mode = &format!("{mode} over {scheme}");
        three_exports(&s, &rx, mode);
        assert_eq!(
            lines_with(&rx, "connection").len(),
            3,
            "{mode}: a connection per export"
        );
        if mode.starts_with("once") {
            // The second and third exports were each sent on a connection the receiver
            // then closed unanswered, and sent again on a new one.
            assert_eq!(lines_with(&rx, "unanswered").len(), 2, "{mode}");
        }
        assert_eq!(dropped(&scrape(s.metrics_port())), 0, "{mode}");
        let failing: Vec<_> = s
            .all_events()
            .into_iter()
            .filter(|e| e.name == "trace_export_failing")
            .map(|e| e.message().to_string())
            .collect();
        assert!(failing.is_empty(), "{mode}: {failing:?}");
    }
}

/// With no OTLP certificate, the collector's is verified by the CAs of `SSL_CERT_DIR` (a
/// directory as `openssl rehash` makes it: the CA under the name `HASH.0`, the second of a
/// `:` list as OpenSSL reads the variable).
#[test]
fn spans_go_over_https_verified_by_a_ca_of_ssl_cert_dir() {
    let app = mlp();
    let pki = Pki::new(app.dir.path(), "ca");
    pki.issue("ca", "server");
    let certs = app.dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let hash = Command::new("openssl")
        .args(["x509", "-hash", "-noout", "-in", &pki.path("ca.pem")])
        .output()
        .unwrap();
    assert!(hash.status.success());
    let hash = String::from_utf8(hash.stdout).unwrap();
    std::fs::copy(pki.path("ca.pem"), certs.join(format!("{}.0", hash.trim()))).unwrap();
    // The collector's CA is in the second directory of OpenSSL's `:` list; the first holds
    // another CA only.
    Pki::new(app.dir.path(), "other");
    let first = app.dir.path().join("other-certs");
    std::fs::create_dir(&first).unwrap();
    std::fs::copy(pki.path("other.pem"), first.join("other.pem")).unwrap();
    let rx = tls_receiver(&pki, None);
    let endpoint = format!("https://127.0.0.1:{}", rx.port);
    let certs = certs.display().to_string();
    let list = format!("{}:{certs}", first.display());
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("SSL_CERT_DIR", &list),
        ],
    );
    let e = s.wait_event("trace_export", |_| true);
    assert!(
        e.message().contains(&format!("{certs} (SSL_CERT_DIR)")),
        "{}",
        e.message()
    );
    s.wait_workers(1);
    let trace = "6bf92f3577b34da6a3ce929d0e0e4736";
    post_traced(s.port, trace);
    rx.spans_of(trace, 4);
}
