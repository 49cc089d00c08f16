//! OpenAI's embeddings API: `POST /v1/embeddings`, `GET /v1/models`, called by
//! OpenAI's own Python SDK and LangChain's `OpenAIEmbeddings` against the real `app` serving
//! a BERT encoder made on the spot by `tests/support/make_embeddings.py` (a WordPiece
//! `tokenizer.json` trained on the README, transformers' BertModel with random weights,
//! traced). The vectors must equal, within 1e-5, those sentence-transformers gives for the
//! same encoder and tokenizer (`models.Transformer` + `Pooling` + `Normalize`, `truncate_dim`
//! for the Matryoshka cut), which the script first checks against torch run on each sentence
//! alone; every refusal is a 400 (or 401, 404) in OpenAI's error shape naming
//! the field at fault, and the worker serves on after each.

mod common;

use std::path::{Path, PathBuf};

use common::{made_once, python_json, App, Server};
use serde_json::{json, Value};

/// The artefacts of `tests/support/make_embeddings.py` (made once per version).
fn artefacts() -> PathBuf {
    made_once("make_embeddings.py", &["wordpiece.py"], "embeddings")
}

fn expected(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap()
}

/// `app --production --workers 1 --torch-threads 1 ARGS` serving `model` behind a text input
/// (max_length 24, truncation on) with `extra` merged into the metadata, in a fresh folder
/// holding links to the artefacts; returns once its worker is ready.
fn serve(model: &str, extra: Value, args: &[&str]) -> (Server, App, Value) {
    let art = artefacts();
    let app = App {
        dir: tempfile::tempdir().unwrap(),
    };
    for f in std::fs::read_dir(&art).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, app.dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let mut metadata = json!({
        "name": "text-embedder",
        "model": model,
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                    "tokenizer": {"file": "tokenizer.json", "max_length": 24, "truncation": true}}],
    });
    for (k, v) in extra.as_object().unwrap() {
        metadata[k] = v.clone();
    }
    std::fs::write(app.metadata(), serde_json::to_vec(&metadata).unwrap()).unwrap();
    let mut all = vec!["--production", "--workers", "1", "--torch-threads", "1"];
    all.extend_from_slice(args);
    let s = Server::start(&app, &all);
    s.wait_workers(1);
    (s, app, expected(&art))
}

/// Every vector of `got` within 1e-5 of `want`'s, element by element.
fn assert_vectors(got: &Value, want: &Value, what: &str) {
    let (got, want) = (got.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(got.len(), want.len(), "{what}: vectors");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.as_array().unwrap(), w.as_array().unwrap());
        assert_eq!(g.len(), w.len(), "{what}: width of vector {i}");
        for (j, (a, b)) in g.iter().zip(w).enumerate() {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b).abs() <= 1e-5, "{what}: vector {i}[{j}] {a} != {b}");
        }
    }
}

