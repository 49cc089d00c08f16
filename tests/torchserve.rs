//! TorchServe's users: their model archives (`.mar`) and model stores served as they are,
//! answers equal to what TorchServe's own `image_classifier` and `image_segmenter` handlers
//! give (computed by their Python classes in `tests/support/make_torchserve.py`), its inference API (`/predictions`,
//! `/ping`, `/models`), and the archives vramfork cannot serve refused at start naming what
//! to do instead.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::{made_once, raw, Server, PATIENCE};
use serde_json::{json, Value};

/// The archives, images and TorchServe's answers (made once per version of the script).
fn artefacts() -> PathBuf {
    made_once("make_torchserve.py", &[], "torchserve")
}

fn expected(art: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(art.join("expected.json")).unwrap()).unwrap()
}

/// An app whose metadata names `model` (a path), with `extra` fields.
fn app_for(model: &Path, extra: Value) -> common::App {
    let app = common::App {
        dir: tempfile::tempdir().unwrap(),
    };
    let mut meta = json!({"name": "small", "model": model});
    if let (Value::Object(m), Value::Object(e)) = (&mut meta, extra) {
        m.extend(e);
    }
    std::fs::write(app.metadata(), serde_json::to_vec(&meta).unwrap()).unwrap();
    app
}

const ARGS: [&str; 5] = ["--production", "--workers", "1", "--torch-threads", "1"];

/// `got` has the labels of `want` (TorchServe's `{label: probability}`), each within `tol`.
fn assert_same_classes(got: &Value, want: &Value, tol: f64, what: &str) {
    let (g, w) = (got.as_object().unwrap(), want.as_object().unwrap());
    let mut gk: Vec<&String> = g.keys().collect();
    let mut wk: Vec<&String> = w.keys().collect();
    gk.sort();
    wk.sort();
    assert_eq!(gk, wk, "{what}: {got} vs TorchServe's {want}");
    for (k, v) in w {
        let d = (g[k].as_f64().unwrap() - v.as_f64().unwrap()).abs();
        assert!(d <= tol, "{what}: {k}: |Δp| {d} > {tol}: {got} vs {want}");
    }
}

fn post(s: &Server, method: &str, path: &str, body: &[u8]) -> common::Raw {
    raw(s.port, method, path, "", body)
}

