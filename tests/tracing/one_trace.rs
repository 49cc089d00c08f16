//! A traced request is one trace with its queue, forward and answer time under the caller's
//! span; the sampled flag is honoured both ways.

use super::*;

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
