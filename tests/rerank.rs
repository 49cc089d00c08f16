//! Rerank, score and classify: the `cohere` SDK's `ClientV2` and `Client` (with `base_url`),
//! and plain HTTP in text-embeddings-inference's, Jina's and vLLM's shapes, against the real
//! `app` serving a BERT cross-encoder and a 3-label classifier made on the spot by
//! `tests/support/make_rerank.py` (random weights, traced; the cross-encoder also as a
//! torch.export program). Scores must equal, within 1e-5, those sentence-transformers'
//! `CrossEncoder(max_length=…)` predicts for the same weights and tokenizer, with its default
//! activation and raw; the long document cut as it cuts it; class probabilities the
//! classifier's softmax. Every refusal is in the API's own shape and names the field.

mod common;

use std::path::{Path, PathBuf};

use common::{made_once, python_json, App, Server};
use serde_json::{json, Value};

/// The artefacts of `tests/support/make_rerank.py` (made once per version).
fn artefacts() -> PathBuf {
    made_once("make_rerank.py", &["wordpiece.py"], "rerank")
}

fn expected(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap()
}

/// The metadata of `model` behind a text input (`max_length` as the fixture's, feeding
/// `token_type_ids`) with `extra` merged in.
fn metadata(model: &str, extra: Value) -> Value {
    let mut m = json!({
        "name": "cross", "model": model,
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                    "tokenizer": {"file": "tokenizer.json", "max_length": 40,
                                  "feeds": ["input_ids", "attention_mask", "token_type_ids"]}}],
    });
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    m
}

/// An app folder holding links to the artefacts and `metadata`.
fn app_with(metadata: &Value) -> App {
    let art = artefacts();
    let app = App {
        dir: tempfile::tempdir().unwrap(),
    };
    for f in std::fs::read_dir(&art).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, app.dir.path().join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(app.metadata(), serde_json::to_vec(metadata).unwrap()).unwrap();
    app
}

/// `app --production --workers 1 --torch-threads 1` serving `model` with `extra`; returns
/// once its worker is ready.
fn serve(model: &str, extra: Value) -> (Server, App, Value) {
    let app = app_with(&metadata(model, extra));
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--torch-threads", "1"],
    );
    s.wait_workers(1);
    (s, app, expected(&artefacts()))
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-5, "{what}: {got} != {want}");
}

/// The indices of `scores` best first.
fn best_first(scores: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order
}

