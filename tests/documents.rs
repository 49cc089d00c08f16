//! Documents in, answers out (issue 27): text tokenized and images decoded inside the
//! worker, declared in the metadata. The artefacts are made on the spot by
//! `tests/support/make_documents.py` with the test venv's packages — a WordPiece
//! `tokenizer.json` trained on the README, a BERT-architecture classifier (transformers,
//! random weights, traced), torchvision's ResNet-18 (random weights), a model returning its
//! input, JPEG and PNG files written by Pillow — together with what Python makes of them
//! (the tokenizer and the model in Python, torchvision's transforms on the PIL images). The
//! worker's answers must equal Python's: for text within float tolerance of the same model,
//! for images within the rounding the decoders differ by (below).

mod common;

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

/// Float tolerance of the same model on the same tokens (a padded batch adds masked
/// positions, which change the sums' order only).
const TEXT_TOL: f64 = 1e-4;

#[test]
fn sentences_get_the_answers_python_gives_on_every_protocol() {
    let art = artefacts();
    let want = expected(&art);
    let sentences: Vec<&str> = want["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let logits = &want["logits"];
    let app = DocApp::new(
        &art,
        text_metadata(
            "bert.pt",
            json!({"file": "tokenizer.json", "max_length": want["max_length"]}),
            8,
        ),
    );
    let (s, _) = app.serve(&[]);
    // POST / with the documents as a list (rows of different lengths, padded together;
    // the last one cut to max_length) and as a named input.
    let all = outputs(&post_json(&s, &json!({"inputs": sentences})));
    assert_close(&all, logits, TEXT_TOL, "POST / list");
    let named = outputs(&post_json(&s, &json!({"inputs": {"text": [sentences[1]]}})));
    assert_close(&named, &json!([logits[1]]), TEXT_TOL, "POST / named");
    // One document as a text/plain body.
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain; charset=utf-8\r\n",
        sentences[3].as_bytes(),
    );
    assert_close(&outputs(&r), &json!([logits[3]]), TEXT_TOL, "text/plain");
    // Where its time went: the pre-processing and the pass (W3C Server-Timing, ms).
    let timing = r.header("server-timing").unwrap_or_default().to_string();
    let durs: Vec<f64> = timing
        .split(", ")
        .zip(["preprocess;dur=", "forward;dur="])
        .filter_map(|(part, name)| part.strip_prefix(name)?.parse().ok())
        .collect();
    assert!(
        durs.len() == 2 && durs.iter().all(|d| *d > 0.0),
        "{timing:?}"
    );
    // v2 with JSON strings and with binary data.
    let infer = "/v2/models/text%20app/infer";
    let v2 = json!({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                                "data": [sentences[0], sentences[2]]}]});
    let r = raw(s.port, "POST", infer, "", &serde_json::to_vec(&v2).unwrap());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_close(
        &r.json()["outputs"][0]["data"],
        &json!([logits[0], logits[2]]),
        TEXT_TOL,
        "v2 JSON",
    );
    let data = bytes_elements(&[sentences[4].as_bytes()]);
    let header = format!(
        r#"{{"inputs":[{{"name":"text","datatype":"BYTES","shape":[1],"parameters":{{"binary_data_size":{}}}}}]}}"#,
        data.len()
    );
    let (extra, body) = binary(&header, &data);
    let r = raw(s.port, "POST", infer, &extra, &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_close(
        &r.json()["outputs"][0]["data"],
        &json!([logits[4]]),
        TEXT_TOL,
        "v2 binary",
    );
    // NVIDIA's own client, the sentences as BYTES strings.
    let url = format!("127.0.0.1:{}", s.port);
    let got = python_json(
        "triton_documents.py",
        &[&url, "text app", "text", "--text"],
        sentences.join("\n").as_bytes(),
    );
    assert_close(&got["output"], logits, TEXT_TOL, "tritonclient");
}

