//! The KServe v2 gRPC service end to end: the real `app --production` driven by
//! NVIDIA's own client from PyPI (`tritonclient[grpc]`, through
//! `tests/support/triton_grpc.py`): health, metadata, inference with raw and typed contents
//! against torch's outputs (`tests/fixtures/mlp_expected.json`), a stream, the error mapping
//! (bad tensors, unknown models, methods not served, auth), deadlines, REST and gRPC on one
//! port, TLS; and the per-request balancing: the calls one client multiplexes on one
//! channel spread over the idle workers (`worker/src/siblings/`), sequential calls keep
//! their connection, and a closed loop over workers recycling every 50 requests sees no
//! error.

mod common;

use std::process::Command;

use common::pki::Pki;
use common::{close, fixtures, http, App, Server, MLP_INPUT};
use serde_json::{json, Value};

fn grpc(args: &[&str]) -> Value {
    common::python_json("triton_grpc.py", args, b"")
}

/// The MLP with its declared input and a version (as tests/v2.rs).
fn mlp() -> App {
    App::new(
        "mlp.pt",
        r#""version": "3", "input": {"shape": [-1, 4], "dtype": "float32"}"#,
    )
}

/// The model whose pass runs as many iterations as its input says (0.2 s for 20,000 on the
/// build machine).
fn slow() -> App {
    App::new(
        "slow.pt",
        r#""input": {"shape": [1, 1], "dtype": "float32"}"#,
    )
}

fn status(v: &Value) -> &str {
    v["error"]["status"].as_str().unwrap_or("(no error)")
}

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