fn sentences(exp: &Value) -> Vec<String> {
    exp["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn post(s: &Server, body: &Value) -> common::Response {
    s.post("/v1/embeddings", &body.to_string())
}

/// A refusal: its status, OpenAI's error shape, and the field it names; the error object.
fn refused(s: &Server, body: &Value, status: u16, param: Option<&str>) -> Value {
    let r = post(s, body);
    assert_eq!(r.status, status, "{body}: {}", r.body);
    let e = r.json()["error"].clone();
    for k in ["message", "type", "param", "code"] {
        assert!(e.get(k).is_some(), "{body}: no `{k}` in {e}");
    }
    assert_eq!(e["param"].as_str(), param, "{body}: {e}");
    e
}

fn message(e: &Value) -> &str {
    e["message"].as_str().unwrap()
}

fn tokens(exp: &Value) -> u64 {
    exp["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_array().unwrap().len() as u64)
        .sum()
}

#[test]
fn mean_pooling_through_the_sdk_equals_sentence_transformers_in_several_passes() {
    // Two inputs a pass: the five sentences take three.
    let (s, _app, exp) = serve(
        "bert.pt",
        json!({"max_batch_size": 2,
               "embeddings": {"pooling": "mean", "normalize": true, "matryoshka": true,
                              "token_ids": true}}),
        &[],
    );
    let texts = sentences(&exp);
    let port = s.port.to_string();
    let got = python_json(
        "openai_client.py",
        &[&port, "sdk"],
        json!({"texts": texts}).to_string().as_bytes(),
    );
    assert_vectors(
        &got["default"],
        &exp["mean_normalized"],
        "SDK default (base64)",
    );
    assert_vectors(&got["float"], &exp["mean_normalized"], "SDK float");
    // A client that reads base64 strings and nothing else (the SDK takes floats too).
    let strict = python_json(
        "openai_client.py",
        &[&port, "base64_only"],
        json!({"texts": texts}).to_string().as_bytes(),
    );
    assert_vectors(&strict["vectors"], &exp["mean_normalized"], "base64 only");
    assert_eq!(got["indices"], json!([0, 1, 2, 3, 4]));
    assert_eq!(got["model"], "text-embedder");
    let n = tokens(&exp);
    assert_eq!(got["usage"]["prompt_tokens"], n, "{got}");
    assert_eq!(got["usage"]["total_tokens"], n, "{got}");
    // Matryoshka: cut to 16, then normalised again.
    let cut = python_json(
        "openai_client.py",
        &[&port, "sdk"],
        json!({"texts": texts, "dimensions": 16})
            .to_string()
            .as_bytes(),
    );
    assert_vectors(&cut["float"], &exp["mean_16"], "dimensions 16");
    // The long sentence is cut to max_length, and the answer says how many were.
    let cut_count = exp["truncated"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t == &&json!(true))
        .count();
    assert!(cut_count >= 1, "{exp}");
    let r = post(
        &s,
        &json!({"input": texts, "model": "any name", "encoding_format": "float"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.header("x-truncated-inputs"),
        Some(cut_count.to_string().as_str())
    );
    assert_eq!(r.json()["model"], "any name");
    assert_eq!(r.json()["object"], "list");
    assert_eq!(r.json()["data"][0]["object"], "embedding");
    // Token ids of the model's own vocabulary, declared accepted: the same vectors.
    let r = post(
        &s,
        &json!({"input": exp["ids"], "model": "m", "encoding_format": "float"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let vectors: Vec<Value> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["embedding"].clone())
        .collect();
    assert_vectors(&json!(vectors), &exp["mean_normalized"], "token ids");
    assert_eq!(r.json()["usage"]["prompt_tokens"], n);
    let e = refused(
        &s,
        &json!({"input": [[1, 2, 800]], "model": "m"}),
        400,
        Some("input"),
    );
    assert!(
        message(&e).contains("token id 800") && message(&e).contains("800 ids"),
        "{e}"
    );
    // Wider than the model's vectors.
    let e = refused(
        &s,
        &json!({"input": "x", "model": "m", "dimensions": 65}),
        400,
        Some("dimensions"),
    );
    assert!(message(&e).contains("have 64"), "{e}");
}

/// The SDK's `AsyncOpenAI` over HTTP/2 (httpx with `http2=True, http1=False`, as an async
/// stack configures it): the answer comes on HTTP/2, and the vectors equal sentence-transformers' whether
/// one request holds every input or each input is a request of its own, all in flight at
/// once on the one connection.
#[test]
fn the_sdks_async_client_over_http2_gets_sentence_transformers_vectors() {
    let (s, _app, exp) = serve(
        "bert.pt",
        json!({"embeddings": {"pooling": "mean", "normalize": true}}),
        &[],
    );
    let texts = sentences(&exp);
    let got = python_json(
        "openai_client.py",
        &[&s.port.to_string(), "async_h2"],
        json!({"texts": texts}).to_string().as_bytes(),
    );
    assert_eq!(got["http_version"], "HTTP/2");
    assert_vectors(
        &got["default"],
        &exp["mean_normalized"],
        "AsyncOpenAI, one request (base64)",
    );
    assert_vectors(
        &got["each"],
        &exp["mean_normalized"],
        "AsyncOpenAI, a request per input",
    );
}

#[test]
fn cls_pooling_and_langchain_equal_sentence_transformers_and_token_ids_are_refused_by_default() {
    let (s, _app, exp) = serve("bert.pt", json!({"embeddings": {"pooling": "cls"}}), &[]);
    let texts = sentences(&exp);
    let port = s.port.to_string();
    let got = python_json(
        "openai_client.py",
        &[&port, "sdk"],
        json!({"texts": texts}).to_string().as_bytes(),
    );
    assert_vectors(&got["default"], &exp["cls"], "SDK default (base64)");
    assert_vectors(&got["float"], &exp["cls"], "SDK float");
    let lc = python_json(
        "openai_client.py",
        &[&port, "langchain"],
        json!({"texts": texts}).to_string().as_bytes(),
    );
    assert_vectors(
        &lc["vectors"],
        &exp["cls"],
        "LangChain, check_embedding_ctx_length=False",
    );
    // LangChain's default sends token ids of OpenAI's tokenizer: refused, naming the fix.
    let e = &lc["default_error"];
    assert_eq!(e["status"], 400, "{lc}");
    assert!(
        message(e).contains("check_embedding_ctx_length=False"),
        "{e}"
    );
    let e = refused(
        &s,
        &json!({"input": [[5, 6]], "model": "m"}),
        400,
        Some("input"),
    );
    assert_eq!(e["code"], "token_ids_not_accepted");
    // Not Matryoshka: only its own width.
    let e = refused(
        &s,
        &json!({"input": "x", "model": "m", "dimensions": 16}),
        400,
        Some("dimensions"),
    );
    assert!(
        message(&e).contains("Matryoshka") && message(&e).contains("takes 64"),
        "{e}"
    );
    let r = post(&s, &json!({"input": "x", "model": "m", "dimensions": 64}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["data"][0]["embedding"].as_array().unwrap().len(),
        64
    );
}

#[test]
fn two_thousand_and_forty_eight_inputs_in_one_request_and_each_refusal() {
    let (s, _app, exp) = serve(
        "bert.pt",
        json!({"embeddings": {"pooling": "cls"}}),
        &["--max-body-mb", "1", "--metrics-port", "0", "--access-log"],
    );
    let texts = sentences(&exp);
    let many: Vec<&String> = (0..2048).map(|i| &texts[i % texts.len()]).collect();
    let r = post(
        &s,
        &json!({"input": many, "model": "m", "encoding_format": "float"}),
    );
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(500)]);
    let data = r.json()["data"].as_array().unwrap().clone();
    assert_eq!(data.len(), 2048);
    let want: Vec<Value> = (0..2048)
        .map(|i| exp["cls"][i % texts.len()].clone())
        .collect();
    let got: Vec<Value> = data.iter().map(|d| d["embedding"].clone()).collect();
    assert_vectors(&json!(got), &json!(want), "2048 inputs");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
    }
    let pid = r.pid();
    let too_many: Vec<&str> = vec!["x"; 2049];
    for (body, param, says) in [
        (
            json!({"input": too_many, "model": "m"}),
            "input",
            "at most 2048",
        ),
        (
            json!({"input": 7, "model": "m"}),
            "input",
            "must be a string",
        ),
        (
            json!({"input": ["a", 7], "model": "m"}),
            "input",
            "`input[1]` is not a string",
        ),
        (
            json!({"input": [[1, 2], "a"], "model": "m"}),
            "input",
            "`input[1]` is not an array",
        ),
        (json!({"input": [], "model": "m"}), "input", "empty array"),
        (json!({"input": "", "model": "m"}), "input", "empty string"),
        (
            json!({"input": [1.5], "model": "m"}),
            "input",
            "not a token id",
        ),
        (json!({"input": "x"}), "model", "`model` is required"),
        (
            json!({"input": "x", "model": "m", "encoding_format": "int8"}),
            "encoding_format",
            "\"float\"",
        ),
        (
            json!({"input": "x", "model": "m", "dimensions": 0}),
            "dimensions",
            "positive integer",
        ),
    ] {
        let e = refused(&s, &body, 400, Some(param));
        assert!(message(&e).contains(says), "{body}: {e}");
        assert_eq!(e["type"], "invalid_request_error");
    }
    let r = s.post("/v1/embeddings", "{not json");
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "invalid_json");
    // A body over --max-body-mb: 413 in OpenAI's shape, and the connection closes.
    // (Its head alone, declaring 2 MB: refused on it, so no unread body resets the answer.)
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let head = "POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2000000\r\n\r\n";
    std::io::Write::write_all(&mut c, head.as_bytes()).unwrap();
    let mut all = Vec::new();
    std::io::Read::read_to_end(&mut c, &mut all).unwrap();
    let r = common::parse_response(&all).unwrap();
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.json()["error"]["code"], "body_too_large");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(
        message(&r.json()["error"]).contains("--max-body-mb"),
        "{}",
        r.body
    );
    // The client's request id comes back, as on every endpoint.
    let r = common::raw(
        s.port,
        "POST",
        "/v1/embeddings",
        "X-Request-Id: embed-0042\r\n",
        json!({"input": "x", "model": "m"}).to_string().as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("embed-0042"));
    let timing = r.header("server-timing").unwrap_or_default();
    assert!(
        timing.starts_with("preprocess;dur=") && timing.contains(", forward;dur="),
        "{timing}"
    );
    // The client's deadline, as on every endpoint: one that passed before the request could
    // start is refused unrun (503), and a malformed one is a 400.
    let one = json!({"input": "x", "model": "m"}).to_string();
    let r = common::raw(
        s.port,
        "POST",
        "/v1/embeddings",
        "X-Request-Timeout: 0.000001\r\n",
        one.as_bytes(),
    );
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "deadline_expired");
    assert_eq!(r.json()["error"]["type"], "server_error");
    let r = common::raw(
        s.port,
        "POST",
        "/v1/embeddings",
        "X-Request-Timeout: soon\r\n",
        one.as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(message(&r.json()["error"]).contains("X-Request-Timeout"));
    // In the access log and /metrics as the other endpoints are.
    let line = s.poll("the access line of embed-0042", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "access" && e.str("request_id") == Some("embed-0042"))
    });
    assert_eq!(line.str("path"), Some("/v1/embeddings"));
    assert_eq!(line.u64("status"), Some(200));
    let port = s.metrics_port();
    s.poll("/v1/embeddings answers in /metrics", || {
        let body = common::http(port, "GET", "/metrics", None).body;
        (body.contains(r#"endpoint="embeddings",code="200""#)
            && body.contains(r#"endpoint="embeddings",code="400""#)
            && body.contains(r#"endpoint="embeddings",code="413""#))
        .then_some(())
    });
    // The same worker answers after every refusal.
    let r = post(&s, &json!({"input": "x", "model": "m"}));
    assert_eq!((r.status, r.pid()), (200, pid), "{}", r.body);
}

#[test]
fn pooling_none_takes_the_models_own_vectors() {
    let (s, _app, exp) = serve("cls.pt", json!({"embeddings": {"pooling": "none"}}), &[]);
    let texts = sentences(&exp);
    let port = s.port.to_string();
    let got = python_json(
        "openai_client.py",
        &[&port, "sdk"],
        json!({"texts": texts}).to_string().as_bytes(),
    );
    assert_vectors(&got["float"], &exp["cls"], "pooling none");
    assert_vectors(&got["default"], &exp["cls"], "pooling none, base64");
}

/// The same encoder as a `torch.export` program (`bert.pt2`, batch and tokens dynamic): at
/// boot the program's two inputs are checked against the two tensors the text input becomes
/// (`input_ids`, `attention_mask`), not against the one `BYTES` input clients send; then its
/// vectors are sentence-transformers', in passes of 4 and 1.
#[test]
fn a_torch_export_program_of_the_encoder_gets_sentence_transformers_vectors() {
    let (s, _app, exp) = serve(
        "bert.pt2",
        json!({"max_batch_size": 4, "embeddings": {"pooling": "mean", "normalize": true}}),
        &[],
    );
    let port = s.port.to_string();
    let got = python_json(
        "openai_client.py",
        &[&port, "sdk"],
        json!({"texts": sentences(&exp)}).to_string().as_bytes(),
    );
    assert_vectors(&got["default"], &exp["mean_normalized"], "program, base64");
    assert_vectors(&got["float"], &exp["mean_normalized"], "program, float");
    assert_eq!(got["usage"]["prompt_tokens"], tokens(&exp), "{got}");
}

#[test]
fn models_are_listed_and_a_model_without_embeddings_is_a_404_naming_the_block() {
    let art = artefacts();
    let keys = art
        .parent()
        .unwrap()
        .join(format!("openai-keys-{}", std::process::id()));
    std::fs::write(&keys, "sk-embeddings-test-key-0123456789\n").unwrap();
    let (s, _app, _exp) = serve(
        "bert.pt",
        json!({}),
        &["--api-key-file", keys.to_str().unwrap()],
    );
    let auth = "Authorization: Bearer sk-embeddings-test-key-0123456789\r\n";
    let call = |method: &str, path: &str, body: &[u8], headers: &str| {
        let r = common::raw(s.port, method, path, headers, body);
        (r.status, r.json())
    };
    // Token auth as everywhere, refused in OpenAI's shape.
    let (status, body) = call("GET", "/v1/models", b"", "");
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");
    let (status, body) = call("GET", "/v1/models", b"", auth);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"object": "list", "data": [{"id": "text-embedder", "object": "model",
                                           "created": 0, "owned_by": "vramfork",
                                           "name": "text-embedder", "ready": true}],
               "models": ["text-embedder"]})
    );
    let (status, body) = call("GET", "/v1/models/text-embedder", b"", auth);
    assert_eq!(
        (status, &body["id"]),
        (200, &json!("text-embedder")),
        "{body}"
    );
    let (status, body) = call("GET", "/v1/models/gpt-4", b"", auth);
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("model_not_found")),
        "{body}"
    );
    let req = json!({"input": "x", "model": "m"}).to_string();
    let headers = format!("{auth}Content-Type: application/json\r\n");
    let (status, body) = call("POST", "/v1/embeddings", req.as_bytes(), &headers);
    assert_eq!(status, 404, "{body}");
    let m = body["error"]["message"].as_str().unwrap();
    assert!(m.contains("no `embeddings` block"), "{body}");
    let (status, body) = call("GET", "/v1/embeddings", b"", auth);
    assert_eq!(status, 405, "{body}");
    assert!(body["error"]["message"].as_str().is_some(), "{body}");
    let _ = std::fs::remove_file(&keys);
}

