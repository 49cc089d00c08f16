//! `torch.export` archives (`.pt2`) served by the real `app`: answers equal to the
//! TorchScript export of the same module and weights (`mlp.pt2` and `mlp.pt`, `pair.pt2`
//! and `pair.pt`, made by `scripts/make_pt2_models.py`) on `POST /` and v2; concurrent
//! requests sharing passes of a program exported with a dynamic batch; a request outside
//! the export's bounds refused with 400 naming the bound (libtorch's Native Runtime does not
//! check them); workers forked from the template answering with two intra-op threads; an
//! output that nests answered numbered, saying why (a dict of tensors is named: the
//! segmenter of `tests/torchserve.rs`); and
//! the refusals at boot (exit 3): a file that is no archive, a TorchScript file named `.pt2`,
//! `max_batch_size` on a program whose batch was fixed at export, declared inputs the program
//! does not take. AOTInductor packages: `tests/aoti.rs`.

mod common;

use std::collections::BTreeMap;

use common::exported::*;
use common::*;
use serde_json::{json, Value};

#[test]
fn an_exported_mlp_answers_as_its_torchscript_export_on_post_and_v2() {
    let exported = App::new("mlp.pt2", MLP_INPUT_DECL);
    let scripted = App::new("mlp.pt", MLP_INPUT_DECL);
    let pt2 = Server::start(&exported, &["--production", "--workers", "1"]);
    let pt = Server::start(&scripted, &["--production", "--workers", "1"]);
    pt2.wait_workers(1);
    pt.wait_workers(1);
    let (a, b) = (mlp_answers(&pt2), mlp_answers(&pt));
    let expected = fixture_json("mlp_expected.json");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(within_1e5(x, y), "case {i}: .pt2 {x} vs .pt {y}");
        let torch = &expected["cases"][i]["outputs"];
        assert!(
            within_1e5(x, torch),
            "case {i}: .pt2 {x} vs torch's {torch}"
        );
    }
    // The Open Inference Protocol, the same rows.
    let v2 = json!({"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [2, 4],
                    "data": [1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 2.5, -3.0]}]})
    .to_string();
    let (r2, r) = (
        pt2.post("/v2/models/test%20app/infer", &v2),
        pt.post("/v2/models/test%20app/infer", &v2),
    );
    assert_eq!(r2.status, 200, "{r2:?}\n{}", pt2.log_text());
    assert_eq!(r.status, 200, "{r:?}");
    let (o2, o) = (&r2.json()["outputs"][0], &r.json()["outputs"][0]);
    assert_eq!(o2["shape"], json!([2, 3]), "{o2}");
    assert_eq!(o2["datatype"], "FP32", "{o2}");
    assert!(within_1e5(&o2["data"], &o["data"]), "{o2} vs {o}");
    // Its v2 metadata names the format.
    let meta = |s: &Server| s.get("/v2/models/test%20app").json()["platform"].clone();
    assert_eq!(meta(&pt2), "pytorch_export");
    assert_eq!(meta(&pt), "pytorch_libtorch");
}

/// NVIDIA's gRPC client (`tests/support/triton_grpc.py basics`, as `tests/grpc.rs` drives
/// the TorchScript MLP) gets torch's answers from the program, raw and typed.
#[test]
fn tritonclient_grpc_gets_torchs_answers_from_a_program() {
    let app = App::new("mlp.pt2", MLP_INPUT_DECL);
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    s.wait_workers(1);
    let cases = fixtures().join("mlp_expected.json");
    let url = format!("127.0.0.1:{}", s.port);
    let r = python_json(
        "triton_grpc.py",
        &["basics", &url, "test app", cases.to_str().unwrap()],
        b"",
    );
    assert_eq!(r["model_metadata"]["platform"], "pytorch_export", "{r}");
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 3, "{r}");
    for c in cases {
        assert!(
            c["seen"]["raw"]["output"].is_array() && c["seen"]["typed"]["output"].is_array(),
            "{c}"
        );
        for (how, got) in c["seen"].as_object().unwrap() {
            assert!(
                within_1e5(&got["output"], &c["expected"]),
                "{how}: {} vs torch's {}",
                got["output"],
                c["expected"]
            );
        }
    }
}

/// A program whose output nests (a dict holding a tuple: `tests/support/
/// make_nested_program.py`) answers its tensors numbered in its output spec's order, as an
/// AOTInductor package's always were, and the log says why they are not named.
#[test]
fn a_program_whose_output_nests_answers_numbered_outputs_saying_why() {
    let art = made_once("make_nested_program.py", &[], "nested-program");
    let nested = art.join("nested.pt2");
    let app = App::new(nested.to_str().unwrap(), MLP_INPUT_DECL);
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    s.wait_workers(1);
    let exp: Value =
        serde_json::from_slice(&std::fs::read(art.join("expected.json")).unwrap()).unwrap();
    let r = s.post("/", &json!({"inputs": exp["input"]}).to_string());
    assert_eq!(r.status, 200, "{r:?}\n{}", s.log_text());
    assert!(
        within_1e5(&r.json()["outputs"], &exp["flat"]),
        "{:?} vs torch's {}",
        r.json(),
        exp["flat"]
    );
    let log = s.log_text();
    assert!(
        log.contains("outputs_numbered") && log.contains("a dict holding a tuple"),
        "{log}"
    );
}