#[test]
fn an_archive_answers_as_torchserves_image_classifier() {
    let art = artefacts();
    let want = expected(&art);
    let app = app_for(&art.join("classifier.mar"), json!({}));
    let s = Server::start(&app, &ARGS);
    s.wait_workers(1);
    // The unpacked model is gone once loaded: a recycled worker leaves no copy behind.
    assert_eq!(unpacked_copies(s.pid()), Vec::<String>::new());
    let ping = s.get("/ping");
    assert_eq!(
        (ping.status, ping.json()),
        (200, json!({"status": "Healthy"}))
    );
    let png = std::fs::read(art.join("wide.png")).unwrap();
    let jpg = std::fs::read(art.join("cat.jpg")).unwrap();
    // A PNG decodes to the same pixels as Pillow's: the probabilities agree to float
    // rounding. A JPEG within the decoders' rounding of a level here and there.
    let r = post(&s, "POST", "/predictions/small", &png);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_same_classes(&r.json(), &want["labels"]["wide.png"], 1e-5, "wide.png");
    // `curl -T` (PUT), as TorchServe's README sends images; the version in the path.
    let r = post(&s, "PUT", "/predictions/small/1.0", &jpg);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_same_classes(&r.json(), &want["labels"]["cat.jpg"], 2e-3, "cat.jpg");
    // Refusals in TorchServe's shape.
    let r = post(&s, "POST", "/predictions/other", &png);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["type"], "ModelNotFoundException", "{:?}", r.json());
    assert_eq!(r.json()["code"], 404);
    let r = post(&s, "POST", "/predictions/small/2.0", &png);
    assert_eq!(r.json()["type"], "ModelVersionNotFoundException");
    let r = post(&s, "POST", "/predictions/small", b"not an image");
    assert_eq!(
        (r.status, r.json()["type"].clone()),
        (400, json!("BadRequestException"))
    );
    // The management API, read-only.
    let models = s.get("/models").json();
    assert_eq!(models["models"][0]["modelName"], "small", "{models}");
    let one = s.get("/models/small").json();
    assert_eq!(one[0]["modelVersion"], "1.0", "{one}");
    assert_eq!(one[0]["handler"], "image_classifier", "{one}");
    // Its writes (register, scale, unregister) name what does the same here.
    for (method, path) in [
        ("POST", "/models?url=other.mar"),
        ("PUT", "/models/small?min_worker=3"),
        ("DELETE", "/models/small"),
    ] {
        let r = post(&s, method, path, b"");
        let message = r.json()["message"].as_str().unwrap_or_default().to_string();
        assert_eq!(r.status, 405, "{method} {path}: {message}");
        assert!(
            message.contains("read-only here") && message.contains("SIGTTIN"),
            "{message}"
        );
    }
    let r = post(&s, "POST", "/explanations/small", &png);
    assert_eq!(r.status, 404);
    assert!(
        r.json()["message"].as_str().unwrap().contains("Captum"),
        "{:?}",
        r.json()
    );
    let r = s.get("/metrics");
    assert!(r.body.contains("--metrics-port"), "{}", r.body);
    drop(s);
    // The same model as a torch.export program in the archive.
    let exported = app_for(&art.join("exported.mar"), json!({}));
    let s = Server::start(&exported, &ARGS);
    s.wait_workers(1);
    let r = post(&s, "POST", "/predictions/small", &png);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_same_classes(&r.json(), &want["labels"]["wide.png"], 1e-5, "exported");
    drop(s);
    // Without index_to_name.json, TorchServe names the classes by index.
    let plain = app_for(&art.join("plain.mar"), json!({}));
    let s = Server::start(&plain, &ARGS);
    s.wait_workers(1);
    let r = post(&s, "POST", "/predictions/small", &png);
    assert_same_classes(&r.json(), &want["index"]["wide.png"], 1e-5, "by index");
}

/// `got` is TorchServe's segmentation `want` (`[H][W][class, probability]`): each pixel's
/// probability within `tol`, and its class the same unless the best two tie within `tol`.
fn assert_same_segments(got: &Value, want: &Value, tol: f64, what: &str) {
    let (g, w) = (got.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(g.len(), w.len(), "{what}: rows");
    let mut classes = std::collections::BTreeSet::new();
    for (y, (gr, wr)) in g.iter().zip(w).enumerate() {
        let (gr, wr) = (gr.as_array().unwrap(), wr.as_array().unwrap());
        assert_eq!(gr.len(), wr.len(), "{what}: row {y}");
        for (x, (gp, wp)) in gr.iter().zip(wr).enumerate() {
            let p = |v: &Value, i: usize| v[i].as_f64().unwrap();
            let d = (p(gp, 1) - p(wp, 1)).abs();
            assert!(d <= tol, "{what}: ({y}, {x}): {gp} vs TorchServe's {wp}");
            assert!(
                p(gp, 0) == p(wp, 0) || p(wp, 1) < 0.5 + tol,
                "{what}: ({y}, {x}): {gp} vs TorchServe's {wp}"
            );
            classes.insert(p(wp, 0) as i64);
        }
    }
    // The model is made so that pixels differ: a test of more than one class.
    assert!(classes.len() > 1, "{what}: one class everywhere");
}

/// The segmenter archive `mar` answers as TorchServe's ImageSegmenter on /predictions and
/// KServe v1 (TorchServe's instance form), `POST /` writes the model's dict as it is (an
/// object of its named outputs), and v2 names the outputs by the dict's keys (REST and
/// gRPC, with the handler's work declared as a plain tensor input).
fn serves_as_torchserves_image_segmenter(art: &Path, mar: &str, what: &str) {
    let want = expected(art);
    let app = app_for(&art.join(mar), json!({}));
    let s = Server::start(&app, &ARGS);
    s.wait_workers(1);
    let png = std::fs::read(art.join("wide.png")).unwrap();
    let r = post(&s, "POST", "/predictions/seg", &png);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let shown = format!("{what} predictions");
    assert_same_segments(&r.json(), &want["segments"], 1e-5, &shown);
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let body = json!({"instances": [{"data": b64}]});
    let r = raw(
        s.port,
        "POST",
        "/v1/models/seg:predict",
        "Content-Type: application/json\r\n",
        &serde_json::to_vec(&body).unwrap(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let shown = format!("{what} v1");
    assert_same_segments(&r.json()["predictions"][0], &want["segments"], 1e-5, &shown);
    let r = post(&s, "POST", "/", &png);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let outputs = r.json()["outputs"].clone();
    let names: Vec<&String> = outputs.as_object().unwrap().keys().collect();
    assert_eq!(names, ["out", "aux"], "{what}");
    assert_eq!(outputs["out"][0].as_array().map(Vec::len), Some(3));
    drop(s);
    let declared = app_for(
        &art.join(mar),
        json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]}),
    );
    let s = Server::start(&declared, &ARGS);
    s.wait_workers(1);
    assert_eq!(v2_output_names(&s), json!(["out", "aux"]), "{what}");
}

