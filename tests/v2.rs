//! The Open Inference Protocol (KServe v2 REST) end to end: the real `app --production`
//! serving the MLP fixture, driven by NVIDIA's own client from PyPI (`tritonclient[http]`,
//! through `tests/support/triton_client.py`) and by raw HTTP for every error status and a
//! fuzz of malformed requests. Outputs are checked against what torch computed when the
//! fixture was made (`tests/fixtures/mlp_expected.json`).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{binary, close, fixtures, raw, App, Server};
use serde_json::Value;

/// The MLP with its declared input and a version; the model's v2 name is the metadata's.
fn app() -> App {
    App::new(
        "mlp.pt",
        r#""version": "3", "input": {"shape": [-1, 4], "dtype": "float32"}"#,
    )
}

/// `test app` as a path segment.
const MODEL: &str = "test%20app";

fn triton(args: &[&str]) -> Value {
    common::python_json("triton_client.py", args, b"")
}

#[test]
fn tritonclient_drives_health_metadata_and_inference_with_json_and_binary_data() {
    let app = app();
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    s.wait_workers(2);
    let url = format!("127.0.0.1:{}", s.port);
    let cases = fixtures().join("mlp_expected.json");
    let r = triton(&[&url, "test app", cases.to_str().unwrap()]);
    assert_eq!(
        (&r["live"], &r["ready"], &r["model_ready"]),
        (&Value::Bool(true), &Value::Bool(true), &Value::Bool(true))
    );
    assert_eq!(r["server_metadata"]["name"], "vramfork");
    assert_eq!(r["server_metadata"]["extensions"][0], "binary_tensor_data");
    let m = &r["model_metadata"];
    assert_eq!(m["name"], "test app");
    assert_eq!(m["versions"], serde_json::json!(["3"]));
    assert_eq!(m["platform"], "pytorch_libtorch");
    assert_eq!(
        m["inputs"],
        serde_json::json!([{"name": "input__0", "datatype": "FP32", "shape": [-1, 4]}])
    );
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 3);
    for c in cases {
        let seen = c["seen"].as_object().unwrap();
        assert_eq!(
            seen.len(),
            5,
            "JSON and binary in and out, and all outputs: {seen:?}"
        );
        for (how, got) in seen {
            assert!(
                close(&got["output"], &c["expected"]),
                "{how}: {} vs torch's {}",
                got["output"],
                c["expected"]
            );
            if how != "all_outputs" {
                assert_eq!(got["dtype"], "float32", "{how}");
                assert_eq!(got["id"], "req-7", "{how}: the request id is echoed");
                assert_eq!(got["model_name"], "test app", "{how}");
            }
        }
    }
    let e = &r["errors"];
    assert_eq!(e["unknown_model"]["status"], "404", "{e}");
    assert!(e["unknown_model"]["message"]
        .as_str()
        .unwrap()
        .contains("'test app'"));
    assert_eq!(e["bad_shape"]["status"], "400", "{e}");
    assert!(e["bad_shape"]["message"]
        .as_str()
        .unwrap()
        .contains("input__0"));
    assert_eq!(e["unknown_output"]["status"], "400", "{e}");
    assert!(e["unknown_output"]["message"]
        .as_str()
        .unwrap()
        .contains("'nope'"));
}

#[test]
fn tritonclient_concurrent_run_with_max_requests_1_has_no_errors() {
    let app = app();
    let s = Server::start(
        &app,
        &["--production", "--workers", "2", "--max-requests", "1"],
    );
    s.wait_workers(2);
    let url = format!("127.0.0.1:{}", s.port);
    let r = triton(&[&url, "test app", "-", "4", "25"]);
    assert_eq!(r["errors"], serde_json::json!([]), "{r}");
    assert_eq!(r["done"], 100);
    // Every inference recycled a worker.
    s.poll("100 workers retired after their one request", || {
        let n = s
            .events_named("worker_exited")
            .iter()
            .filter(|e| e.str("reason") == Some("max_requests"))
            .count();
        (n >= 100).then_some(())
    });
}

fn infer_path() -> String {
    format!("/v2/models/{MODEL}/versions/3/infer")
}