/// Results `[{index, <key>}]` are `want`'s scores best first, the first `n` of them.
fn assert_ranked(results: &Value, key: &str, want: &[f64], n: usize, what: &str) {
    let results = results.as_array().unwrap();
    let order = best_first(want);
    assert_eq!(results.len(), n, "{what}: {results:?}");
    for (r, &i) in results.iter().zip(&order) {
        assert_eq!(r["index"], i, "{what}: order {results:?}");
        close(r[key].as_f64().unwrap(), want[i], what);
    }
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
fn the_cohere_sdks_v1_and_v2_clients_get_cross_encoder_scores() {
    let (s, _app, exp) = serve("cross.pt", json!({"max_batch_size": 2, "rerank": {}}));
    let want = floats(&exp["default"]);
    let port = s.port.to_string();
    let ask = json!({"query": exp["query"], "documents": exp["documents"], "top_n": null});
    let got = python_json("cohere_client.py", &[&port], ask.to_string().as_bytes());
    assert_ranked(&got["v2"], "relevance_score", &want, 5, "ClientV2");
    assert_ranked(&got["v1"], "relevance_score", &want, 5, "Client");
    for r in got["v1"].as_array().unwrap() {
        let i = r["index"].as_u64().unwrap() as usize;
        assert_eq!(r["text"], exp["documents"][i], "Client: return_documents");
    }
    assert_eq!(
        got["v2_tokens"].as_f64(),
        Some(tokens(&exp) as f64),
        "{got}"
    );
    let ask = json!({"query": exp["query"], "documents": exp["documents"], "top_n": 2});
    let got = python_json("cohere_client.py", &[&port], ask.to_string().as_bytes());
    assert_ranked(&got["v2"], "relevance_score", &want, 2, "ClientV2, top_n 2");
    assert_ranked(&got["v1"], "relevance_score", &want, 2, "Client, top_n 2");
}

#[test]
fn tei_jina_and_vllm_shapes_get_cross_encoder_scores_and_the_long_document_is_cut_as_it_cuts_it() {
    let (s, _app, exp) = serve("cross.pt", json!({"rerank": {}}));
    let (want, raw) = (floats(&exp["default"]), floats(&exp["raw"]));
    let docs = exp["documents"].clone();
    // TEI: a bare array, best first; raw_scores; return_text.
    let r = s.post(
        "/rerank",
        &json!({"query": exp["query"], "texts": docs, "return_text": true}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ranked(&r.json(), "score", &want, 5, "TEI");
    assert_eq!(r.json()[0]["text"], docs[best_first(&want)[0]]);
    // Only the long document was cut, exactly as CrossEncoder cuts it (its score says so).
    assert_eq!(r.header("x-truncated-inputs"), Some("1"));
    let r = s.post(
        "/rerank",
        &json!({"query": exp["query"], "texts": docs, "raw_scores": true}).to_string(),
    );
    assert_ranked(&r.json(), "score", &raw, 5, "TEI raw");
    assert!(r.json()[0].get("text").is_none(), "{}", r.body);
    // `/rerank` with `documents` (vLLM's and Jina's clients there) answers Jina's shape.
    let r = s.post(
        "/rerank",
        &json!({"query": exp["query"], "documents": docs, "top_n": 3}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ranked(
        &r.json()["results"],
        "relevance_score",
        &want,
        3,
        "Jina on /rerank",
    );
    // Jina: documents come back unless return_documents is false; top_n 0 and null = all.
    for top_n in [json!(0), json!(null)] {
        let r = s.post(
            "/v1/rerank",
            &json!({"model": "cross", "query": exp["query"], "documents": docs, "top_n": top_n})
                .to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let j = r.json();
        assert_ranked(&j["results"], "relevance_score", &want, 5, "Jina");
        let first = &j["results"][0];
        assert_eq!(
            first["document"]["text"],
            docs[first["index"].as_u64().unwrap() as usize]
        );
        assert_eq!(j["usage"]["total_tokens"], tokens(&exp));
    }
    let r = s.post(
        "/v1/rerank",
        &json!({"query": exp["query"], "documents": docs, "return_documents": false, "top_n": 1})
            .to_string(),
    );
    assert_ranked(
        &r.json()["results"],
        "relevance_score",
        &want,
        1,
        "Jina top 1",
    );
    assert!(r.json()["results"][0].get("document").is_none());
    // vLLM's /score: one against many, in the request's order; raw with use_activation false.
    let r = s.post(
        "/score",
        &json!({"model": "cross", "text_1": exp["query"], "text_2": docs}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let data = r.json()["data"].clone();
    for (i, w) in want.iter().enumerate() {
        assert_eq!(data[i]["index"], i);
        close(data[i]["score"].as_f64().unwrap(), *w, "vLLM score");
    }
    let queries: Vec<Value> = (0..5).map(|_| exp["query"].clone()).collect();
    let r = s.post(
        "/score",
        &json!({"text_1": queries, "text_2": docs, "use_activation": false}).to_string(),
    );
    for (i, w) in raw.iter().enumerate() {
        close(
            r.json()["data"][i]["score"].as_f64().unwrap(),
            *w,
            "vLLM raw, zipped",
        );
    }
    assert_eq!(r.json()["usage"]["prompt_tokens"], tokens(&exp));
}

#[test]
fn a_torch_export_program_of_the_cross_encoder_gets_the_same_scores() {
    let (s, _app, exp) = serve(
        "cross.pt2",
        json!({"max_batch_size": 4, "rerank": {"activation": "none"}}),
    );
    let r = s.post(
        "/v2/rerank",
        &json!({"model": "cross", "query": exp["query"], "documents": exp["documents"]})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ranked(
        &r.json()["results"],
        "relevance_score",
        &floats(&exp["raw"]),
        5,
        "program",
    );
}

#[test]
fn a_three_label_classifier_answers_its_softmax_on_classify_and_predict() {
    let (s, _app, exp) = serve(
        "classes.pt",
        json!({"classify": {"id2label": {"0": "negative", "1": "neutral", "2": "positive"}}}),
    );
    let labels = ["negative", "neutral", "positive"];
    let r = s.post(
        "/v1/classify",
        &json!({"model": "c", "input": exp["texts"]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    for (i, want) in exp["softmax"].as_array().unwrap().iter().enumerate() {
        let item = &r.json()["data"][i];
        let (got, want) = (floats(&item["probs"]), floats(want));
        for (g, w) in got.iter().zip(&want) {
            close(*g, *w, "classify");
        }
        assert_eq!(item["num_classes"], 3);
        assert_eq!(item["label"], labels[best_first(&want)[0]]);
    }
    // TEI's /predict: a text, a pair, a batch; every class, best first.
    let one = s.post("/predict", &json!({"inputs": exp["texts"][0]}).to_string());
    assert_eq!(one.status, 200, "{}", one.body);
    let want = floats(&exp["softmax"][0]);
    for (k, &i) in best_first(&want).iter().enumerate() {
        assert_eq!(one.json()[k]["label"], labels[i]);
        close(one.json()[k]["score"].as_f64().unwrap(), want[i], "predict");
    }
    let pair = s.post("/predict", &json!({"inputs": exp["pair"]}).to_string());
    let want = floats(&exp["pair_softmax"]);
    close(
        pair.json()[0]["score"].as_f64().unwrap(),
        want[best_first(&want)[0]],
        "predict pair",
    );
    let batch = s.post(
        "/predict",
        &json!({"inputs": [exp["texts"][1], exp["pair"]]}).to_string(),
    );
    assert_eq!(batch.status, 200, "{}", batch.body);
    assert_eq!(batch.json().as_array().unwrap().len(), 2, "{}", batch.body);
    let want = floats(&exp["softmax"][1]);
    close(
        batch.json()[0][0]["score"].as_f64().unwrap(),
        want[best_first(&want)[0]],
        "batch",
    );
    // This model declares no rerank: 404 naming the block.
    let r = s.post(
        "/v2/rerank",
        &json!({"query": "q", "documents": ["d"]}).to_string(),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("`rerank` block"),
        "{}",
        r.body
    );
}

#[test]
fn refusals_name_the_field_in_each_apis_shape_and_the_worker_serves_on() {
    let (s, _app, exp) = serve("cross.pt", json!({"rerank": {"max_documents": 3}}));
    let long_query = "a query that goes on and on ".repeat(12);
    // The query is never cut: a 400 naming it, in each API's shape.
    let r = s.post(
        "/v2/rerank",
        &json!({"query": long_query, "documents": ["d"]}).to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("`query` has"),
        "{}",
        r.body
    );
    let r = s.post(
        "/rerank",
        &json!({"query": long_query, "texts": ["d"]}).to_string(),
    );
    assert_eq!(
        (r.status, r.json()["error_type"].as_str()),
        (400, Some("Validation")),
        "{}",
        r.body
    );
    let r = s.post(
        "/score",
        &json!({"text_1": long_query, "text_2": ["d"]}).to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`text_1` has"),
        "{}",
        r.body
    );
    // More documents than the cap: a 413 naming it.
    let four = json!({"query": "q", "documents": ["a", "b", "c", "d"]}).to_string();
    let r = s.post("/v1/rerank", &four);
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 3"),
        "{}",
        r.body
    );
    let r = s.post(
        "/v1/rerank",
        &json!({"query": "q", "documents": ["a"], "top_n": -1}).to_string(),
    );
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("top_n")),
        "{}",
        r.body
    );
    let r = s.post("/v2/rerank", "{not json");
    assert_eq!(r.status, 400, "{}", r.body);
    // This model does not classify.
    let r = s.post("/predict", &json!({"inputs": "x"}).to_string());
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("`classify` block"),
        "{}",
        r.body
    );
    // And it serves on.
    let r = s.post(
        "/v2/rerank",
        &json!({"query": exp["query"], "documents": ["GPU"]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    close(
        r.json()["results"][0]["relevance_score"].as_f64().unwrap(),
        floats(&exp["default"])[2],
        "after",
    );
}

#[test]
fn a_bad_rerank_or_classify_block_stops_the_start_naming_the_field() {
    for (extra, want) in [
        (
            json!({"rerank": {"activation": "tanh"}}),
            "field `rerank.activation` is \"tanh\"",
        ),
        (
            json!({"rerank": {"truncation": "only_first"}}),
            "field `rerank.truncation`",
        ),
        (
            json!({"rerank": {"max_document": 5}}),
            "`rerank.max_document` is so close to `rerank.max_documents`",
        ),
        (
            json!({"classify": {"id2label": {"0": "a", "2": "b"}}}),
            "field `classify.id2label` has the index 2",
        ),
        (json!({"rerenk": {}}), "`rerank`"),
    ] {
        let app = app_with(&metadata("cross.pt", extra.clone()));
        let mut s = Server::spawn(&app, &["--production", "--workers", "1"], &[]);
        let status = s.wait_exit(std::time::Duration::from_secs(60));
        assert_eq!(
            status.code(),
            Some(vramfork::master::exit::CONFIG),
            "{extra}: {}",
            s.log_text()
        );
        assert!(
            s.log_text().contains(want),
            "{want:?} not in\n{}",
            s.log_text()
        );
    }
}

/// tritonclient's `class_count` over v2 REST (binary and JSON data) and gRPC: each text's two
/// best classes, best first, with the classifier's softmax and `id2label`'s names.
#[test]
fn tritonclients_class_count_gets_the_classifiers_softmax_over_rest_and_grpc() {
    let (s, _app, exp) = serve(
        "classes.pt",
        json!({"classify": {"id2label": ["negative", "neutral", "positive"]}}),
    );
    let labels = ["negative", "neutral", "positive"];
    let port = s.port.to_string();
    let got = python_json(
        "triton_classes.py",
        &[&port, "cross", "2"],
        json!({"texts": exp["texts"]}).to_string().as_bytes(),
    );
    for how in ["http", "http_json", "grpc"] {
        for (i, want) in exp["softmax"].as_array().unwrap().iter().enumerate() {
            let want = floats(want);
            let row = got[how][i].as_array().unwrap();
            assert_eq!(row.len(), 2, "{how}: {got}");
            for (item, &c) in row.iter().zip(&best_first(&want)) {
                assert_eq!(item[1], c, "{how}: text {i}: {got}");
                assert_eq!(item[2], labels[c], "{how}: text {i}");
                close(item[0].as_f64().unwrap(), want[c], how);
            }
        }
    }
}

/// `longest_first` cuts the longer of the two, as `truncation=True` does: the scores are
/// still CrossEncoder's (a short query, so only the long document is cut), and a query
/// longer than `max_length` is cut rather than refused. `max_tokens_per_doc` cuts documents.
#[test]
fn longest_first_cuts_as_truncation_true_and_max_tokens_per_doc_cuts_documents() {
    let (s, _app, exp) = serve(
        "cross.pt",
        json!({"rerank": {"truncation": "longest_first"}}),
    );
    let r = s.post(
        "/v2/rerank",
        &json!({"query": exp["query"], "documents": exp["documents"]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ranked(
        &r.json()["results"],
        "relevance_score",
        &floats(&exp["default"]),
        5,
        "longest_first",
    );
    assert_eq!(r.header("x-truncated-inputs"), Some("1"));
    let long_query = "a query that goes on and on ".repeat(12);
    let r = s.post(
        "/v2/rerank",
        &json!({"query": long_query, "documents": ["GPU"]}).to_string(),
    );
    assert_eq!(
        (r.status, r.header("x-truncated-inputs")),
        (200, Some("1")),
        "{}",
        r.body
    );
    assert_eq!(r.json()["usage"]["total_tokens"], 40, "{}", r.body);
    let r = s.post(
        "/v2/rerank",
        &json!({"query": exp["query"], "documents": exp["documents"], "max_tokens_per_doc": 2})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let cut: usize = r.header("x-truncated-inputs").unwrap().parse().unwrap();
    assert!(cut >= 4, "{cut}");
    assert!(
        r.json()["usage"]["total_tokens"].as_u64().unwrap() < tokens(&exp),
        "{}",
        r.body
    );
}

/// Token auth's 401 comes in each API's shape too, so the SDKs read it as their own.
#[test]
fn token_auth_refuses_in_each_apis_shape() {
    let app = app_with(&metadata("cross.pt", json!({"rerank": {}})));
    let keys = app.dir.path().join("keys");
    std::fs::write(&keys, "a-key-of-sixteen-chars-at-least\n").unwrap();
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--api-key-file",
            keys.to_str().unwrap(),
        ],
    );
    s.wait_workers(1);
    let body = json!({"query": "q", "documents": ["d"], "texts": ["d"]}).to_string();
    let r = s.post("/v2/rerank", &body);
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.json()["message"].is_string(), "{}", r.body);
    let r = s.post("/rerank", &body);
    assert_eq!(
        (r.status, r.json()["error_type"].as_str()),
        (401, Some("Backend")),
        "{}",
        r.body
    );
    let r = s.post("/score", &body);
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(
        r.json()["error"]["type"],
        "authentication_error",
        "{}",
        r.body
    );
    assert!(r.header("www-authenticate").is_some());
}

#[test]
fn rerank_answers_are_counted_under_their_own_endpoint() {
    let app = app_with(&metadata("cross.pt", json!({"rerank": {}})));
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--metrics-port", "0"],
    );
    s.wait_workers(1);
    let mport = s.metrics_port();
    let exp = expected(&artefacts());
    for path in ["/v2/rerank", "/rerank", "/score"] {
        let body = match path {
            "/score" => json!({"text_1": exp["query"], "text_2": exp["documents"]}),
            _ => json!({"query": exp["query"], "documents": exp["documents"]}),
        };
        let r = s.post(path, &body.to_string());
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    // Counts reach the master with the worker's heartbeats.
    s.poll("3 answers counted under endpoint=\"rerank\"", || {
        let m = common::http(mport, "GET", "/metrics", None).body;
        m.lines()
            .any(|l| {
                l.starts_with("vramfork_requests_total{")
                    && l.contains("endpoint=\"rerank\"")
                    && l.contains("code=\"200\"")
                    && l.ends_with(" 3")
            })
            .then_some(())
    });
}
