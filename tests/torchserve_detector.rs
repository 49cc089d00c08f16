//! TorchServe's `object_detector` archives served as they are: a scripted torchvision
//! detector called with each image at its own size, answers equal to what TorchServe's own
//! `ObjectDetector` handler gives (its Python class run in
//! `tests/support/make_detector.py`) on `/predictions` and KServe v1, bad input refused
//! with the worker still serving, and the detector archives vramfork cannot serve refused at
//! start naming what to do instead.

mod common;

use std::path::{Path, PathBuf};

use common::{made_once, raw, Server, PATIENCE};
use serde_json::{json, Value};

/// The archives, images and TorchServe's answers (made once per version of the script).
fn artefacts() -> PathBuf {
    made_once("make_detector.py", &[], "detector")
}

fn expected(art: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(art.join("expected.json")).unwrap()).unwrap()
}

/// torchvision's operators (`torchvision::nms`, `roi_align`), which every torchvision
/// detector calls: the metadata's `op_libraries`.
fn op_libraries() -> Value {
    let libs = common::python_json("op_libraries.py", &[], b"");
    json!([libs["libpython"], libs["torchvision_c"]])
}

/// An app whose metadata names the archive `mar`, with `extra` fields.
fn app_for(mar: &Path, extra: Value) -> common::App {
    let app = common::App {
        dir: tempfile::tempdir().unwrap(),
    };
    let mut meta = json!({"name": "det", "model": mar});
    if let (Value::Object(m), Value::Object(e)) = (&mut meta, extra) {
        m.extend(e);
    }
    std::fs::write(app.metadata(), serde_json::to_vec(&meta).unwrap()).unwrap();
    app
}

const ARGS: [&str; 5] = ["--production", "--workers", "1", "--torch-threads", "1"];