#[test]
fn a_two_input_program_returns_its_tuple_as_named_outputs() {
    let meta = fixture_json("pair.json");
    let decl = format!(
        r#""inputs": {}, "outputs": {}"#,
        meta["inputs"], meta["outputs"]
    );
    let exported = App::new("pair.pt2", &decl);
    let s = Server::start(&exported, &["--production", "--workers", "1"]);
    s.wait_workers(1);
    let exp = fixture_json("pair_expected.json");
    let rows = exp["features"].as_array().unwrap().len();
    let body = json!({"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [rows, 3],
         "data": exp["features"].as_array().unwrap().iter()
            .flat_map(|r| r.as_array().unwrap().clone()).collect::<Vec<_>>()},
        {"name": "scale", "datatype": "INT64", "shape": [rows], "data": exp["scale"]}
    ]});
    let r = s.post("/v2/models/test%20app/infer", &body.to_string());
    assert_eq!(r.status, 200, "{r:?}\n{}", s.log_text());
    let outputs: BTreeMap<String, Value> = r.json()["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["name"].as_str().unwrap().to_string(), o.clone()))
        .collect();
    let flat: Vec<Value> = exp["scaled"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().clone())
        .collect();
    assert!(
        within_1e5(&outputs["scaled"]["data"], &Value::Array(flat)),
        "{outputs:?}"
    );
    assert_eq!(outputs["total"]["datatype"], "FP64", "{outputs:?}");
    assert!(
        within_1e5(&outputs["total"]["data"], &exp["total"]),
        "{outputs:?}"
    );
    // The rows of the two inputs are one torch.export.Dim: unequal rows are the request's
    // fault, named.
    let unequal = json!({"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [2, 3], "data": [0, 0, 0, 0, 0, 0]},
        {"name": "scale", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]}
    ]});
    let r = s.post("/v2/models/test%20app/infer", &unequal.to_string());
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        r.body
            .contains("input scale: dimension 0 is 3, but features's is 2"),
        "{}",
        r.body
    );
}

#[test]
fn concurrent_requests_share_passes_of_a_program_with_a_dynamic_batch() {
    let app = App::new(
        "mlp.pt2",
        &format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 4"#),
    );
    // Four requests fill a batch and run at once; the long timeout only keeps a thread that
    // is late on a busy machine in the same batch.
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--metrics-port",
            "0",
            "--batch-timeout-ms",
            "5000",
        ],
    );
    s.wait_workers(1);
    let mport = s.metrics_port();
    four_mlp_rows_at_once(s.port);
    let text = s.poll("a forward pass of more than one row", || {
        let r = http(mport, "GET", "/metrics", None);
        (multi_row_passes(&r.body) > 0.0).then_some(r.body)
    });
    assert!(text.contains("vramfork_batches_total{"), "{text}");
}

#[test]
fn a_request_outside_the_exports_bounds_gets_400_naming_the_bound() {
    // No declared input: the program's own signature is the only check.
    let app = App::new("mlp.pt2", "");
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let pid = s.wait_workers(1)[0];
    let rows = vec![vec![1.0; 4]; 65];
    let r = s.post("/", &json!({ "inputs": rows }).to_string());
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        r.body
            .contains("input x: dimension 0 is 65, above the export's bound of 64"),
        "{}",
        r.body
    );
    let r = s.post("/", r#"{"inputs": [[1.0, 2.0, 3.0]]}"#);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        r.body
            .contains("input x: dimension 1 is 3, the program takes 4 there"),
        "{}",
        r.body
    );
    // The worker serves on: the same one answers a good request.
    let r = s.post("/", MLP_INPUT);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.pid(), pid);
}

/// The template loads and warms the program on one thread and forks; each worker's passes
/// then run on an OpenMP team of two (a team the template had started would not survive the
/// fork, and the worker's first parallel pass would hang): one-row and 512-row requests,
/// the latter large enough for ATen's `parallel_for`, are answered by every worker, whose
/// model thread then has its team of two.
#[test]
fn forked_workers_of_a_program_answer_on_teams_of_two_torch_threads() {
    let app = App::new(
        "mlp256.pt2",
        r#""inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]"#,
    );
    forked_workers_answer_on_teams_of_two(&app, 1);
}

#[test]
fn a_file_that_is_no_program_is_refused_at_boot_with_the_readers_message() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pt2");
    std::fs::write(
        &garbage,
        b"this is not a zip archive\x00\x01\x02 garbage\n".repeat(4),
    )
    .unwrap();
    refused(
        garbage.to_str().unwrap(),
        "",
        &[
            "not a torch.export archive (PytorchStreamReader failed reading zip archive",
            "torch.export.save",
        ],
    );
    // A TorchScript file named .pt2: a zip, but no program in it.
    let scripted = dir.path().join("scripted.pt2");
    std::fs::copy(fixtures().join("mlp.pt"), &scripted).unwrap();
    refused(
        scripted.to_str().unwrap(),
        "",
        &["neither a torch.export program (no models/<name>.json)"],
    );
}

#[test]
fn batching_a_program_whose_batch_was_fixed_at_export_is_refused_naming_dim() {
    refused(
        "mlp_fixed.pt2",
        &format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 8"#),
        &[
            "input x's dimension 0 is fixed at 2 in the export",
            "torch.export.Dim(",
            "max=8)",
        ],
    );
    refused(
        "mlp.pt2",
        &format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 128"#),
        &["the export bounds input x's dimension 0 at 64"],
    );
    refused(
        "mlp.pt2",
        r#""input": {"shape": [-1, 5], "dtype": "float32"}"#,
        &[
            "declared [-1, 5], but the program takes [",
            "4]: dimension 1 was fixed at 4 at export. Declare [-1, 4]",
        ],
    );
}
