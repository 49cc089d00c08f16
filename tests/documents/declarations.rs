//! Declarations in the metadata: bad or misspelt blocks stop the start naming the field;
//! labels; the newcomer examples as the docs write them.

use super::*;

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
/// return a one-element tuple `(logits,)` (with `labels` on that output every
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

/// A field misspelt inside an `inputs[]` or `outputs[]` entry (`"label"` for
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

/// A `max_length` beyond the model's position embeddings (the warm-up ran on short
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

/// The examples a newcomer is given for documents (docs/metadata.md), run as written:
/// tritonclient sending sentences and image files as `BYTES`
/// (`tests/support/documents_example.py`), and a `tokenizer.json` written by transformers'
/// `save_pretrained` and `backend_tokenizer.save`, offline, which the worker reads into the
/// ids Python's tokenizer gives (`tokenizer_json_example.py`).
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
