//! Models with a declared signature (the metadata's `inputs` / `outputs`): a two-input,
//! two-output TorchScript model (`pair.pt`) and a text-document model whose
//! `forward(docs: List[str])` reads strings (`docs.pt`), served by the real
//! `app --production` and driven by NVIDIA's own client (`tritonclient[http]`, through
//! `tests/support/triton_signature.py`), by raw v2 requests (binary `BYTES`, errors) and by
//! `POST /`. Outputs are checked against what torch computed when the fixtures were made
//! (`tests/fixtures/{pair,docs}_expected.json`).

mod common;

use common::{binary, close, fixtures, raw, App, Server};
use serde_json::{json, Value};

/// An app of the fixture `name` (`pair` or `docs`) with the signature its metadata file
/// declares (`outputs` replaced by `outputs`, when given).
fn app(name: &str, outputs: Option<Value>) -> App {
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.json"))).unwrap();
    let meta: Value = serde_json::from_str(&text).unwrap();
    let outputs = outputs.unwrap_or_else(|| meta["outputs"].clone());
    App::new(
        &format!("{name}.pt"),
        &format!(r#""inputs": {}, "outputs": {outputs}"#, meta["inputs"]),
    )
}

fn expected(name: &str) -> Value {
    let path = fixtures().join(format!("{name}_expected.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn triton(port: u16, kind: &str) -> Value {
    let exp = fixtures().join(format!("{kind}_expected.json"));
    common::python_json(
        "triton_signature.py",
        &[
            &format!("127.0.0.1:{port}"),
            "test app",
            kind,
            exp.to_str().unwrap(),
        ],
        b"",
    )
}

const INFER: &str = "/v2/models/test%20app/infer";

#[test]
fn tritonclient_serves_a_two_input_model_with_declared_outputs() {
    let app = app("pair", None);
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let pid = s.wait_workers(1)[0];
    let exp = expected("pair");
    let r = triton(s.port, "pair");
    assert_eq!(r["model_ready"], true);
    let m = &r["model_metadata"];
    assert_eq!(
        m["inputs"],
        json!([{"name": "features", "datatype": "FP32", "shape": [-1, 3]},
               {"name": "scale", "datatype": "INT64", "shape": [-1]}])
    );
    assert_eq!(
        m["outputs"],
        json!([{"name": "scaled", "datatype": "FP32", "shape": [-1, 3]},
               {"name": "total", "datatype": "FP64", "shape": [-1]}])
    );
    let runs = r["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 4, "JSON and binary, in and out: {r}");
    for (how, run) in runs {
        assert_eq!(run["id"], "sig-1", "{how}: {run}");
        assert_eq!(
            run["datatypes"],
            json!({"scaled": "FP32", "total": "FP64"}),
            "{how}"
        );
        for out in ["scaled", "total"] {
            assert!(
                close(&run["outputs"][out], &exp[out]),
                "{how} {out}: {} vs torch's {}",
                run["outputs"][out],
                exp[out]
            );
        }
    }
    let only = &r["only_second"];
    assert_eq!(only["datatypes"], json!({"total": "FP64"}), "{only}");
    assert!(close(&only["outputs"]["total"], &exp["total"]));
    let e = &r["errors"]["wrong_datatype"];
    assert_eq!(e["status"], "400", "{r}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("input scale has datatype BYTES; the model takes INT64"),
        "{e}"
    );

    // POST / takes the named inputs as an object and answers the outputs as a list.
    let body = json!({"inputs": {"features": exp["features"], "scale": exp["scale"]}});
    let r = raw(s.port, "POST", "/", "", body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert!(close(&v["outputs"][0], &exp["scaled"]), "{v}");
    assert!(close(&v["outputs"][1], &exp["total"]), "{v}");
    let bad: [(Value, &str); 5] = [
        (
            json!({"inputs": {"features": exp["features"]}}),
            "lacks input \"scale\"",
        ),
        (
            json!({"inputs": {"features": exp["features"], "scale": exp["scale"], "bias": [1]}}),
            "has \"bias\", which is not an input",
        ),
        (
            json!({"inputs": [[1, 2, 3]]}),
            "must be an object naming the model's inputs (\"features\", \"scale\")",
        ),
        (
            json!({"inputs": {"features": [[1, 2]], "scale": [1]}}),
            "input features: inputs have shape [1, 2], the model expects [-1, 3]",
        ),
        (
            json!({"inputs": {"features": [[1, 2, 3]], "scale": [1.5]}}),
            "input scale: element 0 (1.5) is not an integer",
        ),
    ];
    for (body, want) in bad {
        let r = raw(s.port, "POST", "/", "", body.to_string().as_bytes());
        assert_eq!(r.status, 400, "{body}");
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains(want), "{body}: {msg:?} lacks {want:?}");
    }
    assert_eq!(s.wait_workers(1), vec![pid], "no request killed the worker");
}

#[test]
fn a_text_document_model_is_served_through_v2_and_post() {
    let app = app("docs", None);
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let pid = s.wait_workers(1)[0];
    let exp = expected("docs");
    let r = triton(s.port, "docs");
    assert_eq!(
        r["model_metadata"]["inputs"],
        json!([{"name": "docs", "datatype": "BYTES", "shape": [-1]}])
    );
    let runs = r["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 4, "{r}");
    for (how, run) in runs {
        assert_eq!(
            run["datatypes"],
            json!({"lengths": "INT64", "first_word": "BYTES"}),
            "{how}: {run}"
        );
        assert_eq!(run["outputs"]["lengths"], exp["lengths"], "{how}");
        assert_eq!(run["outputs"]["first_word"], exp["first_word"], "{how}");
    }
    assert_eq!(r["only_second"]["outputs"]["first_word"], exp["first_word"]);
    let e = &r["errors"]["wrong_datatype"];
    assert_eq!(e["status"], "400", "{r}");
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("input docs has datatype FP32; the model takes BYTES"));

    // POST / with the documents as a list of strings.
    let body = json!({"inputs": exp["docs"]});
    let r = raw(s.port, "POST", "/", "", body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["outputs"],
        json!([exp["lengths"], exp["first_word"]])
    );
    // Not strings, not UTF-8, a NUL: 400 naming the input (and the element).
    let post_bad: [(&[u8], &str); 3] = [
        (
            br#"{"inputs": ["a", 5]}"#,
            "input docs is BYTES: element 1 (5) is not a string",
        ),
        (b"{\"inputs\": [\"caf\xe9\"]}", "not valid JSON"),
        (
            br#"{"inputs": ["a\u0000b"]}"#,
            "input docs: element 0 contains a NUL",
        ),
    ];
    for (body, want) in post_bad {
        let r = raw(s.port, "POST", "/", "", body);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(body));
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
    // Binary BYTES (4-byte little-endian length, then the bytes) with a binary answer.
    let mut data = Vec::new();
    for d in ["hello world", "ünïcode text"] {
        data.extend_from_slice(&(d.len() as u32).to_le_bytes());
        data.extend_from_slice(d.as_bytes());
    }
    let head = format!(
        r#"{{"inputs":[{{"name":"docs","shape":[2],"datatype":"BYTES","parameters":{{"binary_data_size":{}}}}}],"outputs":[{{"name":"first_word","parameters":{{"binary_data":true}}}}]}}"#,
        data.len()
    );
    let (h, body) = binary(&head, &data);
    let r = raw(s.port, "POST", INFER, &h, &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let (head, tail) = r.binary_parts();
    assert_eq!(
        head["outputs"][0],
        json!({"name": "first_word", "datatype": "BYTES", "shape": [2],
               "parameters": {"binary_data_size": tail.len()}})
    );
    // "HELLO", then "üNïCODE" (TorchScript's upper() changes ASCII letters only).
    let mut want = Vec::new();
    for w in ["HELLO", "üNïCODE"] {
        want.extend_from_slice(&(w.len() as u32).to_le_bytes());
        want.extend_from_slice(w.as_bytes());
    }
    assert_eq!(tail, want.as_slice());
    // Malformed binary BYTES and BYTES where numbers are declared: 400, same worker.
    let fuzz: Vec<(String, Vec<u8>)> = vec![
        binary(
            r#"{"inputs":[{"name":"docs","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":6}}]}"#,
            &[2, 0, 0, 0, 0xff, 0xfe],
        ),
        binary(
            r#"{"inputs":[{"name":"docs","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":5}}]}"#,
            &[1, 0, 0, 0, b'a'],
        ),
        binary(
            r#"{"inputs":[{"name":"docs","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":5}}]}"#,
            &[200, 0, 0, 0, b'a'],
        ),
        binary(
            r#"{"inputs":[{"name":"docs","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":9}}]}"#,
            &[1, 0, 0, 0, b'a'],
        ),
        (
            String::new(),
            br#"{"inputs":[{"name":"docs","shape":[2],"datatype":"BYTES","data":["a"]}]}"#.to_vec(),
        ),
        (
            String::new(),
            br#"{"inputs":[{"name":"docs","shape":[1],"datatype":"BYTES","data":[1]}]}"#.to_vec(),
        ),
    ];
    for (h, body) in &fuzz {
        let r = raw(s.port, "POST", INFER, h, body);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(body));
        assert!(
            r.json()["error"].as_str().unwrap().contains("docs"),
            "names the input: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    }
    assert_eq!(s.wait_workers(1), vec![pid]);
}

#[test]
fn outputs_that_differ_from_the_declared_ones_are_the_models_error_not_the_workers_end() {
    // `total` is float64 in the model; the metadata says FP32.
    let declared = json!([{"name": "scaled", "datatype": "FP32", "shape": [-1, 3]},
                          {"name": "total", "datatype": "FP32", "shape": [-1]}]);
    let app = app("pair", Some(declared));
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let pid = s.wait_workers(1)[0];
    let body = br#"{"inputs":[{"name":"features","shape":[1,3],"datatype":"FP32","data":[1,2,3]},{"name":"scale","shape":[1],"datatype":"INT64","data":[2]}]}"#;
    let r = raw(s.port, "POST", INFER, "", body);
    assert_eq!(r.status, 500, "{}", String::from_utf8_lossy(&r.body));
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        msg.contains("the model returned FP64 for output total; the metadata declares FP32"),
        "{msg}"
    );
    // One output too few declared.
    app.write_metadata(
        "pair.pt",
        &format!(
            r#""inputs": {}, "outputs": [{{"name": "scaled", "datatype": "FP32", "shape": [-1, 3]}}]"#,
            json!([{"name": "features", "datatype": "FP32", "shape": [-1, 3]},
                   {"name": "scale", "datatype": "INT64", "shape": [-1]}])
        ),
    );
    assert_eq!(s.wait_workers(1), vec![pid], "the worker survived");
    drop(s);
    let s2 = Server::start(&app, &["--production", "--workers", "1"]);
    s2.wait_workers(1);
    let r = raw(s2.port, "POST", INFER, "", body);
    assert_eq!(r.status, 500);
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        msg.contains("the model returned 2 outputs; the metadata declares 1: scaled (FP32)"),
        "{msg}"
    );
}

#[test]
fn kserve_rest_client_serves_the_two_input_and_the_text_model() {
    for kind in ["pair", "docs"] {
        let app = app(kind, None);
        let s = Server::start(&app, &["--production", "--workers", "1"]);
        s.wait_workers(1);
        let exp = expected(kind);
        let exp_path = fixtures().join(format!("{kind}_expected.json"));
        let r = common::python_json(
            "kserve_client.py",
            &[
                &format!("http://127.0.0.1:{}", s.port),
                "test app",
                kind,
                exp_path.to_str().unwrap(),
            ],
            b"",
        );
        assert_eq!(
            (&r["live"], &r["ready"], &r["model_ready"]),
            (&json!(true), &json!(true), &json!(true)),
            "{kind}: {r}"
        );
        let runs = r["runs"].as_object().unwrap();
        assert_eq!(runs.len(), 2, "JSON and binary: {r}");
        for (how, run) in runs {
            assert_eq!(run["id"], "ks-1", "{kind} {how}");
            assert_eq!(run["model_name"], "test app", "{kind} {how}");
            let outs = run["outputs"].as_object().unwrap();
            assert_eq!(outs.len(), 2, "{kind} {how}: {run}");
            for (name, got) in outs {
                let ok = if kind == "docs" {
                    got == &exp[name]
                } else {
                    close(got, &exp[name])
                };
                assert!(ok, "{kind} {how} {name}: {got} vs torch's {}", exp[name]);
            }
        }
    }
}

/// A two-input model whose metadata declares one input would boot "ready" and
/// answer 500 to every request; the warm-up pass finds the mismatch (libtorch checks the
/// arguments against forward()'s schema) and the boot fails naming both sides. Both ways a
/// worker starts: forked from the template (`--production`) and exec'd (development mode).
#[test]
fn declared_inputs_that_forward_does_not_take_fail_the_boot_naming_both() {
    let app = App::new(
        "pair.pt",
        r#""inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 3]}]"#,
    );
    for args in [&["--production", "--workers", "1"][..], &[][..]] {
        let mut s = Server::spawn(&app, args, &[]);
        let st = s.wait_exit(common::PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(3), "{args:?}: {log}");
        for want in [
            "the metadata declares the inputs [features], which its forward() does not take",
            "is missing value for argument 'scale'",
            "Declare every argument of forward() (after self) in the metadata's `inputs`, in order",
        ] {
            assert!(log.contains(want), "{args:?}: missing {want:?} in:\n{log}");
        }
    }
}
