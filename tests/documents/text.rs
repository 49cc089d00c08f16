//! Text documents: tokenized in the worker as Python's tokenizer does, on every protocol; bad
//! text, long text, padding and `text/plain` bodies.

use super::*;

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

/// A `text/plain` body that is a JSON request, as a browser's `fetch()` sends a string body,
/// to a model whose one input is text (tokenized as the document, a 200 with wrong
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