#[test]
fn every_v2_error_has_its_status_and_the_worker_survives_a_fuzz() {
    let app = app();
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--max-body-mb", "1"],
    );
    let pid = s.wait_workers(1)[0];
    let port = s.port;
    let ok = r#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
    // Routes, methods, names.
    let cases: Vec<(&str, String, u16)> = vec![
        ("GET", "/v2".into(), 200),
        ("GET", "/v2/health/live".into(), 200),
        ("GET", "/v2/health/ready".into(), 200),
        ("GET", format!("/v2/models/{MODEL}"), 200),
        ("GET", format!("/v2/models/{MODEL}/versions/3"), 200),
        ("GET", format!("/v2/models/{MODEL}/ready"), 200),
        ("GET", format!("/v2/models/{MODEL}/versions/3/ready"), 200),
        ("GET", "/v2/models/other".into(), 404),
        ("GET", format!("/v2/models/{MODEL}/versions/9"), 404),
        ("GET", format!("/v2/models/{MODEL}/nothing"), 404),
        ("GET", "/v2/repository/index".into(), 404),
        ("GET", infer_path(), 405),
        ("POST", "/v2/health/live".into(), 405),
        ("DELETE", format!("/v2/models/{MODEL}"), 405),
    ];
    for (method, path, want) in &cases {
        let r = raw(port, method, path, "", b"");
        assert_eq!(
            r.status,
            *want,
            "{method} {path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(r.json().is_object(), "{method} {path}: JSON");
        assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
        if r.status == 405 {
            assert!(r.header("allow").is_some(), "{method} {path}: Allow");
        }
        if r.status == 404 && path.contains("other") {
            assert!(r.json()["error"].as_str().unwrap().contains("'test app'"));
        }
    }
    // Inference: JSON, hwFetch by parameter and by query, binary output.
    let r = raw(port, "POST", &infer_path(), "", ok.as_bytes());
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(
        (&v["model_name"], &v["model_version"]),
        (&"test app".into(), &"3".into())
    );
    // No `id` in the body: the answer's is the request id, made by the worker and sent back
    // as X-Request-Id.
    let made = r
        .header("x-request-id")
        .expect("every answer carries X-Request-Id");
    assert_eq!(v["id"], made, "{v}");
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!([1, 3]));
    let with_hw = ok.replacen('{', r#"{"parameters":{"hwFetch":true},"#, 1);
    for (path, body) in [
        (infer_path(), with_hw.as_str()),
        (format!("{}?hwFetch=true", infer_path()), ok),
    ] {
        let v = raw(port, "POST", &path, "", body.as_bytes()).json();
        let line = v["parameters"]["hwFetch"].as_str().unwrap_or_default();
        assert!(
            line.starts_with("CPU only (no NVIDIA GPU), "),
            "{path}: {v}"
        );
    }
    let data: Vec<u8> = [1f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    let (h, body) = binary(
        r#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}],"parameters":{"binary_data_output":true}}"#,
        &data,
    );
    let r = raw(port, "POST", &infer_path(), &h, &body);
    assert_eq!(r.status, 200);
    let (head, tail) = r.binary_parts();
    assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], 12);
    assert_eq!(tail.len(), 12);
    let first = f32::from_le_bytes(tail[..4].try_into().unwrap());
    assert!((first - -0.11241218).abs() < 1e-6, "{first}");

    // The fuzz: every malformed request is a 400 from the same worker.
    let fuzz: Vec<(String, Vec<u8>)> = vec![
        (String::new(), b"{".to_vec()),
        (String::new(), b"[]".to_vec()),
        (String::new(), br#"{"inputs":[]}"#.to_vec()),
        (String::new(), br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3]}]}"#.to_vec()),
        (String::new(), br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3,"4"]}]}"#.to_vec()),
        (String::new(), br#"{"inputs":[{"name":"input__0","shape":[1,-4],"datatype":"FP32","data":[1,2,3,4]}]}"#.to_vec()),
        (String::new(), br#"{"inputs":[{"name":"input__0","shape":[9223372036854775807,4],"datatype":"FP32","data":[1]}]}"#.to_vec()),
        (String::new(), br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"BYTES","data":["a","b","c","d"]}]}"#.to_vec()),
        (String::new(), br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"INT64","data":[1,2,3,4]}]}"#.to_vec()),
        (String::new(), br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}],"outputs":[{"name":"output__7"}]}"#.to_vec()),
        ("Inference-Header-Content-Length: x\r\n".into(), ok.as_bytes().to_vec()),
        ("Inference-Header-Content-Length: 99999\r\n".into(), ok.as_bytes().to_vec()),
        binary(r#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":20}}]}"#, &[0; 20]),
        binary(r#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}"#, &[0; 12]),
        binary(r#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}"#, &[0; 21]),
        binary(r#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":5}}]}"#, &[0; 5]),
        binary(r#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":-16}}]}"#, &[0; 16]),
    ];
    for (h, body) in &fuzz {
        let r = raw(port, "POST", &infer_path(), h, body);
        assert_eq!(
            r.status,
            400,
            "{h}{}: {}",
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(&r.body)
        );
        assert!(r.json()["error"].is_string());
        assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    }
    // Body limit before buffering: a 2 MB Content-Length gets 413 before any body byte is
    // sent (sending 2 MB the server will not read would end in a reset, not an answer).
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        infer_path(),
        2 << 20
    );
    c.write_all(head.as_bytes()).unwrap();
    let mut all = Vec::new();
    c.read_to_end(&mut all).unwrap();
    let (status, _, _) = common::parse_raw(&all).unwrap();
    assert_eq!(status, 413);
    assert_eq!(s.wait_workers(1), vec![pid], "one worker, never replaced");
}

#[test]
fn v2_inferences_count_towards_recycling() {
    let app = app();
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--max-requests", "3"],
    );
    let first = s.wait_workers(1)[0];
    let ok = r#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
    let pids: Vec<u32> = (0..3)
        .map(|_| {
            let r = raw(s.port, "POST", &infer_path(), "", ok.as_bytes());
            assert_eq!(r.status, 200);
            r.header("x-worker-pid").unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(pids, vec![first; 3]);
    let e = s.wait_event("worker_exited", |e| e.u64("pid") == Some(first.into()));
    assert_eq!(e.str("reason"), Some("max_requests"));
    assert_eq!(e.u64("served"), Some(3));
}
