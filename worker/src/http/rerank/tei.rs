//! text-embeddings-inference's shapes: `POST /rerank` with `query` and `texts` answers TEI's
//! bare array `[{index, score, text?}]`, best first (`raw_scores`: the logit as the model
//! gives it; `return_text`); with `documents` instead of `texts` it answers Jina's shape,
//! as `/v1/rerank` does. `POST /predict` takes `inputs`: a text, a pair of texts, or a
//! batch of them, and answers `[{score, label}]` (every class, best first) per input, a
//! list of such lists for a batch. TEI's `truncate` (and any other field) is accepted and
//! unused, `truncation_direction` is `right` or refused: the `rerank` block's truncation
//! decides.

use hyper::body::Incoming;
use hyper::Request;
use serde::Deserialize;
use serde_json::{json, Value};

use super::call::{self, admit, Row, Rows};
use super::cohere::{self, Version};
use super::declaration::Need;
use super::refusal::{Refusal, Shape};
use super::{by_score, classes, relevance};
use crate::app::App;
use crate::http::answer::Answer;
use crate::http::request::request_id_of;

#[derive(Deserialize)]
struct Asked {
    query: String,
    texts: Vec<String>,
    #[serde(default)]
    raw_scores: bool,
    #[serde(default)]
    return_text: bool,
    #[serde(default)]
    truncation_direction: Option<String>,
}

/// `POST /rerank`: TEI's request (`texts`), or Jina's (`documents`).
pub async fn rerank(req: Request<Incoming>, app: &App) -> Answer {
    let id = request_id_of(&req);
    tei_rerank(req, app, id)
        .await
        .unwrap_or_else(|e| e.answer(Shape::Tei))
}

async fn tei_rerank(req: Request<Incoming>, app: &App, id: String) -> Result<Answer, Refusal> {
    let call = admit(req, app, Need::Rerank).await?;
    let probe: Value = call::parse(&call.body)?;
    if probe.get("texts").is_none() && probe.get("documents").is_some() {
        return cohere::ranked(call, app, Version::V1, id).await;
    }
    let asked: Asked = call::parse(&call.body)?;
    direction(asked.truncation_direction.as_deref())?;
    let decl = call.decl.clone();
    let rows = Rows::Query {
        query: asked.query,
        documents: asked.texts.clone(),
        doc_cap: None,
    };
    let scored = call.score(app, rows, "texts", "query").await?;
    let scores = relevance(&decl, &scored.logits, asked.raw_scores)?;
    let items: Vec<Value> = by_score(&scores, None)
        .into_iter()
        .map(|i| {
            let mut r = json!({"index": i, "score": scores[i]});
            if asked.return_text {
                r["text"] = json!(asked.texts[i]);
            }
            r
        })
        .collect();
    Ok(scored.answer(Value::Array(items)))
}

fn direction(given: Option<&str>) -> Result<(), Refusal> {
    match given {
        None => Ok(()),
        Some(d) if d.eq_ignore_ascii_case("right") => Ok(()),
        Some(d) => Err(Refusal::invalid(
            "truncation_direction",
            format!("`truncation_direction` is \"{d}\"; this server cuts the end of a document (\"right\")"),
        )),
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Sequence {
    One(String),
    Two([String; 2]),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Inputs {
    Single(Sequence),
    Batch(Vec<Sequence>),
}

#[derive(Deserialize)]
struct Predict {
    inputs: Inputs,
    #[serde(default)]
    raw_scores: bool,
    #[serde(default)]
    truncation_direction: Option<String>,
}

/// `POST /predict`.
pub async fn predict(req: Request<Incoming>, app: &App) -> Answer {
    tei_predict(req, app)
        .await
        .unwrap_or_else(|e| e.answer(Shape::Tei))
}

async fn tei_predict(req: Request<Incoming>, app: &App) -> Result<Answer, Refusal> {
    let call = admit(req, app, Need::Classify).await?;
    let asked: Predict = call::parse(&call.body)?;
    direction(asked.truncation_direction.as_deref())?;
    let (batch, seqs) = match asked.inputs {
        Inputs::Single(s) => (false, vec![s]),
        Inputs::Batch(b) => (true, b),
    };
    let rows = seqs
        .into_iter()
        .map(|s| match s {
            Sequence::One(t) => Row::One(t),
            Sequence::Two([a, b]) => Row::Two(a, b),
        })
        .collect();
    let decl = call.decl.clone();
    let scored = call
        .score(app, Rows::Each(rows), "inputs", "inputs")
        .await?;
    let each: Vec<Value> = classes(&decl, &scored.logits, asked.raw_scores)
        .into_iter()
        .map(|probs| {
            let mut by: Vec<usize> = (0..probs.len()).collect();
            by.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
            by.into_iter()
                .map(|i| json!({"score": probs[i], "label": decl.label(i)}))
                .collect()
        })
        .collect();
    let mut each = each;
    let body = match batch {
        true => Value::Array(each),
        false => each.pop().unwrap_or_else(|| json!([])),
    };
    Ok(scored.answer(body))
}