#[test]
fn an_archive_answers_as_torchserves_image_segmenter() {
    serves_as_torchserves_image_segmenter(&artefacts(), "segmenter.mar", "scripted");
}

/// v2's output names of `s` for one `[1, 3, 16, 16]` image as a plain tensor input `x`, the
/// same on REST and gRPC (NVIDIA's client, `tests/support/triton_grpc.py outputs`).
fn v2_output_names(s: &Server) -> Value {
    let body = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 16, 16],
        "data": vec![0.5; 3 * 16 * 16]}]});
    let r = raw(
        s.port,
        "POST",
        "/v2/models/small/infer",
        "Content-Type: application/json\r\n",
        &serde_json::to_vec(&body).unwrap(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"][0]["shape"], json!([1, 3, 16, 16]));
    let names: Value = r.json()["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].clone())
        .collect();
    let url = format!("127.0.0.1:{}", s.port);
    let args = ["outputs", &url, "small", "x", "[1, 3, 16, 16]"];
    let grpc = common::python_json("triton_grpc.py", &args, b"");
    let grpc_names: Value = grpc["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].clone())
        .collect();
    assert_eq!(grpc_names, names, "gRPC: {grpc}");
    assert_eq!(grpc["outputs"][0]["shape"], json!([1, 3, 16, 16]), "{grpc}");
    names
}

/// The same FCN as a torch.export program (`.pt2`) in the archive, returning a plain dict:
/// the Native Runtime's tensors are named by the program's output spec, so the segmenter
/// finds `out` and answers as TorchServe's ImageSegmenter on /predictions and KServe v1,
/// `POST /` names `out` and `aux`, and so does v2 (REST and gRPC). The FCN exported as it is (its output an
/// OrderedDict, a type the Native Runtime cannot load) is refused at start, naming the way
/// out.
#[test]
fn an_exported_segmenter_answers_as_torchserves_image_segmenter() {
    let art = artefacts();
    serves_as_torchserves_image_segmenter(&art, "segmenter_exported.mar", "exported");
    let ordered = app_for(&art.join("segmenter_ordered.mar"), json!({}));
    let mut s = Server::spawn(&ordered, &ARGS, &[]);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(3), "{log}");
    for named in [
        "its output is a collections.OrderedDict",
        "dict(self.model(x))",
        "AOTInductor package",
    ] {
        assert!(log.contains(named), "no {named:?} in\n{log}");
    }
}

#[test]
fn a_model_store_serves_its_one_archive_and_names_the_settings_it_does_not_apply() {
    let art = artefacts();
    let want = expected(&art);
    let store = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(store.path().join("model-store")).unwrap();
    std::fs::create_dir_all(store.path().join("config")).unwrap();
    std::fs::copy(
        art.join("classifier.mar"),
        store.path().join("model-store/small.mar"),
    )
    .unwrap();
    // As KServe's TorchServe examples write it.
    std::fs::write(
        store.path().join("config/config.properties"),
        r#"inference_address=http://0.0.0.0:8085
enable_envvars_config=true
model_store=/mnt/models/model-store
model_snapshot={"name":"startup.cfg","modelCount":1,"models":{"small":{"1.0":{"defaultVersion":true,"marName":"small.mar","minWorkers":1,"maxWorkers":5,"batchSize":4,"maxBatchDelay":10,"responseTimeout":77}}}}
"#,
    )
    .unwrap();
    let app = app_for(store.path(), json!({}));
    let s = Server::start(&app, &ARGS);
    s.wait_workers(1);
    let png = std::fs::read(art.join("wide.png")).unwrap();
    let r = post(&s, "POST", "/predictions/small", &png);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_same_classes(&r.json(), &want["labels"]["wide.png"], 1e-5, "store");
    // batchSize is the batching's size, maxBatchDelay its timeout; the rest is named with
    // what does it here.
    assert_eq!(s.get("/models/small").json()[0]["batchSize"], 4);
    let described = s.get("/models/small").json();
    assert_eq!(described[0]["responseTimeout"], 77, "{described}");
    let log = s.log_text();
    assert!(log.contains(r#""batch_timeout_ms":10"#), "{log}");
    for named in [
        "`minWorkers` 1 is not applied: use --workers",
        "`inference_address=http://0.0.0.0:8085` is not applied",
    ] {
        assert!(log.contains(named), "{named} not in:\n{log}");
    }
    drop(s);
    // A second archive: one server per archive, both named.
    std::fs::copy(
        art.join("plain.mar"),
        store.path().join("model-store/other.mar"),
    )
    .unwrap();
    let mut s = Server::spawn(&app, &ARGS, &[]);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(
        log.contains("holds 2 archives (other.mar, small.mar): one server serves one archive"),
        "{log}"
    );
}

#[test]
fn archives_vramfork_cannot_serve_are_refused_at_start_naming_what_to_do() {
    let art = artefacts();
    let evil = tempfile::tempdir().unwrap();
    let escaping = evil.path().join("escaping.mar");
    write_zip(
        &escaping,
        &[("MAR-INF/MANIFEST.json", b"{}"), ("../evil.pt", b"x")],
    );
    let counted = evil.path().join("counted.mar");
    huge_declared_count(&counted);
    let cases: [(PathBuf, &str); 4] = [
        (
            art.join("custom.mar"),
            "its handler (handler.py) is Python code vramfork does not run",
        ),
        (art.join("eager.mar"), "torch.jit.script(model).save"),
        (
            escaping,
            "\"../evil.pt\", which would be unpacked outside its folder",
        ),
        // Read before the zip reader reserves memory for that many entries (it would ask
        // for hundreds of GB, and the process abort).
        (
            counted,
            "declares 3000000000 entries in its central directory; at most 50000 are read",
        ),
    ];
    for (mar, want) in cases {
        let app = app_for(&mar, json!({}));
        let mut s = Server::spawn(&app, &ARGS, &[]);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(2), "{}: {log}", mar.display());
        assert!(
            log.contains(want),
            "{}: {want:?} not in:\n{log}",
            mar.display()
        );
    }
    // TorchServe's command line, typed out of habit, names what does the same here.
    let app = app_for(&art.join("classifier.mar"), json!({}));
    let mut s = Server::spawn(
        &app,
        &[
            "--start",
            "--model-store",
            "model_store",
            "--models",
            "small.mar",
        ],
        &[],
    );
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(log.contains("`--start` is TorchServe's option, which vramfork does not take: `app --production` runs the server"), "{log}");
    // TorchServe's settings written into the metadata are named with ours, not kept silently.
    let settings = app_for(
        &common::fixtures().join("mlp.pt"),
        json!({"batchSize": 8, "maxBatchDelay": 10}),
    );
    let mut s = Server::spawn(&settings, &ARGS, &[]);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(log.contains("field `batchSize` is TorchServe's, which vramfork does not read: write `max_batch_size`"), "{log}");
    // With the handler's work declared in the metadata, a custom handler's model is served.
    let declared = app_for(
        &art.join("custom.mar"),
        json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]}),
    );
    let s = Server::start(&declared, &ARGS);
    s.wait_workers(1);
    let zeros = json!({"inputs": vec![vec![vec![vec![0.0; 32]; 32]; 3]]});
    let r = raw(
        s.port,
        "POST",
        "/predictions/small",
        "Content-Type: application/json\r\n",
        &serde_json::to_vec(&zeros).unwrap(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()[0].as_array().map(Vec::len),
        Some(10),
        "{:?}",
        r.json()
    );
}

/// The archives' unpacked models left in the unpack directory of the server `pid`.
fn unpacked_copies(pid: u32) -> Vec<String> {
    let prefix = format!("vramfork-unpack-{pid}-");
    let Ok(tmp) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    tmp.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten())
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("mar-"))
        .collect()
}

