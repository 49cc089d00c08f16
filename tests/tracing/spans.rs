//! What the spans are: a batched pass is one forward span linking its members, a gRPC call
//! handed to a sibling stays in its trace, pre-processing and tokenizing have their spans with
//! counts and no payload, health probes are not exported.

use super::*;

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
    // Five inputs, two a pass: three passes, each its queue and forward, one after another,
    // shortest rows first, each with its tokens (each word one token, [CLS] and [SEP]
    // around: 5, 3, 4, 6 and 3 tokens make passes of 3 + 3, 4 + 5 padded to 5, and 6).
    let trace = "8bf92f3577b34da6a3ce929d0e0e4732";
    embed(
        trace,
        serde_json::json!(["a b c", "a", "a b", "a b c d", "b"]),
    );
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
    let tokens: Vec<(u64, u64, f64)> = forwards
        .iter()
        .map(|f| {
            let a = &f["attributes"];
            let n = |k: &str| a[k].as_u64().unwrap_or_else(|| panic!("{k} in {f:#}"));
            let e = a["vramfork.pass.padding_efficiency"].as_f64();
            (
                n("vramfork.pass.tokens"),
                n("vramfork.pass.padded_tokens"),
                e.unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tokens,
        vec![(6, 6, 1.0), (9, 10, 0.9), (6, 6, 1.0)],
        "{forwards:#?}"
    );
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
