//! The worker's HTTP API against the real binary and real TorchScript fixtures: answers,
//! every error status, hwFetch, and that no bad request hurts the worker.

mod util;

use serde_json::{json, Value};
use util::{config, http, Worker};

fn mlp() -> Worker {
    Worker::ready(config("mlp", |_| {}))
}

fn assert_close(got: &Value, want: &Value, tol: f64) {
    match (got, want) {
        (Value::Array(g), Value::Array(w)) => {
            assert_eq!(g.len(), w.len(), "{got} vs {want}");
            for (a, b) in g.iter().zip(w) {
                assert_close(a, b, tol);
            }
        }
        _ => {
            let (a, b) = (got.as_f64().unwrap(), want.as_f64().unwrap());
            assert!((a - b).abs() <= tol, "{a} vs {b}");
        }
    }
}

#[test]
fn mlp_outputs_equal_torch_and_metadata_is_served_whole() {
    let w = mlp();
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(util::fixtures().join("mlp_expected.json")).unwrap(),
    )
    .unwrap();
    let cases = expected["cases"].as_array().unwrap();
    assert!(cases.len() >= 3);
    for case in cases {
        let r = w.post("/", &json!({"inputs": case["inputs"]}).to_string());
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.pid(), w.pid());
        assert_eq!(r.header("content-type"), Some("application/json"));
        let body = r.json();
        assert!(body.get("hwFetch").is_none());
        assert_close(&body["outputs"], &case["outputs"], 1e-5);
    }

    let r = w.get("/");
    assert_eq!(r.status, 200);
    assert_eq!(r.pid(), w.pid());
    let mut md: Value =
        serde_json::from_str(&std::fs::read_to_string(util::fixtures().join("mlp.json")).unwrap())
            .unwrap();
    // With KServe v1's liveness answer beside it.
    md["status"] = json!("alive");
    assert_eq!(
        r.json(),
        md,
        "GET / returns the metadata as written, unknown fields kept"
    );

    let r = w.get("/healthz");
    assert_eq!((r.status, r.json()), (200, json!({"status": "ok"})));
    assert_eq!(r.pid(), w.pid());
}