/// A sparse 4 GiB archive (a few KB on disk) whose ZIP64 end record declares 3,000,000,000
/// entries: fewer than its size in bytes, which is all the zip reader checks before it
/// reserves memory for them.
fn huge_declared_count(path: &Path) {
    write_zip(path, &[("MAR-INF/MANIFEST.json", b"{}")]);
    let small = std::fs::read(path).unwrap();
    let central_end = small.len() - 22;
    let cd_size = u32::from_le_bytes(
        small[central_end + 12..central_end + 16]
            .try_into()
            .unwrap(),
    );
    let cd_at = u32::from_le_bytes(
        small[central_end + 16..central_end + 20]
            .try_into()
            .unwrap(),
    );
    let len: u64 = 4 << 30;
    let count: u64 = 3_000_000_000;
    let mut tail = Vec::new();
    let record_at = len - 22 - 20 - 56;
    tail.extend_from_slice(&0x0606_4b50u32.to_le_bytes());
    tail.extend_from_slice(&44u64.to_le_bytes());
    tail.extend_from_slice(&45u16.to_le_bytes());
    tail.extend_from_slice(&45u16.to_le_bytes());
    tail.extend_from_slice(&[0; 8]);
    for v in [count, count, u64::from(cd_size), u64::from(cd_at)] {
        tail.extend_from_slice(&v.to_le_bytes());
    }
    tail.extend_from_slice(&0x0706_4b50u32.to_le_bytes());
    tail.extend_from_slice(&0u32.to_le_bytes());
    tail.extend_from_slice(&record_at.to_le_bytes());
    tail.extend_from_slice(&1u32.to_le_bytes());
    tail.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    for v in [0u16, 0, 0xFFFF, 0xFFFF] {
        tail.extend_from_slice(&v.to_le_bytes());
    }
    tail.extend_from_slice(&[0xFF; 8]);
    tail.extend_from_slice(&0u16.to_le_bytes());
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len).unwrap();
    use std::io::{Seek, SeekFrom};
    f.seek(SeekFrom::Start(central_end as u64)).unwrap();
    f.write_all(&[0; 22]).unwrap();
    f.seek(SeekFrom::Start(record_at)).unwrap();
    f.write_all(&tail).unwrap();
}

