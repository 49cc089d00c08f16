//! Documents in, answers out: text tokenized and images decoded inside the
//! worker, declared in the metadata. The artefacts are made on the spot by
//! `tests/support/make_documents.py` with the test venv's packages — a WordPiece
//! `tokenizer.json` trained on the README, a BERT-architecture classifier (transformers,
//! random weights, traced), torchvision's ResNet-18 (random weights), a model returning its
//! input, JPEG and PNG files written by Pillow — together with what Python makes of them
//! (the tokenizer and the model in Python, torchvision's transforms on the PIL images). The
//! worker's answers must equal Python's: for text within float tolerance of the same model,
//! for images within the rounding the decoders differ by (below).

#[path = "../common/mod.rs"]
mod common;

mod declarations;
mod images;
mod limits;
mod text;

use std::path::{Path, PathBuf};

use common::{binary, made_once, python_json, raw, Raw, Server};
use serde_json::{json, Value};

/// The artefacts of `tests/support/make_documents.py` (made once per version).
fn artefacts() -> PathBuf {
    made_once("make_documents.py", &["wordpiece.py"], "documents")
}

fn expected(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap()
}

/// An app in a fresh directory holding (links to) the artefacts and `metadata`, whose
/// `model` and `tokenizer.file` are relative to it as users write them.
struct DocApp {
    app: common::App,
}

impl DocApp {
    fn new(art: &Path, metadata: Value) -> DocApp {
        let app = common::App {
            dir: tempfile::tempdir().unwrap(),
        };
        for f in std::fs::read_dir(art).unwrap() {
            let f = f.unwrap().path();
            std::os::unix::fs::symlink(&f, app.dir.path().join(f.file_name().unwrap())).unwrap();
        }
        std::fs::write(app.metadata(), serde_json::to_vec(&metadata).unwrap()).unwrap();
        DocApp { app }
    }

    /// `app --production --workers 1 --torch-threads 1 ARGS`, listening.
    fn start(&self, args: &[&str]) -> Server {
        Server::start(&self.app, &self.args(args))
    }

    /// Starts the app and waits for its one worker: the server and the worker's pid.
    fn serve(&self, args: &[&str]) -> (Server, u32) {
        let s = self.start(args);
        let pid = s.wait_workers(1)[0];
        (s, pid)
    }

    fn args<'a>(&self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec!["--production", "--workers", "1", "--torch-threads", "1"];
        all.extend_from_slice(args);
        all
    }
}

fn text_metadata(model: &str, tokenizer: Value, batch: u32) -> Value {
    json!({
        "name": "text app",
        "model": model,
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1], "tokenizer": tokenizer}],
        "max_batch_size": batch,
    })
}

/// The BERT-architecture model behind a text input with `tokenizer` as its block, no batching.
fn bert_text(art: &Path, tokenizer: Value) -> DocApp {
    DocApp::new(art, text_metadata("bert.pt", tokenizer, 0))
}

fn image_metadata(model: &str, image: Value, batch: u32) -> Value {
    json!({
        "name": "image app",
        "model": model,
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1], "image": image}],
        "max_batch_size": batch,
    })
}

fn imagenet() -> Value {
    json!({"size": [224, 224], "resize": "center_crop", "shorter_side": 256,
           "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]})
}

/// `outputs` of a 200 answer.
fn outputs(r: &Raw) -> Value {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["outputs"].clone()
}

fn post_json(s: &Server, body: &Value) -> Raw {
    raw(
        s.port,
        "POST",
        "/",
        "Content-Type: application/json\r\n",
        &serde_json::to_vec(body).unwrap(),
    )
}

/// Every number of `got` within `tol` of `want` (same nesting).
fn assert_close(got: &Value, want: &Value, tol: f64, what: &str) {
    let (g, w) = (flat(got), flat(want));
    assert_eq!(g.len(), w.len(), "{what}: {got} vs {want}");
    let worst = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst <= tol, "{what}: differs by {worst} (> {tol})");
}

fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(a) => a.iter().flat_map(flat).collect(),
        Value::Number(n) => vec![n.as_f64().unwrap()],
        other => panic!("not a number: {other}"),
    }
}

/// Triton's binary form of `BYTES` elements: each a 4-byte little-endian length, then it.
fn bytes_elements(items: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for i in items {
        out.extend((i.len() as u32).to_le_bytes());
        out.extend_from_slice(i);
    }
    out
}

/// The `error` of a refusal with `status`, served by worker `pid`.
fn refusal(r: &Raw, status: u16, pid: u32) -> String {
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(r.status, status, "{body}");
    assert_eq!(
        r.header("x-worker-pid"),
        Some(pid.to_string().as_str()),
        "{body}"
    );
    r.json()["error"].as_str().unwrap().to_string()
}

/// Float tolerance of the same model on the same tokens (a padded batch adds masked
/// positions, which change the sums' order only).
const TEXT_TOL: f64 = 1e-4;

/// Images: decoders differ by a level or two (libjpeg-turbo in Pillow, zune-jpeg here;
/// Pillow rounds between its two resize passes): within 3/255 of a pixel, after
/// normalisation by std ≈ 0.22, is 0.06.
const PIXEL_TOL: f64 = 0.06;

/// A process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}