#[test]
fn tritonclient_grpc_drives_health_metadata_inference_streams_and_errors_beside_rest() {
    let app = mlp();
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "2",
            "--access-log",
            "--metrics-port",
            "0",
        ],
    );
    let pids = s.wait_workers(2);
    let url = format!("127.0.0.1:{}", s.port);
    let cases = fixtures().join("mlp_expected.json");
    let r = grpc(&["basics", &url, "test app", cases.to_str().unwrap()]);
    assert_eq!(
        (&r["live"], &r["ready"], &r["model_ready"]),
        (&json!(true), &json!(true), &json!(true)),
        "{r}"
    );
    assert_eq!(r["server_metadata"]["name"], "vramfork");
    let m = &r["model_metadata"];
    assert_eq!(m["name"], "test app");
    assert_eq!(m["versions"], json!(["3"]));
    assert_eq!(m["platform"], "pytorch_libtorch");
    assert_eq!(
        m["inputs"],
        json!([{"name": "input__0", "datatype": "FP32", "shape": ["-1", "4"]}])
    );
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 3);
    for c in cases {
        for (how, got) in c["seen"].as_object().unwrap() {
            assert!(
                close(&got["output"], &c["expected"]),
                "{how}: {} vs torch's {}",
                got["output"],
                c["expected"]
            );
        }
        let seen = &c["seen"];
        assert_eq!(seen["raw"]["id"], "req-7", "the request's id is echoed");
        assert_eq!(seen["raw"]["dtype"], "float32");
        assert_eq!(seen["typed"]["id"], "typed-1");
        // Without an id, the answer's is the request id the worker made (32 hex digits).
        assert_eq!(seen["no_id"]["id"].as_str().unwrap().len(), 32, "{seen}");
        let md = &seen["typed"]["metadata"];
        let pid: u32 = md["x-worker-pid"].as_str().unwrap().parse().unwrap();
        assert!(pids.contains(&pid), "{md}");
        assert!(md["x-request-id"].is_string(), "{md}");
    }
    let e = &r["errors"];
    assert_eq!(status(&e["unknown_model"]), "StatusCode.NOT_FOUND", "{e}");
    assert!(message(&e["unknown_model"]).contains("'test app'"), "{e}");
    assert_eq!(status(&e["unknown_version"]), "StatusCode.NOT_FOUND", "{e}");
    for bad in ["bad_shape", "bad_dtype", "unknown_output", "typed_count"] {
        assert_eq!(status(&e[bad]), "StatusCode.INVALID_ARGUMENT", "{bad}: {e}");
    }
    assert!(message(&e["bad_shape"]).contains("input__0"), "{e}");
    assert!(message(&e["bad_dtype"]).contains("INT64"), "{e}");
    assert!(message(&e["unknown_output"]).contains("'nope'"), "{e}");
    assert!(message(&e["typed_count"]).contains("fp32_contents"), "{e}");
    assert_eq!(status(&e["not_served"]), "StatusCode.UNIMPLEMENTED", "{e}");
    assert!(message(&e["not_served"]).contains("ModelConfig"), "{e}");
    // The error's type, as REST's body has it, in the trailers.
    let t = &e["typed_trailers"]["error"]["trailers"];
    assert_eq!(t["x-error-type"], "invalid_input", "{e}");
    // A stream: answered in order, a bad request's error on it, the stream going on.
    let st = r["stream"].as_array().unwrap();
    assert_eq!(st.len(), 3, "{st:?}");
    assert_eq!(st[0]["id"], "s1");
    assert!(
        st[1]["error"].as_str().unwrap().contains("input__0"),
        "{st:?}"
    );
    assert_eq!(st[2]["id"], "s3");
    assert!(!close(&st[2]["output"], &st[0]["output"]), "{st:?}");
    // REST on the same port, then and still: the same answer as gRPC's for [[1, 2, 3, 4]].
    let rest = http(s.port, "POST", "/", Some(MLP_INPUT));
    assert_eq!(rest.status, 200, "{}", rest.body);
    assert!(
        close(&rest.json()["outputs"], &st[0]["output"]),
        "{}",
        rest.body
    );
    // Every worker survived every error; each answer logged and counted as gRPC.
    assert_eq!(s.ready_pids(), pids);
    // The access line of the call whose x-request-id metadata was "meta-7" (the message's
    // `id` is the answer's, as REST v2's body `id`).
    let line = s.poll("the access line of meta-7", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "access" && e.str("request_id") == Some("meta-7"))
    });
    assert_eq!(
        line.str("path"),
        Some("/inference.GRPCInferenceService/ModelInfer")
    );
    assert_eq!(line.u64("status"), Some(200));
    let port = s.metrics_port();
    s.poll("gRPC answers in /metrics", || {
        let body = http(port, "GET", "/metrics", None).body;
        (body.contains(r#"endpoint="grpc-infer",code="200""#)
            && body.contains(r#"endpoint="grpc-infer",code="400""#)
            && body.contains(r#"endpoint="grpc",code="501""#))
        .then_some(())
    });
}

/// The pids of `round`'s answers, sorted.
fn round_pids(round: &Value) -> Vec<u32> {
    let mut p: Vec<u32> = round
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p.as_str()
                .expect("every answer has x-worker-pid")
                .parse()
                .unwrap()
        })
        .collect();
    p.sort();
    p
}

/// N calls at once on one channel (one connection, so one worker accepts them all), N
/// workers, 25 rounds: every round runs one call on each worker, the accepting worker
/// handing the calls it would queue to its idle siblings.
#[test]
fn n_calls_on_one_channel_run_on_n_workers() {
    let app = slow();
    let n = 3;
    let s = Server::start(
        &app,
        &["--production", "--workers", "3", "--torch-threads", "1"],
    );
    let mut pids = s.wait_workers(n);
    pids.sort();
    let url = format!("127.0.0.1:{}", s.port);
    let r = grpc(&["spread", &url, "test app", "3", "20000", "25"]);
    assert_eq!(r["errors"], json!([]), "{r}");
    let rounds = r["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 25);
    for (i, round) in rounds.iter().enumerate() {
        assert_eq!(
            round_pids(round),
            pids,
            "round {i}: the {n} calls ran on every worker once: {r}"
        );
    }
}

/// 2N calls on N workers: every round keeps every worker busy, and (passes on a busy
/// machine vary in length, so a worker done early rightly takes a third) within 25 rounds
/// one runs exactly two on each.
#[test]
fn two_n_calls_on_n_workers_run_two_per_worker() {
    let app = slow();
    let s = Server::start(
        &app,
        &["--production", "--workers", "2", "--torch-threads", "1"],
    );
    let mut pids = s.wait_workers(2);
    pids.sort();
    let url = format!("127.0.0.1:{}", s.port);
    let r = grpc(&["spread", &url, "test app", "4", "20000", "25", "2"]);
    assert_eq!(r["errors"], json!([]), "{r}");
    let rounds = r["rounds"].as_array().unwrap();
    for (i, round) in rounds.iter().enumerate() {
        let mut ran = round_pids(round);
        ran.dedup();
        assert_eq!(
            ran, pids,
            "round {i}: every worker ran some of the calls: {r}"
        );
    }
    let twice: Vec<u32> = pids.iter().flat_map(|p| [*p, *p]).collect();
    assert_eq!(
        round_pids(rounds.last().unwrap()),
        twice,
        "no round in 25 ran two calls per worker: {r}"
    );
}

#[test]
fn sequential_calls_with_idle_siblings_keep_their_connection() {
    let app = mlp();
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    s.wait_workers(2);
    let url = format!("127.0.0.1:{}", s.port);
    let r = grpc(&["sequential", &url, "test app", "200"]);
    assert_eq!(r["errors"], json!([]), "{r}");
    assert!(
        r["connections"].as_u64().unwrap() <= 2,
        "200 calls one after the other, siblings idle: {r}"
    );
}

#[test]
fn a_closed_loop_over_workers_recycling_every_50_requests_has_no_errors() {
    let app = mlp();
    let s = Server::start(
        &app,
        &["--production", "--workers", "2", "--max-requests", "50"],
    );
    s.wait_workers(2);
    let url = format!("127.0.0.1:{}", s.port);
    let r = grpc(&["loop", &url, "test app", "8", "10"]);
    assert_eq!(r["errors"], json!([]), "{r}");
    let done = r["done"].as_u64().unwrap();
    assert!(done > 100, "{r}");
    s.poll("workers recycled by --max-requests", || {
        let n = s
            .events_named("worker_exited")
            .iter()
            .filter(|e| e.str("reason") == Some("max_requests"))
            .count();
        (n >= 2).then_some(())
    });
}

#[test]
fn token_auth_reads_the_authorization_metadata() {
    let app = mlp();
    let keys = app.dir.path().join("keys");
    std::fs::write(&keys, "k-grpc-0123456789abcdef\n").unwrap();
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--api-key-file",
            keys.to_str().unwrap(),
        ],
    );
    s.wait_workers(1);
    let url = format!("127.0.0.1:{}", s.port);
    let r = grpc(&["auth", &url, "test app", "k-grpc-0123456789abcdef"]);
    assert_eq!(r["live_without_key"]["ok"], true, "{r}");
    assert_eq!(r["ready_without_key"]["ok"], true, "{r}");
    for refused in ["missing", "missing_metadata", "wrong"] {
        assert_eq!(
            status(&r[refused]),
            "StatusCode.UNAUTHENTICATED",
            "{refused}: {r}"
        );
    }
    assert_eq!(
        r["wrong_trailers"]["error"]["trailers"]["x-error-type"], "unauthorized",
        "{r}"
    );
    assert!(r["good"]["ok"].is_array(), "{r}");
}