#[test]
fn a_bad_embeddings_block_stops_the_start_naming_the_field() {
    let art = artefacts();
    for (block, want) in [
        (
            json!({"pooling": "max"}),
            "field `embeddings.pooling` is \"max\"",
        ),
        (
            json!({"pooling": "cls", "normalise": true}),
            "`embeddings.normalise` is so close to `embeddings.normalize`",
        ),
    ] {
        let app = App {
            dir: tempfile::tempdir().unwrap(),
        };
        std::os::unix::fs::symlink(art.join("bert.pt"), app.dir.path().join("bert.pt")).unwrap();
        std::os::unix::fs::symlink(
            art.join("tokenizer.json"),
            app.dir.path().join("tokenizer.json"),
        )
        .unwrap();
        let metadata = json!({
            "name": "text-embedder", "model": "bert.pt",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                        "tokenizer": {"file": "tokenizer.json", "max_length": 24}}],
            "embeddings": block,
        });
        std::fs::write(app.metadata(), metadata.to_string()).unwrap();
        let mut s = Server::spawn(&app, &["--production", "--workers", "1"], &[]);
        let status = s.wait_exit(std::time::Duration::from_secs(60));
        assert_eq!(
            status.code(),
            Some(vramfork::master::exit::CONFIG),
            "{}",
            s.log_text()
        );
        assert!(
            s.log_text().contains(want),
            "{want:?} not in\n{}",
            s.log_text()
        );
    }
}