/// `got` is TorchServe's list of detections `want`: the same detections in the same order,
/// each `{label: [x1, y1, x2, y2], "score": s}` with the same label, its corners within
/// 1e-4 and its score within 1e-5.
fn assert_same_detections(got: &Value, want: &Value, what: &str) {
    let (g, w) = (got.as_array().unwrap(), want.as_array().unwrap());
    assert!(
        !w.is_empty(),
        "{what}: TorchServe kept no detection: {want}"
    );
    assert_eq!(g.len(), w.len(), "{what}: {got} vs TorchServe's {want}");
    for (i, (g, w)) in g.iter().zip(w).enumerate() {
        let (go, wo) = (g.as_object().unwrap(), w.as_object().unwrap());
        let mut gk: Vec<&String> = go.keys().collect();
        let mut wk: Vec<&String> = wo.keys().collect();
        gk.sort();
        wk.sort();
        assert_eq!(gk, wk, "{what}[{i}]: {g} vs TorchServe's {w}");
        for (k, v) in wo {
            let near = |a: &Value, b: &Value, tol: f64| {
                (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() <= tol
            };
            let same = match v {
                Value::Array(corners) => {
                    corners.len() == 4
                        && corners
                            .iter()
                            .zip(go[k].as_array().unwrap())
                            .all(|(b, a)| near(a, b, 1e-4))
                }
                score => near(&go[k], score, 1e-5),
            };
            assert!(same, "{what}[{i}]: {k}: {g} vs TorchServe's {w}");
        }
    }
}

fn json_post(s: &Server, path: &str, body: &Value) -> common::Raw {
    raw(
        s.port,
        "POST",
        path,
        "Content-Type: application/json\r\n",
        &serde_json::to_vec(body).unwrap(),
    )
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn an_archive_answers_as_torchserves_object_detector() {
    let art = artefacts();
    let want = expected(&art);
    let app = app_for(
        &art.join("detector.mar"),
        json!({"op_libraries": op_libraries()}),
    );
    let s = Server::start(&app, &ARGS);
    s.wait_workers(1);
    let wide = std::fs::read(art.join("wide.png")).unwrap();
    let tall = std::fs::read(art.join("tall.png")).unwrap();
    // Each image at its own size, as TorchServe's ToTensor() leaves it.
    let r = raw(s.port, "POST", "/predictions/det", "", &wide);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let worker = r.header("x-worker-pid").unwrap().to_string();
    assert_same_detections(&r.json(), &want["labels"]["wide.png"], "wide.png");
    let r = raw(s.port, "PUT", "/predictions/det/1.0", "", &tall);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_same_detections(&r.json(), &want["labels"]["tall.png"], "tall.png");
    // KServe v1, TorchServe's instance form: two images of one size in one pass.
    let body = json!({"instances": [{"data": b64(&wide)}, {"data": b64(&wide)}]});
    let r = json_post(&s, "/v1/models/det:predict", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let predictions = r.json()["predictions"].clone();
    assert_eq!(
        predictions.as_array().map(Vec::len),
        Some(2),
        "{predictions}"
    );
    for p in predictions.as_array().unwrap() {
        assert_same_detections(p, &want["labels"]["wide.png"], "v1");
    }
    // `POST /` writes the pass's outputs as they are: each image's rows and their count.
    let r = raw(s.port, "POST", "/", "", &tall);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let outputs = r.json()["outputs"].clone();
    let names: Vec<&String> = outputs.as_object().unwrap().keys().collect();
    assert_eq!(
        names,
        ["boxes", "labels", "scores", "detections"],
        "{outputs}"
    );
    refusals(&s, &art, &wide, &tall);
    // The worker that answered first answers still: no request ended it.
    let r = raw(s.port, "POST", "/predictions/det", "", &wide);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(worker.as_str()));
}

/// Bad input: 400s that say why, in each door's shape.
fn refusals(s: &Server, art: &Path, wide: &[u8], tall: &[u8]) {
    let r = raw(s.port, "POST", "/predictions/det", "", b"not an image");
    assert_eq!(
        (r.status, r.json()["type"].clone()),
        (400, json!("BadRequestException")),
        "{:?}",
        r.json()
    );
    // Images of two sizes cannot be stacked into one tensor: one request each.
    let body = json!({"instances": [{"data": b64(wide)}, {"data": b64(tall)}]});
    let r = json_post(s, "/v1/models/det:predict", &body);
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(r.status, 400, "{text}");
    assert!(
        text.contains("element 0 is 260×150 and element 1 is 140×230")
            && text.contains("one request's images must be of one size"),
        "{text}"
    );
    // Larger than the image input's `max_pixels` (40 megapixels): refused from its header.
    let big = art.join("big.png");
    if !big.is_file() {
        common::python_json(
            "solid_png.py",
            &[big.to_str().unwrap(), "8000", "5100"],
            b"",
        );
    }
    let r = raw(
        s.port,
        "POST",
        "/predictions/det",
        "",
        &std::fs::read(&big).unwrap(),
    );
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(r.status, 400, "{text}");
    assert!(
        text.contains("the image is 8000×5100 (40800000 pixels)") && text.contains("`max_pixels`"),
        "{text}"
    );
}

#[test]
fn an_archive_without_class_names_answers_labels_by_index() {
    let art = artefacts();
    let want = expected(&art);
    // Batching on: the warm-up's pass holds 4 images, requests of one size share passes.
    let app = app_for(
        &art.join("plain.mar"),
        json!({"op_libraries": op_libraries(), "max_batch_size": 4}),
    );
    let s = Server::start(&app, &ARGS);
    s.wait_workers(1);
    let wide = std::fs::read(art.join("wide.png")).unwrap();
    let r = raw(s.port, "POST", "/predictions/det", "", &wide);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_same_detections(&r.json(), &want["index"]["wide.png"], "by index");
    assert!(r.json()[0].get("1").is_some(), "{:?}", r.json());
}

#[test]
fn detector_archives_vramfork_cannot_serve_are_refused_at_start_naming_what_to_do() {
    let art = artefacts();
    let libs = json!({"op_libraries": op_libraries()});
    // Exit 2: the archive is refused as read; 3: its model could not be loaded.
    let cases: [(&str, Value, i32, &str); 3] = [
        (
            "exported.mar",
            json!({}),
            2,
            "object_detector's model model.pt2 is a torch.export program, which takes tensors, not the list of images a torchvision detector takes: script the detector",
        ),
        // torchvision's operators are a library the metadata names.
        (
            "detector.mar",
            json!({}),
            3,
            "list the shared library that registers it in the metadata's op_libraries",
        ),
        (
            "notdetector.mar",
            libs,
            3,
            "object_detector calls the model's forward with a list of [3, H, W] images",
        ),
    ];
    for (mar, extra, code, want) in cases {
        let app = app_for(&art.join(mar), extra);
        let mut s = Server::spawn(&app, &ARGS, &[]);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(code), "{mar}: {log}");
        assert!(log.contains(want), "{mar}: {want:?} not in:\n{log}");
    }
}