/// slowcount.pt's passes before the one that answers (asked over REST, not counted).
fn passes(s: &Server) -> f64 {
    let r = http(s.port, "POST", "/", Some(r#"{"inputs": [[1]]}"#));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["outputs"][0][0].as_f64().unwrap()
}

/// Deadlines as tests/deadlines.rs tests REST's, on slowcount.pt (its answer says how many
/// passes ran before it): behind a long pass on the one worker, a call whose
/// `parameters.timeout` passes is refused, and one whose client deadline (`grpc-timeout`)
/// passes is never run.
#[test]
fn deadlines_reach_a_call_waiting_for_the_model() {
    let app = App::new("slowcount.pt", "");
    // One torch thread and no queue limit, as tests/deadlines.rs (a busy machine's cores).
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--torch-threads",
            "1",
            "--max-queue-wait",
            "0",
        ],
    );
    s.wait_workers(1);
    // TorchScript profiles the loop's first two passes (slow): three small ones first.
    for _ in 0..3 {
        passes(&s);
    }
    let port = s.port;
    let long = std::thread::spawn(move || {
        http(port, "POST", "/", Some(r#"{"inputs": [[150000]]}"#)).status
    });
    s.wait_pool(|p| p.u64("in_flight") == Some(1));
    let url = format!("127.0.0.1:{}", s.port);
    let r = grpc(&["deadline", &url, "test app"]);
    // parameters.timeout (100 ms) passed while it waited: refused, never run; a deadline
    // that passed is DEADLINE_EXCEEDED, which a client does not retry.
    assert_eq!(
        status(&r["parameter"]),
        "StatusCode.DEADLINE_EXCEEDED",
        "{r}"
    );
    assert!(message(&r["parameter"]).contains("did not run"), "{r}");
    // grpc-timeout (200 ms): the client gave up.
    assert_eq!(
        status(&r["grpc_timeout"]),
        "StatusCode.DEADLINE_EXCEEDED",
        "{r}"
    );
    // A call without a deadline waits for the long pass, then runs: after the three
    // warm-up passes and the long one, never the two above.
    assert_eq!(r["after"]["ok"], json!([[4.0, 1.0]]), "{r}");
    assert_eq!(long.join().unwrap(), 200);
    // Nor later: the passes so far are the five above.
    assert_eq!(passes(&s), 5.0);
    assert_eq!(s.ready_pids().len(), 1);
}

#[test]
fn grpc_and_https_share_the_port_under_tls() {
    let app = mlp();
    let pki = Pki::new(app.dir.path(), "ca");
    pki.issue("ca", "server");
    let path = |f: &str| pki.path(f);
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "2",
            "--tls-cert",
            &path("server.pem"),
            "--tls-key",
            &path("server.key"),
        ],
    );
    s.wait_workers(2);
    let url = format!("127.0.0.1:{}", s.port);
    let r = grpc(&["tls", &url, &path("ca.pem"), "test app"]);
    assert_eq!(r["live"]["ok"], true, "{r}");
    assert!(r["infer"]["ok"].is_array(), "{r}");
    // HTTPS (HTTP/1.1) on the same port.
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "--http1.1",
            "--cacert",
            &path("ca.pem"),
        ])
        .args(["-XPOST", "-d", MLP_INPUT])
        .arg(format!("https://127.0.0.1:{}/", s.port))
        .output()
        .expect("run curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("outputs"), "{body}");
}