/// A zip of `files` (stored), written without Python.
fn write_zip(path: &Path, files: &[(&str, &[u8])]) {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in files {
        let crc = crc32(data);
        let offset = out.len() as u32;
        let head = |sig: u32, central: bool| {
            let mut h = Vec::new();
            h.extend_from_slice(&sig.to_le_bytes());
            if central {
                h.extend_from_slice(&20u16.to_le_bytes());
            }
            for v in [20u16, 0, 0, 0, 0] {
                h.extend_from_slice(&v.to_le_bytes());
            }
            h.extend_from_slice(&crc.to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(name.len() as u16).to_le_bytes());
            h.extend_from_slice(&0u16.to_le_bytes());
            if central {
                for v in [0u16, 0, 0] {
                    h.extend_from_slice(&v.to_le_bytes());
                }
                h.extend_from_slice(&0u32.to_le_bytes());
                h.extend_from_slice(&offset.to_le_bytes());
            }
            h.extend_from_slice(name.as_bytes());
            h
        };
        out.extend(head(0x0403_4b50, false));
        out.extend_from_slice(data);
        central.extend(head(0x0201_4b50, true));
    }
    let at = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    for v in [0u16, 0, files.len() as u16, files.len() as u16] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    std::fs::File::create(path)
        .unwrap()
        .write_all(&out)
        .unwrap();
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for b in data {
        c ^= u32::from(*b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[test]
fn kserve_v1_predicts_as_the_model_and_openais_sdk_still_lists_it() {
    let fixtures = common::fixtures();
    let app = app_for(
        &fixtures.join("mlp.pt"),
        json!({"input": {"shape": [-1, 4]}}),
    );
    let s = Server::start(&app, &ARGS);
    s.wait_workers(1);
    let cases: Value =
        serde_json::from_slice(&std::fs::read(fixtures.join("mlp_expected.json")).unwrap())
            .unwrap();
    let base = format!("http://127.0.0.1:{}", s.port);
    let seen = common::python_json(
        "kserve_v1_client.py",
        &[&base, "small"],
        &serde_json::to_vec(&cases).unwrap(),
    );
    assert_eq!(
        (&seen["live"], &seen["ready"]),
        (&json!(true), &json!(true)),
        "{seen}"
    );
    // `GET /` is still the metadata, with the liveness KServe's client read.
    let root = s.get("/").json();
    assert_eq!(
        (&root["name"], &root["status"]),
        (&json!("small"), &json!("alive"))
    );
    for (i, case) in cases["cases"].as_array().unwrap().iter().enumerate() {
        let got = &seen["predictions"][i];
        assert!(
            common::close(got, &case["outputs"]),
            "case {i}: {got} vs torch's {}",
            case["outputs"]
        );
    }
    assert_eq!(seen["openai_ids"], json!(["small"]), "{seen}");
    assert_eq!(seen["openai_retrieved"], "small", "{seen}");
    // An image classifier's instances in TorchServe's form: {"data": base64}.
    let art = artefacts();
    let want = expected(&art);
    drop(s);
    let classifier = app_for(&art.join("classifier.mar"), json!({}));
    let s = Server::start(&classifier, &ARGS);
    s.wait_workers(1);
    let png = std::fs::read(art.join("wide.png")).unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let body = json!({"instances": [{"data": b64}]});
    let r = raw(
        s.port,
        "POST",
        "/v1/models/small:predict",
        "Content-Type: application/json\r\n",
        &serde_json::to_vec(&body).unwrap(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let p = &r.json()["predictions"][0];
    assert_same_classes(p, &want["labels"]["wide.png"], 1e-5, "v1 data");
}

#[test]
fn torchserve_and_kserve_v1_answers_are_counted_under_their_own_endpoints() {
    let app = app_for(
        &common::fixtures().join("mlp.pt"),
        json!({"input": {"shape": [-1, 4]}}),
    );
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--metrics-port", "0"],
    );
    s.wait_workers(1);
    let mport = s.metrics_port();
    let json_type = "Content-Type: application/json\r\n";
    let row = br#"{"inputs": [[1, 2, 3, 4]]}"#;
    for method in ["POST", "PUT"] {
        let r = raw(s.port, method, "/predictions/small", json_type, row);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let r = raw(
        s.port,
        "POST",
        "/v1/models/small:predict",
        json_type,
        br#"{"instances": [[1, 2, 3, 4]]}"#,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // KServe's explain is not served, and says what to do instead.
    let r = raw(
        s.port,
        "POST",
        "/v1/models/small:explain",
        json_type,
        br#"{"instances": [[1, 2, 3, 4]]}"#,
    );
    let text = String::from_utf8_lossy(&r.body);
    assert_eq!(r.status, 404, "{text}");
    assert!(text.contains("run the explainer"), "{text}");
    assert_eq!(s.get("/ping").status, 200);
    // Counts reach the master with the worker's heartbeats.
    let counted = |m: &str, endpoint: &str, n: u32| {
        m.lines().any(|l| {
            l.starts_with("vramfork_requests_total{")
                && l.contains(&format!("endpoint=\"{endpoint}\""))
                && l.contains("code=\"200\"")
                && l.ends_with(&format!(" {n}"))
        })
    };
    s.poll("torchserve 2, kserve-v1 1, /ping under other", || {
        let m = common::http(mport, "GET", "/metrics", None).body;
        (counted(&m, "torchserve", 2) && counted(&m, "kserve-v1", 1) && counted(&m, "other", 1))
            .then_some(())
    });
}