#[test]
fn every_bad_request_gets_its_status_and_the_worker_keeps_serving() {
    let w = mlp();
    let good = r#"{"inputs": [[1, 2, 3, 4]]}"#;
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        ("POST", "/", "{\"inputs\": [[1, 2", 400, "not valid JSON"),
        ("POST", "/", "", 400, "not valid JSON"),
        (
            "POST",
            "/",
            r#"{"input": [[1, 2, 3, 4]]}"#,
            400,
            "no `inputs` field",
        ),
        (
            "POST",
            "/",
            r#"[[1, 2, 3, 4]]"#,
            400,
            "must be a JSON object",
        ),
        (
            "POST",
            "/",
            r#"{"inputs": 5}"#,
            400,
            "must be a (nested) array",
        ),
        (
            "POST",
            "/",
            r#"{"inputs": [[1, 2, 3, 4], [1, 2]]}"#,
            400,
            "ragged array: inputs[1] has 2 elements",
        ),
        (
            "POST",
            "/",
            r#"{"inputs": [[1, 2, "3", 4]]}"#,
            400,
            "inputs[0][2] is a string",
        ),
        (
            "POST",
            "/",
            r#"{"inputs": [[1, 2, 3]]}"#,
            400,
            "shape [1, 3], the model expects [-1, 4]",
        ),
        ("POST", "/", r#"{"inputs": [1, 2, 3, 4]}"#, 400, "shape [4]"),
        (
            "POST",
            "/",
            r#"{"inputs": [[1, 2, 3, 1e39]]}"#,
            400,
            "inputs[0][3] is 1e39, out of range for dtype float32",
        ),
        ("GET", "/?hwFetch=maybe", "", 400, "`hwFetch`"),
        ("POST", "/?hwFetch=maybe", good, 400, "accepted: true"),
        ("GET", "/nope", "", 404, "no route for GET /nope"),
        ("POST", "/healthz/x", good, 404, "no route"),
        ("PUT", "/", good, 405, "method PUT is not allowed on /"),
        ("DELETE", "/healthz", "", 405, "allowed: GET"),
    ];
    for (method, path, body, status, msg) in cases {
        let r = http(w.addr, method, path, &[], body.as_bytes());
        assert_eq!(
            r.status,
            *status,
            "{method} {path} {body}: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.pid(), w.pid(), "X-Worker-Pid on errors too");
        let e = r.error();
        assert!(
            e.contains(msg),
            "{method} {path} {body}: {e:?} lacks {msg:?}"
        );
        if *status == 405 {
            let allow = r.header("allow").expect("405 carries Allow");
            assert!(allow.contains("GET"), "{allow}");
        }
        let ok = w.post("/", good);
        assert_eq!(
            (ok.status, ok.pid()),
            (200, w.pid()),
            "the same worker still serves"
        );
    }
}

#[test]
fn bodies_over_the_limit_get_413_by_header_and_while_streaming() {
    let w = mlp(); // max_body_bytes = 4096
    let big = format!("{{\"inputs\": [[{}]]}}", vec!["1.0"; 2000].join(","));
    assert!(big.len() > 4096);
    let r = w.post("/", &big);
    assert_eq!(r.status, 413);
    assert!(r.error().contains("4096 bytes"), "{}", r.error());
    assert_eq!(r.pid(), w.pid());

    // Chunked: no Content-Length up front, so the limit must hold while streaming.
    let mut chunked = Vec::new();
    for piece in big.as_bytes().chunks(1000) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let mut c = w.connect();
    use std::io::Write;
    c.stream
        .write_all(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    let _ = c.stream.write_all(&chunked);
    let r = c.read_response();
    assert_eq!(r.status, 413);
    assert_eq!(r.pid(), w.pid());
    assert_eq!(w.post("/", r#"{"inputs": [[1, 2, 3, 4]]}"#).status, 200);
}

#[test]
fn a_model_that_raises_gets_500_with_its_message() {
    let w = Worker::ready(config("fail", |_| {}));
    let r = w.post("/", r#"{"inputs": [[1.0, -5.0]]}"#);
    assert_eq!(r.status, 500);
    assert_eq!(r.pid(), w.pid());
    let e = r.error();
    assert!(
        e.contains("negative input sum is not allowed by fail.pt"),
        "{e}"
    );
    assert!(!e.contains("Traceback"), "only the useful line: {e}");
    let r = w.post("/", r#"{"inputs": [[1.0, 2.5]]}"#);
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"outputs": [[2.0, 5.0]]}))
    );
    assert_eq!(r.pid(), w.pid());
}

#[test]
fn tuple_and_scalar_outputs_become_arrays() {
    let w = Worker::ready(config("tuple", |_| {}));
    let r = w.post("/", r#"{"inputs": [[1, 2]]}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["outputs"], json!([[[2.0, 3.0]], 3.0]));
    // Empty input is fine when the metadata allows any shape.
    let r = w.post("/", r#"{"inputs": []}"#);
    assert_eq!(
        (r.status, r.json()["outputs"].clone()),
        (200, json!([[], 0.0]))
    );

    let w = Worker::ready(config("scalars", |_| {}));
    let r = w.post("/", r#"{"inputs": [0.5, 1.5]}"#);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["outputs"],
        json!([[[0.5, 1.5], [0.0, 0.0]], 2, 2.0, true])
    );
}

/// `CPU only (no NVIDIA GPU), <x.xx> GiB total, <y.yy> GiB available, <z.zz> GiB peak used`
fn check_cpu_line(line: &str) {
    let rest = line
        .strip_prefix("CPU only (no NVIDIA GPU), ")
        .unwrap_or_else(|| panic!("{line}"));
    let parts: Vec<&str> = rest.split(", ").collect();
    assert_eq!(parts.len(), 3, "{line}");
    let mut nums = Vec::new();
    for (part, suffix) in parts
        .iter()
        .zip([" GiB total", " GiB available", " GiB peak used"])
    {
        let n = part
            .strip_suffix(suffix)
            .unwrap_or_else(|| panic!("{line}"));
        let (int, frac) = n.split_once('.').unwrap_or_else(|| panic!("{line}"));
        assert!(
            !int.is_empty() && int.bytes().all(|b| b.is_ascii_digit()),
            "{line}"
        );
        assert!(
            frac.len() == 2 && frac.bytes().all(|b| b.is_ascii_digit()),
            "{line}"
        );
        nums.push(n.parse::<f64>().unwrap());
    }
    assert!(nums[0] > 0.0 && nums[1] <= nums[0], "{line}");
    assert!(
        nums[2] > 0.0 && nums[2] < nums[0],
        "peak RSS of the worker: {line}"
    );
}

#[test]
fn hw_fetch_adds_the_cpu_line_when_asked() {
    let w = mlp();
    for q in [
        "hwFetch=true",
        "hwFetch=True",
        "hwFetch=1",
        "hwFetch=yes",
        "hwFetch",
    ] {
        let r = w.post(&format!("/?{q}"), r#"{"inputs": [[1, 2, 3, 4]]}"#);
        assert_eq!(r.status, 200, "{q}");
        let body = r.json();
        assert_eq!(body["outputs"].as_array().unwrap().len(), 1);
        check_cpu_line(
            body["hwFetch"]
                .as_str()
                .unwrap_or_else(|| panic!("{q}: {body}")),
        );
        let r = w.get(&format!("/?{q}"));
        let body = r.json();
        assert_eq!(body["name"], "mlp-fixture");
        check_cpu_line(body["hwFetch"].as_str().unwrap());
    }
    for q in ["hwFetch=false", "hwFetch=0", "hwFetch=no", "other=1"] {
        let r = w.post(&format!("/?{q}"), r#"{"inputs": [[1, 2, 3, 4]]}"#);
        assert_eq!(r.status, 200);
        assert!(r.json().get("hwFetch").is_none(), "{q}");
        assert!(
            w.get(&format!("/?{q}")).json().get("hwFetch").is_none(),
            "{q}"
        );
    }
}

#[test]
fn integer_dtype_metadata_refuses_fractions() {
    let w = Worker::ready(config("fail", |c| {
        c["metadata_json"] =
            json!(r#"{"name": "ints", "model": "fail.pt", "input": {"dtype": "int64"}}"#);
    }));
    let r = w.post("/", r#"{"inputs": [[1, 2.5]]}"#);
    assert_eq!(r.status, 400);
    assert!(r.error().contains("whole numbers"), "{}", r.error());
    let r = w.post("/", r#"{"inputs": [[1, 2]]}"#);
    assert_eq!(
        (r.status, r.json()["outputs"].clone()),
        (200, json!([[2, 4]]))
    );
}