/// What grpcio never sends, answered as the gRPC HTTP/2 specification asks, by a
/// client that sends frames as given (`tests/support/grpc_raw.py`): an expired deadline is
/// `DEADLINE_EXCEEDED` (a client does not retry it), a subtype other than protobuf and an
/// encoding other than `identity` are `UNIMPLEMENTED`, a content type that is not gRPC's on
/// the service's path is HTTP 415 (not REST's 404); the worker serves on.
#[test]
fn statuses_for_what_grpcio_never_sends_follow_the_grpc_specification() {
    let app = mlp();
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let pids = s.wait_workers(1);
    let url = format!("127.0.0.1:{}", s.port);
    let infer = "/inference.GRPCInferenceService/ModelInfer";
    let live = "/inference.GRPCInferenceService/ServerLive";
    let call = |path: &str, ct: &str, extra: &[&str]| {
        let mut args = vec![url.as_str(), path, ct];
        args.extend_from_slice(extra);
        common::python_json("grpc_raw.py", &args, b"")
    };
    // The status of a Trailers-Only answer is in its head; of the others, in the trailers.
    let grpc_status = |r: &Value| {
        r["headers"]["grpc-status"]
            .as_str()
            .or(r["trailers"]["grpc-status"].as_str())
            .unwrap_or_else(|| panic!("no grpc-status: {r}"))
            .to_string()
    };
    let ok = call(live, "application/grpc", &[]);
    assert_eq!(
        (ok["status"].as_str(), grpc_status(&ok).as_str()),
        (Some("200"), "0"),
        "{ok}"
    );
    assert_eq!(ok["headers"]["grpc-accept-encoding"], "identity", "{ok}");
    let plus_proto = call(live, "application/grpc+proto", &[]);
    assert_eq!(grpc_status(&plus_proto), "0", "{plus_proto}");

    let expired = call(infer, "application/grpc", &["grpc-timeout=0S"]);
    assert_eq!(grpc_status(&expired), "4", "DEADLINE_EXCEEDED: {expired}");
    assert_eq!(
        expired["headers"]["x-error-type"], "deadline_expired",
        "{expired}"
    );

    let json = call(live, "application/grpc+json", &[]);
    assert_eq!(grpc_status(&json), "12", "UNIMPLEMENTED: {json}");
    let m = json["headers"]["grpc-message"].as_str().unwrap_or_default();
    assert!(
        m.contains("application/grpc+json") && m.contains("protobuf"),
        "{json}"
    );

    let gzip = call(infer, "application/grpc", &["grpc-encoding=gzip"]);
    assert_eq!(grpc_status(&gzip), "12", "UNIMPLEMENTED: {gzip}");
    let m = gzip["headers"]["grpc-message"].as_str().unwrap_or_default();
    assert!(m.contains("gzip") && m.contains("identity"), "{gzip}");

    for ct in ["text/plain", "-"] {
        let plain = call(live, ct, &[]);
        assert_eq!(plain["status"], "415", "{ct}: {plain}");
        assert_eq!(grpc_status(&plain), "13", "INTERNAL: {plain}");
        assert_eq!(plain["headers"]["x-error-type"], "unsupported_media_type");
    }
    // REST over HTTP/2 elsewhere is REST's still.
    let rest = call("/nope", "text/plain", &[]);
    assert_eq!(rest["status"], "404", "{rest}");
    assert_eq!(s.ready_pids(), pids);
}
