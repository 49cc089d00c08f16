//! The token budget of a text pass (`max_batch_tokens`: rows × padded length): every door's
//! passes stay within it, the answers are those of one pass, the warm-up runs its worst shape
//! (so the footprint measured at start bounds a burst of the longest documents), a budget
//! the warm-up cannot run is refused at start, and the default one is lowered to what ran.
//! Models are made on the spot (tests/support/make_long_encoder.py): a BERT encoder whose
//! attention grows with rows × tokens², and an encoder that runs out of GPU memory past 128
//! tokens a pass, as a model on a small GPU does.

mod common;

use std::path::PathBuf;

use common::*;
use serde_json::{json, Value};

fn artefacts() -> PathBuf {
    made_once("make_long_encoder.py", &["wordpiece.py"], "long-encoder")
}

/// The README's words, to make documents from.
fn words() -> Vec<String> {
    let exp: Value =
        serde_json::from_slice(&std::fs::read(artefacts().join("expected.json")).unwrap()).unwrap();
    exp["words"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect()
}

/// `n` documents of 1 to `most` words (lengths jumping about), from the README's words.
fn documents(n: usize, most: usize) -> Vec<String> {
    let words = words();
    (0..n)
        .map(|i| {
            let len = 1 + (i * 7919 % most);
            (0..len)
                .map(|k| words[(i * 31 + k) % words.len()].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The app of `model` behind a text input of `max_length` tokens (truncation on, at most
/// `max_documents` a request) with mean-pooled vectors, `extra` merged into the metadata.
fn app(model: &str, max_length: usize, max_documents: usize, extra: Value) -> App {
    let art = artefacts();
    let app = App {
        dir: tempfile::tempdir().unwrap(),
    };
    for f in std::fs::read_dir(&art).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, app.dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let mut metadata = json!({
        "name": "encoder",
        "model": model,
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                    "tokenizer": {"file": "tokenizer.json", "max_length": max_length,
                                  "truncation": true, "max_documents": max_documents}}],
        "embeddings": {"pooling": "mean"},
    });
    for (k, v) in extra.as_object().unwrap() {
        metadata[k] = v.clone();
    }
    std::fs::write(app.metadata(), serde_json::to_vec(&metadata).unwrap()).unwrap();
    app
}

fn serve(app: &App, args: &[&str]) -> Server {
    let mut all = vec![
        "--production",
        "--workers",
        "1",
        "--torch-threads",
        "1",
        "--metrics-port",
        "0",
    ];
    all.extend_from_slice(args);
    let s = Server::start(app, &all);
    s.wait_workers(1);
    s
}

/// A gauge's value in the master's /metrics (`None`: absent).
fn gauge(s: &Server, line_start: &str) -> Option<f64> {
    let r = http(s.metrics_port(), "GET", "/metrics", None);
    assert_eq!(r.status, 200, "{r:?}");
    r.body
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The most tokens one text pass held, once the worker's heartbeat has brought it at least
/// `least` (the passes ran).
fn largest_pass(s: &Server, least: f64) -> f64 {
    s.poll("vramfork_text_pass_tokens_max reported", || {
        gauge(s, "vramfork_text_pass_tokens_max ").filter(|&v| v >= least)
    })
}

fn embed(s: &Server, input: Value) -> Value {
    let r = s.post(
        "/v1/embeddings",
        &json!({"input": input, "model": "encoder"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn close(got: &Value, want: &Value, what: &str) {
    let (got, want) = (got.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(got.len(), want.len(), "{what}");
    for (j, (a, b)) in got.iter().zip(want).enumerate() {
        match (a.as_f64(), b.as_f64()) {
            (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-4, "{what}[{j}]: {a} != {b}"),
            _ => close(a, b, &format!("{what}[{j}]")),
        }
    }
}

#[test]
fn every_doors_passes_stay_within_the_budget_and_answer_as_one_pass() {
    // 40 tokens a pass: 200 documents of up to 60 words (cut at 32 tokens) in one request.
    let app = app(
        "long.pt",
        32,
        256,
        json!({"max_batch_tokens": 40, "embeddings": {"pooling": "mean", "normalize": true}}),
    );
    let s = serve(&app, &[]);
    let docs = documents(200, 60);
    let all = embed(&s, json!(docs));
    let mut lengths = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        let one = embed(&s, json!(d));
        lengths.push(one["usage"]["prompt_tokens"].as_u64().unwrap() as usize);
        close(
            &all["data"][i]["embedding"],
            &one["data"][0]["embedding"],
            &format!("/v1/embeddings: input {i} of 200 against it alone"),
        );
    }
    // Documents of 32 tokens are over a budget of 40 two at a time: they run alone, and
    // no pass held more than 40 tokens otherwise.
    let largest = largest_pass(&s, 1.0);
    assert!(largest <= 40.0, "a pass held {largest} tokens (budget 40)");
    // Every input's tokens were given twice (in the request of 200, and alone).
    let embedded = 2 * lengths.iter().sum::<usize>();
    let (_, padded) = tokens_given(&s, embedded);
    // POST /: 30 documents at once (30 × 32 tokens, over the budget): run in parts of one
    // row each at the request's padded length, the per-token states of each document equal
    // to its own pass's (a BERT with an attention mask: padding changes no real token's).
    let some: Vec<&String> = docs.iter().take(30).collect();
    let r = s.post("/", &json!({"inputs": some}).to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let states = r.json()["outputs"].clone();
    assert_eq!(states.as_array().unwrap().len(), 30, "rows");
    for (i, d) in some.iter().enumerate() {
        let one = s.post("/", &json!({"inputs": [d]}).to_string());
        assert_eq!(one.status, 200, "{}", one.body);
        let n = lengths[i];
        let cut = |v: &Value| json!(v.as_array().unwrap()[..n].to_vec());
        close(
            &cut(&states[i]),
            &cut(&one.json()["outputs"][0]),
            &format!("POST /: document {i} of 30 against it alone"),
        );
    }
    let largest = largest_pass(&s, 1.0);
    assert!(largest <= 40.0, "a pass held {largest} tokens (budget 40)");
    // POST /'s passes are counted too, as they ran: the 30 in parts at the request's
    // padded length, each document alone at its own.
    let own: usize = lengths[..30].iter().sum();
    let width = *lengths[..30].iter().max().unwrap();
    let (_, padded_after) = tokens_given(&s, embedded + 2 * own);
    assert_eq!(
        padded_after - padded,
        (30 * width + own) as f64,
        "POST /'s padded tokens"
    );
}

/// `vramfork_text_tokens_total` once its real tokens are `real`: (real, padded).
fn tokens_given(s: &Server, real: usize) -> (f64, f64) {
    let kind = |k: &str| gauge(s, &format!("vramfork_text_tokens_total{{kind=\"{k}\"}}"));
    s.poll(&format!("vramfork_text_tokens_total real = {real}"), || {
        let got = (kind("real")?, kind("padded")?);
        (got.0 == real as f64).then_some(got)
    })
}

#[test]
fn a_burst_of_the_longest_documents_stays_within_the_footprint_the_warm_up_measured() {
    // 4,096 tokens a pass: 16 documents of 256 tokens. The warm-up runs that (its attention
    // scores about 8 MB a document, twice); a request of 64 such documents runs in passes
    // of 16, so serving never takes the worker's resident set further than the template's
    // warm-up took its own (what the host-memory plan counts per worker).
    let app = app("long.pt", 256, 64, json!({"max_batch_tokens": 4096}));
    let s = serve(&app, &[]);
    let warmup = s.poll("the template's warm-up peak in /metrics", || {
        gauge(&s, "vramfork_worker_pass_peak_bytes{source=\"warmup\"}")
    });
    let words = words();
    let long: Vec<String> = (0..64)
        .map(|i| {
            (0..400)
                .map(|k| words[(i * 37 + k) % words.len()].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    for _ in 0..3 {
        let e = embed(&s, json!(long));
        assert_eq!(e["data"].as_array().unwrap().len(), 64);
        assert!(
            e["usage"]["prompt_tokens"].as_u64().unwrap() == 64 * 256,
            "documents cut at max_length: {}",
            e["usage"]
        );
    }
    let largest = largest_pass(&s, 4096.0);
    assert_eq!(largest, 4096.0, "passes of 16 documents of 256 tokens");
    let observed = s.poll("a worker's pass peak in /metrics", || {
        gauge(&s, "vramfork_worker_pass_peak_bytes{source=\"observed\"}")
    });
    let mb = |b: f64| b / 1048576.0;
    assert!(
        mb(warmup) >= 40.0,
        "the warm-up ran the budget's worst shape: its peak {:.1} MB",
        mb(warmup)
    );
    assert!(
        observed <= warmup * 1.25 + 24.0 * 1048576.0,
        "serving took the resident set {:.1} MB up, past the {:.1} MB the warm-up measured",
        mb(observed),
        mb(warmup)
    );
}

#[test]
fn a_budget_the_warm_up_cannot_run_is_refused_and_the_default_is_lowered_to_what_ran() {
    // picky.pt runs out of GPU memory past 128 tokens a pass. 16 documents of 32 tokens:
    // 512 tokens given is refused at start, naming the field…
    let given = app("picky.pt", 32, 16, json!({"max_batch_tokens": 512}));
    let mut s = Server::start(&given, &["--production", "--workers", "1"]);
    let status = s.wait_exit(std::time::Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{}", s.log_text());
    let log = s.log_text();
    assert!(
        log.contains("max_batch_tokens = 512") && log.contains("16 documents of 32 tokens"),
        "{log}"
    );
    // …while the default (16 × 32) is halved until its pass runs: 4 documents, 128 tokens.
    let default = app("picky.pt", 32, 16, json!({}));
    let s = serve(&default, &[]);
    let docs: Vec<String> = documents(16, 200).into_iter().map(|d| d + " end").collect();
    let e = embed(&s, json!(docs));
    assert_eq!(e["data"].as_array().unwrap().len(), 16);
    let r = s.post("/", &json!({"inputs": docs}).to_string());
    assert_eq!(r.status, 200, "POST / in parts: {}", r.body);
    assert_eq!(r.json()["outputs"].as_array().unwrap().len(), 16);
    let largest = largest_pass(&s, 1.0);
    assert!(largest <= 128.0, "a pass held {largest} tokens");
    assert!(
        s.log_text()
            .contains("this worker's passes hold 128 tokens"),
        "{}",
        s.log_text()
    );
}

#[test]
fn batched_requests_share_a_pass_only_within_the_budget_each_answer_its_own() {
    // Eight rows a batch, 64 tokens a pass: concurrent one-document requests of 1 to 20
    // words (3 to 22 tokens) meet in batches of two or three, none past the budget once
    // padded together (eight of them would pad to 176).
    let app = app(
        "long.pt",
        32,
        64,
        json!({"max_batch_size": 8, "max_batch_tokens": 64}),
    );
    let s = serve(&app, &["--batch-timeout-ms", "20"]);
    let docs = documents(48, 20);
    let (mut alone, mut own) = (Vec::new(), 0);
    for d in &docs {
        let e = embed(&s, json!(d));
        alone.push(e["data"][0]["embedding"].clone());
        own += e["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    }
    let port = s.port;
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (docs, alone) = (&docs, &alone);
            scope.spawn(move || {
                for (i, d) in docs.iter().enumerate().skip(t).step_by(8) {
                    let body = json!({"input": d, "model": "encoder"}).to_string();
                    let r = http(port, "POST", "/v1/embeddings", Some(&body));
                    assert_eq!(r.status, 200, "{}", r.body);
                    let got: Value = serde_json::from_str(&r.body).unwrap();
                    close(
                        &got["data"][0]["embedding"],
                        &alone[i],
                        &format!("document {i} batched, against it alone"),
                    );
                }
            });
        }
    });
    s.poll("the 96 answers counted in /metrics", || {
        gauge(
            &s,
            "vramfork_requests_total{endpoint=\"embeddings\",code=\"200\"}",
        )
        .filter(|&n| n >= 96.0)
    });
    let largest = largest_pass(&s, 1.0);
    assert!(
        largest <= 64.0,
        "a batched pass held {largest} tokens (budget 64)"
    );
    let r = http(s.metrics_port(), "GET", "/metrics", None);
    let batched: f64 = r
        .body
        .lines()
        .filter(|l| l.starts_with("vramfork_batches_total{") && !l.contains("size=\"1\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(batched > 0.0, "requests met in batches: {}", r.body);
    // Each document's tokens were given twice; alone it has no padding, and the batches
    // are counted as they ran, padded to their longest document.
    let (real, padded) = tokens_given(&s, 2 * own);
    assert!(
        padded > real,
        "the batched passes' padding is counted: {padded} padded tokens for {real}"
    );
}