#[test]
fn bad_text_is_a_400_naming_the_input_and_the_worker_keeps_serving() {
    let art = artefacts();
    let want = expected(&art);
    let long = want["sentences"][4].as_str().unwrap();
    let app = bert_text(
        &art,
        json!({"file": "tokenizer.json", "max_length": want["max_length"], "truncation": false}),
    );
    let (s, pid) = app.serve(&[]);
    // Too long with truncation off.
    let r = post_json(&s, &json!({"inputs": ["short", long]}));
    assert_eq!(r.status, 400);
    let e = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        e.contains("input text: element 1 has")
            && e.contains("max_length is 24 and truncation is off"),
        "{e}"
    );
    // Not UTF-8: a text/plain body and v2 binary data.
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain\r\n",
        b"caf\xe9",
    );
    assert_eq!(r.status, 400);
    let e = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        e.contains("input text: element 0 is not valid UTF-8"),
        "{e}"
    );
    let data = bytes_elements(&[b"ok", b"\xff\xfe"]);
    let header = format!(
        r#"{{"inputs":[{{"name":"text","datatype":"BYTES","shape":[2],"parameters":{{"binary_data_size":{}}}}}]}}"#,
        data.len()
    );
    let (extra, body) = binary(&header, &data);
    let r = raw(s.port, "POST", "/v2/models/text%20app/infer", &extra, &body);
    assert_eq!(r.status, 400);
    let e = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        e.contains("input text: element 1 is not valid UTF-8"),
        "{e}"
    );
    // A number where a document belongs; an image body for a text model.
    let r = post_json(&s, &json!({"inputs": [3]}));
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: image/png\r\n",
        b"\x89PNG",
    );
    assert_eq!(r.status, 400);
    let e = r.json()["error"].as_str().unwrap().to_string();
    assert!(e.contains("one input is an image input"), "{e}");
    // The same worker answers what fits.
    let r = post_json(&s, &json!({"inputs": ["short"]}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

#[test]
fn batched_documents_of_mixed_lengths_equal_one_by_one() {
    let art = artefacts();
    let want = expected(&art);
    let sentences: Vec<String> = want["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    // The model taking token_type_ids too (BERT's three inputs), in forward()'s order.
    let app = DocApp::new(
        &art,
        text_metadata(
            "bert3.pt",
            json!({"file": "tokenizer.json", "max_length": want["max_length"],
                   "feeds": ["input_ids", "attention_mask", "token_type_ids"]}),
            8,
        ),
    );
    // A long batch window, so that requests sent together share passes.
    let s = app.start(&["--batch-timeout-ms", "300", "--metrics-port", "0"]);
    let mport = s.metrics_port();
    s.wait_workers(1);
    let port = s.port;
    let answers: Vec<(usize, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = sentences
            .iter()
            .enumerate()
            .map(|(i, text)| {
                sc.spawn(move || {
                    let r = raw(
                        port,
                        "POST",
                        "/",
                        "Content-Type: text/plain\r\n",
                        text.as_bytes(),
                    );
                    (i, outputs(&r))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, got) in answers {
        assert_close(
            &got,
            &json!([want["logits"][i]]),
            TEXT_TOL,
            &format!("sentence {i}"),
        );
    }
    // The workers' figures reach /metrics with their heartbeat: wait until every request's
    // pre-processing (its own histogram) is counted.
    let preprocessed = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("vramfork_preprocess_duration_seconds_count"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let text = s.poll("the pre-processing counted in /metrics", || {
        let text = common::http(mport, "GET", "/metrics", None).body;
        (preprocessed(&text) == Some(sentences.len() as f64)).then_some(text)
    });
    // They did share passes: a pass of more than one row was counted.
    let shared = text.lines().any(|l| {
        l.starts_with("vramfork_batches_total{") && !l.contains("size=\"1\"") && !l.ends_with(" 0")
    });
    assert!(shared, "no batch of more than one request:\n{text}");
}

/// Images: decoders differ by a level or two (libjpeg-turbo in Pillow, zune-jpeg here;
/// Pillow rounds between its two resize passes): within 3/255 of a pixel, after
/// normalisation by std ≈ 0.22, is 0.06.
const PIXEL_TOL: f64 = 0.06;

#[test]
fn images_get_the_answers_torchvision_gives() {
    let art = artefacts();
    let want = expected(&art);
    let files: Vec<&str> = want["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    // The pre-processed tensor itself (a model returning its input): Resize(40) then
    // CenterCrop(32) then Normalize; and a stretch to 24×36 without normalisation.
    let crop = DocApp::new(
        &art,
        image_metadata(
            "ident.pt",
            json!({"size": [32, 32], "resize": "center_crop", "shorter_side": 40,
                   "mean": want["mean"], "std": want["std"]}),
            0,
        ),
    );
    let stretch = DocApp::new(
        &art,
        image_metadata("ident.pt", json!({"size": [24, 36]}), 0),
    );
    let (c, st) = (crop.start(&[]), stretch.start(&[]));
    c.wait_workers(1);
    st.wait_workers(1);
    for f in &files {
        let bytes = std::fs::read(art.join(f)).unwrap();
        let ct = if f.ends_with(".jpg") {
            "image/jpeg"
        } else {
            "image/png"
        };
        let r = raw(
            c.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &bytes,
        );
        assert_close(&outputs(&r)[0], &want["small_crop"][f], PIXEL_TOL, f);
        let r = raw(
            st.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &bytes,
        );
        assert_close(&outputs(&r)[0], &want["stretch"][f], PIXEL_TOL / 4.0, f);
    }
    drop((c, st));
    // ResNet-18 on the ImageNet pipeline: a JPEG body, and every file at once through v2
    // binary data (one request, four images) and as base64 in JSON.
    let app = DocApp::new(&art, image_metadata("resnet.pt", imagenet(), 4));
    let (s, _) = app.serve(&[]);
    let logits_tol = 0.02;
    let cat = std::fs::read(art.join("cat.jpg")).unwrap();
    let r = raw(s.port, "POST", "/", "Content-Type: image/jpeg\r\n", &cat);
    assert_close(
        &outputs(&r),
        &json!([want["resnet"]["cat.jpg"]]),
        logits_tol,
        "cat.jpg",
    );
    let blobs: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(art.join(f)).unwrap())
        .collect();
    let data = bytes_elements(&blobs.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let header = format!(
        r#"{{"inputs":[{{"name":"image","datatype":"BYTES","shape":[{}],"parameters":{{"binary_data_size":{}}}}}]}}"#,
        files.len(),
        data.len()
    );
    let (extra, body) = binary(&header, &data);
    let r = raw(
        s.port,
        "POST",
        "/v2/models/image%20app/infer",
        &extra,
        &body,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let all: Vec<Value> = files.iter().map(|f| want["resnet"][f].clone()).collect();
    assert_close(
        &r.json()["outputs"][0]["data"],
        &json!(all),
        logits_tol,
        "v2 binary",
    );
    use base64::Engine;
    let b64: Vec<String> = blobs
        .iter()
        .map(|b| base64::engine::general_purpose::STANDARD.encode(b))
        .collect();
    let r = post_json(&s, &json!({"inputs": b64}));
    assert_close(&outputs(&r), &json!(all), logits_tol, "base64 JSON");
    // NVIDIA's own client, the files as binary BYTES elements.
    let url = format!("127.0.0.1:{}", s.port);
    let paths: Vec<String> = files
        .iter()
        .map(|f| art.join(f).display().to_string())
        .collect();
    let mut args = vec![url.as_str(), "image app", "image", "--files"];
    args.extend(paths.iter().map(String::as_str));
    let got = python_json("triton_documents.py", &args, b"");
    assert_close(&got["output"], &json!(all), logits_tol, "tritonclient");
}

#[test]
fn bad_images_are_a_400_and_the_worker_is_unchanged() {
    let art = artefacts();
    let app = DocApp::new(
        &art,
        image_metadata(
            "ident.pt",
            json!({"size": [8, 8], "max_pixels": 1000000}),
            0,
        ),
    );
    let (s, pid) = app.serve(&["--max-body-mb", "4"]);
    let jpeg = std::fs::read(art.join("cat.jpg")).unwrap();
    let wide = std::fs::read(art.join("wide.png")).unwrap();
    // A PNG header claiming 30,000 × 30,000 pixels (and nothing else): refused from the
    // header, never decoded.
    let mut bomb = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    bomb.extend(30_000u32.to_be_bytes());
    bomb.extend(30_000u32.to_be_bytes());
    bomb.extend([8, 2, 0, 0, 0]);
    bomb.extend(crc32(&bomb[12..]).to_be_bytes());
    // The start of its image data (a decoder reads the header up to it).
    let idat_at = bomb.len() + 4;
    bomb.extend(2u32.to_be_bytes());
    bomb.extend(b"IDAT\x78\x9c");
    bomb.extend(crc32(&bomb[idat_at..]).to_be_bytes());
    let gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;".to_vec();
    for (body, want) in [
        (
            bomb,
            "30000×30000 (900000000 pixels); this input takes at most 1000000",
        ),
        (jpeg[..jpeg.len() / 3].to_vec(), "the JPEG is cut short"),
        (wide[..wide.len() / 2].to_vec(), "cannot decode the image"),
        (b"plain words".to_vec(), "not a JPEG or PNG image"),
        (gif, "GIF images are not supported"),
        (jpeg.clone(), "is 500×375 (187500 pixels)"),
    ] {
        let r = raw(s.port, "POST", "/", "Content-Type: image/jpeg\r\n", &body);
        let e = String::from_utf8_lossy(&r.body).to_string();
        if want.starts_with("is 500") {
            // Within the limit: decoded and answered.
            assert_eq!(r.status, 200, "{e}");
            continue;
        }
        assert_eq!(r.status, 400, "{e}");
        assert!(
            e.contains("input image: element 0: ") && e.contains(want),
            "{e}"
        );
        assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    }
    // Base64 that is not.
    let r = post_json(&s, &json!({"inputs": ["%%%"]}));
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("element 0 is not base64"));
    // MIME base64, wrapped at 76 columns (`base64` without -w0): the line ends are not data.
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&jpeg);
    let wrapped: Vec<String> = b64
        .as_bytes()
        .chunks(76)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let r = post_json(&s, &json!({ "inputs": [wrapped.join("\n")] }));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // The body's Content-Type (`http/body_kind.rs`): an image sent as octet-stream or with
    // curl -d's form type is still the image; a GIF, a multipart upload, or bytes that are
    // not JSON are refused naming what the body was sent as and what this model takes.
    for ct in [
        "application/octet-stream",
        "application/x-www-form-urlencoded",
    ] {
        let r = raw(
            s.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &jpeg,
        );
        assert_eq!(r.status, 200, "{ct}: {}", String::from_utf8_lossy(&r.body));
    }
    for (ct, body, want) in [
        (
            "image/gif",
            b"GIF89a".to_vec(),
            "GIF images are not supported (JPEG and PNG are)",
        ),
        (
            "multipart/form-data; boundary=x",
            b"--x".to_vec(),
            "send the document itself as the body",
        ),
        (
            "application/octet-stream",
            b"plain words".to_vec(),
            "sent as application/octet-stream",
        ),
    ] {
        let r = raw(
            s.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &body,
        );
        let e = String::from_utf8_lossy(&r.body).to_string();
        assert_eq!(r.status, 400, "{ct}: {e}");
        assert!(
            e.contains(want) && e.contains("image/jpeg or image/png"),
            "{ct}: {e}"
        );
    }
    // The worker is the one that started, and answers.
    let r = raw(s.port, "POST", "/", "Content-Type: image/jpeg\r\n", &jpeg);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

#[test]
fn bad_declarations_stop_the_start_with_the_field_named() {
    let art = artefacts();
    std::fs::write(art.join("not-a-tokenizer.json"), "not json").unwrap();
    for (metadata, want, code) in [
        (
            text_metadata(
                "bert.pt",
                json!({"file": "not-a-tokenizer.json", "max_length": 8}),
                0,
            ),
            "input text (`inputs[0].tokenizer.file`): cannot load the tokenizer",
            vramfork::master::exit::MODEL_LOAD,
        ),
        (
            text_metadata(
                "bert.pt",
                json!({"file": "missing.json", "max_length": 8}),
                0,
            ),
            "field `inputs[0].tokenizer.file`",
            vramfork::master::exit::CONFIG,
        ),
        (
            text_metadata("bert.pt", json!({"file": "tokenizer.json"}), 0),
            "field `inputs[0].tokenizer.max_length` is missing",
            vramfork::master::exit::CONFIG,
        ),
        (
            image_metadata("ident.pt", json!({"size": [8]}), 0),
            "field `inputs[0].image.size` must be [height, width]",
            vramfork::master::exit::CONFIG,
        ),
    ] {
        let app = DocApp::new(&art, metadata);
        let mut s = Server::spawn(&app.app, &app.args(&[]), &[]);
        let status = s.wait_exit(std::time::Duration::from_secs(120));
        assert_eq!(status.code(), Some(code), "{}", s.log_text());
        assert!(
            s.log_text().contains(want),
            "{want:?} not in\n{}",
            s.log_text()
        );
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[test]
fn labels_name_the_best_classes_of_each_row() {
    let art = artefacts();
    let want = expected(&art);
    let mut m = text_metadata(
        "bert.pt",
        json!({"file": "tokenizer.json", "max_length": want["max_length"]}),
        0,
    );
    m["outputs"] = json!([{"name": "logits", "datatype": "FP32", "shape": [-1, 3],
                           "labels": {"file": "labels.json", "top_k": 2, "softmax": true}}]);
    let app = DocApp::new(&art, m);
    std::fs::write(
        app.app.dir.path().join("labels.json"),
        r#"{"0": "negative", "1": "neutral", "2": "positive"}"#,
    )
    .unwrap();
    let (s, _) = app.serve(&[]);
    let sentences = &want["sentences"];
    let r = post_json(&s, &json!({"inputs": [sentences[0], sentences[3]]}));
    let answer = r.json();
    assert_close(
        &answer["outputs"],
        &json!([want["logits"][0], want["logits"][3]]),
        TEXT_TOL,
        "outputs",
    );
    let names = ["negative", "neutral", "positive"];
    for (row, i) in [0, 3].into_iter().enumerate() {
        let logits = flat(&want["logits"][i]);
        let max = logits.iter().cloned().fold(f64::MIN, f64::max);
        let exp: Vec<f64> = logits.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = exp.iter().sum();
        let mut ranked: Vec<(usize, f64)> = exp.iter().map(|e| e / sum).enumerate().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let got = &answer["labels"][row];
        assert_eq!(got.as_array().unwrap().len(), 2, "{answer}");
        for (k, (class, p)) in ranked.into_iter().take(2).enumerate() {
            assert_eq!(got[k][0], names[class], "{answer}");
            assert!((got[k][1].as_f64().unwrap() - p).abs() < 1e-4, "{answer}");
        }
    }
}

/// The README's export recipe traces transformers models with `torchscript=True`, which
/// return a one-element tuple `(logits,)` (issue 47: with `labels` on that output every
/// `POST /` answered 500, while v2 served it). A classifier traced on the spot to return
/// `(x @ w + b,)`: `POST /` answers the tuple as it is, labelled from the logits v2 gives,
/// with and without batching.
#[test]
fn a_one_element_tuple_with_labels_is_labelled_on_post_as_on_v2() {
    let dir = tempfile::tempdir().unwrap();
    let made = python_json(
        "make_tuple_classifier.py",
        &[dir.path().to_str().unwrap()],
        b"",
    );
    assert_eq!(made["ok"], true, "{made}");
    let names = ["cat", "dog", "bird"];
    std::fs::write(dir.path().join("labels.json"), json!(names).to_string()).unwrap();
    let rows = json!([
        [1.0, 2.0, 3.0, 4.0],
        [-1.0, 0.5, 2.0, -3.0],
        [0.0, 0.0, 0.0, 0.0]
    ]);
    for batch in [0, 4] {
        let app = DocApp::new(
            dir.path(),
            json!({
                "name": "tuple-classifier", "model": "tuple_logits.pt",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 3],
                             "labels": {"file": "labels.json", "top_k": 2, "softmax": true}}],
                "max_batch_size": batch,
            }),
        );
        let (s, pid) = app.serve(&[]);
        let v2 = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4],
                                    "data": flat(&rows)}]});
        let r = raw(
            s.port,
            "POST",
            "/v2/models/tuple-classifier/infer",
            "Content-Type: application/json\r\n",
            &serde_json::to_vec(&v2).unwrap(),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let out = &r.json()["outputs"][0];
        assert_eq!(
            (&out["name"], &out["shape"]),
            (&json!("logits"), &json!([3, 3]))
        );
        let logits: Vec<Vec<f64>> = flat(&out["data"]).chunks(3).map(<[f64]>::to_vec).collect();

        let r = post_json(&s, &json!({ "inputs": rows }));
        assert_eq!(
            r.status,
            200,
            "batch {batch}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
        let answer = r.json();
        // The tuple as the model returns it: an array of its one output.
        assert_close(&answer["outputs"], &json!([logits]), 1e-6, "outputs");
        let labels = answer["labels"].as_array().expect("labels");
        assert_eq!(labels.len(), 3, "{answer}");
        for (row, got) in logits.iter().zip(labels) {
            let max = row.iter().cloned().fold(f64::MIN, f64::max);
            let exp: Vec<f64> = row.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = exp.iter().sum();
            let mut ranked: Vec<(usize, f64)> = exp.iter().map(|e| e / sum).enumerate().collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            assert_eq!(got.as_array().unwrap().len(), 2, "{answer}");
            for (k, (class, p)) in ranked.into_iter().take(2).enumerate() {
                assert_eq!(got[k][0], names[class], "batch {batch}: {answer}");
                assert!((got[k][1].as_f64().unwrap() - p).abs() < 1e-6, "{answer}");
            }
        }
    }
}

/// A field misspelt inside an `inputs[]` or `outputs[]` entry (issue 47: `"label"` for
/// `labels` booted and answered without labels; `"tokeniser"` failed the boot with "declare
/// every argument of forward()") stops `app` with exit 2, naming its path and the field.
#[test]
fn misspelt_nested_fields_stop_the_start_naming_their_path() {
    let art = artefacts();
    for (metadata, want) in [
        (
            json!({"name": "text app", "model": "bert.pt",
                   "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                               "tokeniser": {"file": "tokenizer.json", "max_length": 24}}]}),
            "field `inputs[0].tokeniser` is so close to `inputs[0].tokenizer` that it looks like a typo of it (did you mean `tokenizer`?)",
        ),
        (
            json!({"name": "text app", "model": "bert.pt",
                   "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                               "tokenizer": {"file": "tokenizer.json", "max_length": 24}}],
                   "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 3],
                                "label": {"file": "labels.json"}}]}),
            "field `outputs[0].label` is so close to `outputs[0].labels` that it looks like a typo of it (did you mean `labels`?)",
        ),
    ] {
        let app = DocApp::new(&art, metadata);
        let mut s = Server::spawn(&app.app, &app.args(&[]), &[]);
        let status = s.wait_exit(common::PATIENCE);
        assert_eq!(status.code(), Some(vramfork::master::exit::CONFIG), "{}", s.log_text());
        assert!(s.log_text().contains(want), "{want:?} not in\n{}", s.log_text());
    }
}

/// A `text/plain` body that is a JSON request, as a browser's `fetch()` sends a string body,
/// to a model whose one input is text (issue 47: tokenized as the document, a 200 with wrong
/// logits): a 400 saying to send it as application/json; the same body as JSON is answered,
/// and a text that merely starts with a brace is still a text.
#[test]
fn a_json_request_sent_as_text_plain_to_a_text_model_is_refused_naming_the_fix() {
    let art = artefacts();
    let want = expected(&art);
    let app = bert_text(
        &art,
        json!({"file": "tokenizer.json", "max_length": want["max_length"]}),
    );
    let (s, pid) = app.serve(&[]);
    let body = serde_json::to_vec(&json!({"inputs": [want["sentences"][2]]})).unwrap();
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain;charset=UTF-8\r\n",
        &body,
    );
    let e = refusal(&r, 400, pid);
    assert!(
        e.contains("this text/plain body is a JSON request")
            && e.contains("send it with Content-Type: application/json"),
        "{e}"
    );
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: application/json\r\n",
        &body,
    );
    assert_close(&outputs(&r), &json!([want["logits"][2]]), TEXT_TOL, "JSON");
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain\r\n",
        b"{braces} open this text, and it is still a text",
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

/// A `max_length` beyond the model's position embeddings (issue 47: the warm-up ran on short
/// zeros and the first long text got a 500). The BERT-architecture model has 64 positions:
/// 64 tokens boot, 100 end the boot (exit 3) naming the field and what the model said.
#[test]
fn a_max_length_beyond_the_models_positions_stops_the_boot_naming_the_field() {
    let art = artefacts();
    let app = bert_text(&art, json!({"file": "tokenizer.json", "max_length": 100}));
    let mut s = Server::spawn(&app.app, &app.args(&[]), &[]);
    let status = s.wait_exit(common::PATIENCE);
    assert_eq!(
        status.code(),
        Some(vramfork::master::exit::MODEL_LOAD),
        "{}",
        s.log_text()
    );
    let want = "inputs[0].tokenizer.max_length = 100, but the model failed on 100 tokens";
    assert!(
        s.log_text().contains(want),
        "{want:?} not in\n{}",
        s.log_text()
    );
    // At the model's 64 positions it serves a text cut to them.
    let app = bert_text(&art, json!({"file": "tokenizer.json", "max_length": 64}));
    let (s, _) = app.serve(&[]);
    let long = "word ".repeat(500);
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain\r\n",
        long.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// The examples a newcomer is given for documents (issue 47; the text is in
/// docs/handoff/documents-newcomer.md), run as written: tritonclient sending sentences and
/// image files as `BYTES` (`tests/support/documents_example.py`), and a `tokenizer.json`
/// written by transformers' `save_pretrained` and `backend_tokenizer.save`, offline, which
/// the worker reads into the ids Python's tokenizer gives (`tokenizer_json_example.py`).
#[test]
fn the_newcomer_examples_run_as_written() {
    let art = artefacts();
    let want = expected(&art);
    let logits_out = |n: u32| json!([{"name": "logits", "datatype": "FP32", "shape": [-1, n]}]);
    let mut text = text_metadata(
        "bert.pt",
        json!({"file": "tokenizer.json", "max_length": want["max_length"]}),
        0,
    );
    text["outputs"] = logits_out(3);
    let app = DocApp::new(&art, text);
    let (s, _) = app.serve(&[]);
    let url = format!("127.0.0.1:{}", s.port);
    let sentences: Vec<&str> = (0..3)
        .map(|i| want["sentences"][i].as_str().unwrap())
        .collect();
    let mut args = vec!["text", url.as_str(), "text app"];
    args.extend(&sentences);
    let got = python_json("documents_example.py", &args, b"");
    let logits: Vec<Value> = (0..3).map(|i| want["logits"][i].clone()).collect();
    assert_close(&got["logits"], &json!(logits), TEXT_TOL, "texts");
    drop(s);

    let mut image = image_metadata("resnet.pt", imagenet(), 0);
    image["outputs"] = logits_out(10);
    let app = DocApp::new(&art, image);
    let (s, _) = app.serve(&[]);
    let url = format!("127.0.0.1:{}", s.port);
    let files = ["cat.jpg", "wide.png"].map(|f| art.join(f).display().to_string());
    let mut args = vec!["image", url.as_str(), "image app"];
    args.extend(files.iter().map(String::as_str));
    let got = python_json("documents_example.py", &args, b"");
    let logits = json!([want["resnet"]["cat.jpg"], want["resnet"]["wide.png"]]);
    assert_close(&got["logits"], &logits, 0.02, "images");
    drop(s);

    // A tokenizer.json from transformers (the metadata names it by its absolute path), in
    // the worker: a model returning its input shows the ids.
    let dir = tempfile::tempdir().unwrap();
    let sentences = ["What a lovely day.", "Terrible weather today."];
    let mut args = vec![dir.path().to_str().unwrap()];
    args.extend(sentences);
    let made = python_json("tokenizer_json_example.py", &args, b"");
    for file in ["tokenizer.json", "only/tokenizer.json"] {
        let app = DocApp::new(
            &art,
            text_metadata(
                "ident.pt",
                json!({"file": dir.path().join(file), "max_length": 16, "feeds": ["input_ids"]}),
                0,
            ),
        );
        let (s, _) = app.serve(&[]);
        for (i, sentence) in sentences.iter().enumerate() {
            let r = raw(
                s.port,
                "POST",
                "/",
                "Content-Type: text/plain\r\n",
                sentence.as_bytes(),
            );
            assert_eq!(outputs(&r), json!([made["ids"][i]]), "{file}: {sentence}");
        }
    }
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

#[test]
fn a_long_text_is_cut_before_tokenizing_and_gives_what_python_gives() {
    let art = artefacts();
    let want = expected(&art);
    let long = want["long_text"].as_str().unwrap();
    let app = bert_text(
        &art,
        json!({"file": "tokenizer.json", "max_length": want["max_length"]}),
    );
    let (s, pid) = app.serve(&[]);
    // 3000 newlines, then the README: its first max_length tokens are Python's (the whole
    // text tokenized, then cut).
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain\r\n",
        long.as_bytes(),
    );
    assert_close(
        &outputs(&r),
        &json!([want["long_logits"]]),
        TEXT_TOL,
        "long text",
    );
    // 40 MB of it: the same tokens (that only a prefix is tokenized is shown by the unit
    // test `a_huge_text_is_not_tokenized_in_full`, from the tokens' offsets, not by time).
    let huge = long.repeat((40 << 20) / long.len() + 1);
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain\r\n",
        huge.as_bytes(),
    );
    assert_close(
        &outputs(&r),
        &json!([want["long_logits"]]),
        TEXT_TOL,
        "40 MB text",
    );
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

#[test]
fn with_truncation_off_a_text_over_its_byte_bound_is_refused_unread() {
    let art = artefacts();
    let want = expected(&art);
    let app = bert_text(
        &art,
        json!({"file": "tokenizer.json", "max_length": want["max_length"], "truncation": false}),
    );
    let (s, pid) = app.serve(&[]);
    let big = "word ".repeat(6000);
    let r = post_json(&s, &json!({"inputs": ["short", big]}));
    let e = refusal(&r, 400, pid);
    assert!(
        e.contains("input text: element 1 has 30000 bytes")
            && e.contains("takes at most 24576 bytes of text"),
        "{e}"
    );
    let r = post_json(&s, &json!({"inputs": ["short"]}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

#[test]
fn too_many_documents_or_tensor_bytes_are_a_413_and_the_worker_keeps_serving() {
    let art = artefacts();
    let want = expected(&art);
    // Default max_documents (64): 100,000 empty strings are refused before tokenizing.
    let app = bert_text(
        &art,
        json!({"file": "tokenizer.json", "max_length": want["max_length"]}),
    );
    let (s, pid) = app.serve(&[]);
    let empties = vec![""; 100_000];
    let e = refusal(&post_json(&s, &json!({"inputs": empties})), 413, pid);
    assert!(
        e.contains("input text: 100000 documents in one request")
            && e.contains("at most 64 (`max_documents`)"),
        "{e}"
    );
    // Two million one-letter documents (a 9.5 MB body) cost about the body: the parser
    // keeps no more than max_documents and counts the rest (keeping them all raised the
    // peak by about 12 times the body: 582 MB for 48 MB, release build).
    let many = serde_json::to_vec(&json!({"inputs": vec!["a"; 2_000_000]})).unwrap();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = peak_rss(pid);
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: application/json\r\n",
        &many,
    );
    let e = refusal(&r, 413, pid);
    assert!(
        e.contains("input text: 2000000 documents in one request"),
        "{e}"
    );
    let grew = peak_rss(pid).saturating_sub(before);
    assert!(
        grew <= 3 * many.len() as u64,
        "the peak grew by {} MB for a {} MB body",
        grew >> 20,
        many.len() >> 20
    );
    let r = post_json(&s, &json!({"inputs": vec!["GPU"; 64]}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    drop(s);
    // Documents that could become more than 1 GiB of tensors: 2,100 of up to 65,536 tokens
    // (512 KiB of int64 each), within a max_documents of 4096.
    let app = DocApp::new(
        &art,
        text_metadata(
            "ident.pt",
            json!({"file": "tokenizer.json", "max_length": 65536, "feeds": ["input_ids"],
                   "max_documents": 4096}),
            0,
        ),
    );
    let (s, pid) = app.serve(&[]);
    let e = refusal(
        &post_json(&s, &json!({"inputs": vec!["GPU"; 2100]})),
        413,
        pid,
    );
    assert!(
        e.contains("input text: 2100 documents of up to 524288 bytes of tensors each")
            && e.contains("1073741824 bytes of tensors"),
        "{e}"
    );
    let r = post_json(&s, &json!({"inputs": ["GPU"]}));
    assert_eq!(outputs(&r), json!([want["ids"][2]]));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    drop(s);
    // Images, through v2 binary data: three for a max_documents of 2.
    let app = DocApp::new(
        &art,
        image_metadata("ident.pt", json!({"size": [8, 8], "max_documents": 2}), 0),
    );
    let (s, pid) = app.serve(&[]);
    let png = std::fs::read(art.join("gray.png")).unwrap();
    let data = bytes_elements(&[&png, &png, &png]);
    let header = format!(
        r#"{{"inputs":[{{"name":"image","datatype":"BYTES","shape":[3],"parameters":{{"binary_data_size":{}}}}}]}}"#,
        data.len()
    );
    let (extra, body) = binary(&header, &data);
    let r = raw(
        s.port,
        "POST",
        "/v2/models/image%20app/infer",
        &extra,
        &body,
    );
    let e = refusal(&r, 413, pid);
    assert!(
        e.contains("input image: 3 documents in one request")
            && e.contains("at most 2 (`max_documents`)"),
        "{e}"
    );
    let r = raw(s.port, "POST", "/", "Content-Type: image/png\r\n", &png);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

/// 64 solid-colour 40-megapixel PNGs (127 kB each) in one request (issue 46: it held a
/// worker for 14–16 s, and a request queued behind it for as long). By default refused
/// from the headers for `max_request_pixels` (413), before anything is decoded; with the
/// bound raised, stopped between images at `--request-timeout` (504) and at the client's
/// deadline (503), the same worker serving the next request.
#[test]
fn costly_image_requests_are_bounded_and_stopped_at_their_deadlines() {
    use base64::Engine;
    let art = artefacts();
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.png");
    python_json(
        "solid_png.py",
        &[big.to_str().unwrap(), "8000", "5000"],
        b"",
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&big).unwrap());
    let body = json!({ "inputs": vec![b64; 64] });
    let gray = std::fs::read(art.join("gray.png")).unwrap();

    let app = DocApp::new(&art, image_metadata("ident.pt", json!({"size": [8, 8]}), 0));
    let (s, pid) = app.serve(&[]);
    let e = refusal(&post_json(&s, &body), 413, pid);
    assert!(
        e.contains("input image: its 64 images have 2560000000 pixels together")
            && e.contains("at most 256000000 (`max_request_pixels`)"),
        "{e}"
    );
    drop(s);

    let app = DocApp::new(
        &art,
        image_metadata(
            "ident.pt",
            json!({"size": [8, 8], "max_request_pixels": 4_000_000_000u64}),
            0,
        ),
    );
    let (s, pid) = app.serve(&["--request-timeout", "1"]);
    let e = refusal(&post_json(&s, &body), 504, pid);
    assert!(
        e.contains(
            "pre-processing the request's documents ran past the request timeout of 1000 ms"
        ),
        "{e}"
    );
    // The worker serves on: its one pre-processing slot is free again once the image being
    // decoded at the deadline is done (the other 63 never are).
    let r = raw(s.port, "POST", "/", "Content-Type: image/png\r\n", &gray);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: application/json\r\nX-Request-Timeout: 0.5\r\n",
        &serde_json::to_vec(&body).unwrap(),
    );
    let e = refusal(&r, 503, pid);
    assert!(e.contains("X-Request-Timeout 500 ms"), "{e}");
    let r = raw(s.port, "POST", "/", "Content-Type: image/png\r\n", &gray);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    let exits = s.events_named("worker_exited");
    assert!(exits.is_empty(), "no worker went: {}", s.log_text());
}

#[test]
fn extreme_strips_are_refused_and_motion_photos_decoded() {
    let art = artefacts();
    let app = DocApp::new(
        &art,
        image_metadata(
            "ident.pt",
            json!({"size": [224, 224], "resize": "center_crop", "shorter_side": 256,
                   "dtype": "uint8"}),
            0,
        ),
    );
    let (s, pid) = app.serve(&[]);
    // A PNG header claiming 1,000,000 × 40 (40 megapixels: within max_pixels), which
    // resized to a shorter side of 256 would be 6,400,000 × 256 (20 GB as floats).
    let mut strip = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    strip.extend(1_000_000u32.to_be_bytes());
    strip.extend(40u32.to_be_bytes());
    strip.extend([8, 2, 0, 0, 0]);
    strip.extend(crc32(&strip[12..]).to_be_bytes());
    let idat_at = strip.len() + 4;
    strip.extend(2u32.to_be_bytes());
    strip.extend(b"IDAT\x78\x9c");
    strip.extend(crc32(&strip[idat_at..]).to_be_bytes());
    let r = raw(s.port, "POST", "/", "Content-Type: image/png\r\n", &strip);
    let e = refusal(&r, 400, pid);
    assert!(
        e.contains("input image: element 0: the image is 1000000×40")
            && e.contains("6400000×256 (1638400000 pixels) before its centre is cut"),
        "{e}"
    );
    // A motion photo: Pillow's JPEG, then a video whose bytes hold FF DA (a scan's start)
    // and no end-of-image marker after it. The image is what Pillow sees.
    let jpeg = std::fs::read(art.join("cat.jpg")).unwrap();
    let mut motion = jpeg.clone();
    motion.extend(b"\0\0\0\x18ftypmp42\0\0\0\0isommp42\xff\xda\x00\x0c\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00");
    motion.extend((0..4096u32).map(|i| (i * 7919 % 251) as u8));
    let cat = outputs(&raw(
        s.port,
        "POST",
        "/",
        "Content-Type: image/jpeg\r\n",
        &jpeg,
    ));
    let r = raw(s.port, "POST", "/", "Content-Type: image/jpeg\r\n", &motion);
    assert_eq!(outputs(&r), cat);
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
}

#[test]
fn text_plain_bodies_are_json_for_models_without_a_text_input() {
    // Browsers send JSON as text/plain to spare a CORS preflight: a model whose input is
    // not text parses it as JSON, as before documents existed.
    let app = common::App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#);
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let pid = s.wait_workers(1)[0];
    let cases: Value = serde_json::from_slice(
        &std::fs::read(common::fixtures().join("mlp_expected.json")).unwrap(),
    )
    .unwrap();
    let case = &cases["cases"][0];
    let body = serde_json::to_vec(&json!({"inputs": case["inputs"]})).unwrap();
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain;charset=UTF-8\r\n",
        &body,
    );
    assert_close(&outputs(&r), &case["outputs"], 1e-5, "text/plain JSON");
    assert_eq!(r.header("x-worker-pid"), Some(pid.to_string().as_str()));
    // An image body is still refused for it, with the reason.
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: image/png\r\n",
        b"\x89PNG",
    );
    let e = refusal(&r, 400, pid);
    assert!(e.contains("one input is an image input"), "{e}");
}

#[test]
fn max_length_padding_pads_every_row_with_pad_id() {
    let art = artefacts();
    let want = expected(&art);
    let max_length = want["max_length"].as_u64().unwrap() as usize;
    // A model returning its input shows the ids themselves.
    let app = DocApp::new(
        &art,
        text_metadata(
            "ident.pt",
            json!({"file": "tokenizer.json", "max_length": max_length, "padding": "max_length",
                   "pad_id": 7, "feeds": ["input_ids"]}),
            4,
        ),
    );
    let (s, _) = app.serve(&[]);
    let sentences = &want["sentences"];
    let padded = |i: usize| {
        let mut ids: Vec<Value> = want["ids"][i].as_array().unwrap().clone();
        assert!(ids.len() <= max_length);
        ids.resize(max_length, json!(7));
        Value::Array(ids)
    };
    let r = post_json(
        &s,
        &json!({"inputs": [sentences[2], sentences[0], sentences[4]]}),
    );
    assert_eq!(outputs(&r), json!([padded(2), padded(0), padded(4)]));
    let r = raw(
        s.port,
        "POST",
        "/",
        "Content-Type: text/plain\r\n",
        sentences[2].as_str().unwrap().as_bytes(),
    );
    assert_eq!(outputs(&r), json!([padded(2)]));
}

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

/// What one image at the default `max_pixels` (40 MP) costs a worker at its peak, above
/// its resting memory (the README's figures). Ignored by default: it holds hundreds of MB
/// and decodes for a minute in a debug build. Run it with
/// `cargo nextest run --test documents --run-ignored only --no-capture image_memory_peak`.
#[test]
#[ignore]
fn image_memory_peak() {
    let art = artefacts();
    let big = art.join("big");
    if !big.join("big_rgba.png").is_file() {
        let made = python_json("make_documents.py", &["--big", big.to_str().unwrap()], b"");
        assert_eq!(made["ok"], true, "{made}");
    }
    let app = DocApp::new(&art, image_metadata("ident.pt", imagenet(), 0));
    for (f, ct) in [
        ("big.jpg", "image/jpeg"),
        ("big_progressive.jpg", "image/jpeg"),
        ("big_rgba.png", "image/png"),
    ] {
        let bytes = std::fs::read(big.join(f)).unwrap();
        // A fresh worker each time: the peak only grows.
        let (s, pid) = app.serve(&["--max-body-mb", "128"]);
        let before = peak_rss(pid);
        let r = raw(
            s.port,
            "POST",
            "/",
            &format!("Content-Type: {ct}\r\n"),
            &bytes,
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let grew = peak_rss(pid).saturating_sub(before);
        println!(
            "{f} ({} MB body): the worker's peak grew by {} MB",
            bytes.len() >> 20,
            grew >> 20
        );
        // 3 bytes a pixel decoded, 3 in the tensor, the decoder's own and the body.
        assert!(
            grew < (40_000_000 * 10) + bytes.len() as u64 * 2,
            "{f}: {grew}"
        );
    }
}