/// `vramfork_text_tokens_total{kind}` summed over the master's scrape (0 while absent).
fn text_tokens(metrics_port: u16, kind: &str) -> u64 {
    let r = common::http(metrics_port, "GET", "/metrics", None);
    assert_eq!(r.status, 200, "{r:?}");
    r.body
        .lines()
        .filter(|l| l.starts_with("vramfork_text_tokens_total{"))
        .filter(|l| l.contains(&format!("kind=\"{kind}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn mixed_lengths_run_shortest_first_each_vector_its_inputs_own_in_the_requests_order() {
    // Eight rows a pass; 200 inputs whose lengths jump about (1 to 23 words of the README's
    // sentences, truncated at max_length 24).
    let (s, _app, exp) = serve(
        "bert.pt",
        json!({"max_batch_size": 8, "embeddings": {"pooling": "mean", "normalize": true}}),
        &["--metrics-port", "0"],
    );
    let mport = s.metrics_port();
    let words: Vec<String> = sentences(&exp)
        .join(" ")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let texts: Vec<String> = (0..200)
        .map(|i| {
            let n = 1 + (i * 7919 % 23);
            (0..n)
                .map(|k| words[(i + k) % words.len()].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let all = post(&s, &json!({"input": texts, "model": "text-embedder"}));
    assert_eq!(all.status, 200, "{}", all.body);
    let all = all.json();
    // Each input alone: its vector, and its length (its `usage`).
    let mut lengths = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let one = post(&s, &json!({"input": t, "model": "text-embedder"}));
        assert_eq!(one.status, 200, "{}", one.body);
        let one = one.json();
        lengths.push(one["usage"]["prompt_tokens"].as_u64().unwrap());
        assert_eq!(
            all["data"][i]["index"], i,
            "the answer keeps the request's order"
        );
        assert_vectors(
            &json!([all["data"][i]["embedding"]]),
            &json!([one["data"][0]["embedding"]]),
            &format!("input {i} in the request of 200, against it alone"),
        );
    }
    assert_eq!(
        all["usage"]["prompt_tokens"].as_u64().unwrap(),
        lengths.iter().sum::<u64>()
    );
    // The request of 200 padded each pass (of at most 8) to its longest, shortest rows
    // first: never more than sorted chunks of 8 pad (the fewest passes; on the CPU the cut
    // pads least for its passes), far less than arrival order; each input alone has no
    // padding.
    let mut sorted = lengths.clone();
    sorted.sort_unstable();
    let chunks: u64 = sorted.chunks(8).map(|c| 8 * c[c.len() - 1]).sum();
    let arrival: u64 = lengths.chunks(8).map(|c| 8 * c.iter().max().unwrap()).sum();
    assert!(chunks < arrival, "{chunks} vs {arrival} in arrival order");
    let own: u64 = lengths.iter().sum();
    // Counts reach the master with the worker's heartbeats.
    let (real, padded) = s.poll(
        &format!(
            "vramfork_text_tokens_total real = {} (each input twice)",
            2 * own
        ),
        || {
            let got = (text_tokens(mport, "real"), text_tokens(mport, "padded"));
            (got.0 == 2 * own).then_some(got)
        },
    );
    assert_eq!(real, 2 * own);
    let of_the_200 = padded - own;
    assert!(
        own <= of_the_200 && of_the_200 <= chunks,
        "the request of 200 padded to {of_the_200} tokens: its own {own}, sorted chunks of 8 {chunks}, arrival order {arrival}"
    );
}
