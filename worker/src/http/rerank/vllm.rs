//! vLLM's shapes: `POST /score` (`text_1` and `text_2`: one against one, one against many,
//! or many against as many, zipped) answers `{id, object, created, model, data: [{index,
//! object: "score", score}], usage}` in the request's order; `POST /v1/classify` (`input`:
//! a text or a list of texts) answers `{id, object, created, model, data: [{index, label,
//! probs, num_classes}], usage}`. `use_activation: false` gives the logits as the model
//! gives them. `priority` (lower is served earlier, 0 the default) picks the request's lane.
//! Errors in OpenAI's shape, as vLLM's.

use hyper::body::Incoming;
use hyper::Request;
use serde::Deserialize;
use serde_json::{json, Value};

use super::call::{self, admit, Row, Rows};
use super::declaration::Need;
use super::refusal::{Refusal, Shape};
use super::{classes, relevance};
use crate::app::App;
use crate::http::answer::Answer;
use crate::http::request::request_id_of;

#[derive(Deserialize)]
#[serde(untagged)]
enum Texts {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct Score {
    #[serde(default)]
    model: Option<String>,
    text_1: Texts,
    text_2: Texts,
    #[serde(default)]
    use_activation: Option<bool>,
    #[serde(default)]
    priority: Option<Value>,
}

#[derive(Deserialize)]
struct Classify {
    #[serde(default)]
    model: Option<String>,
    input: Texts,
    #[serde(default)]
    use_activation: Option<bool>,
    #[serde(default)]
    priority: Option<Value>,
}

pub async fn score(req: Request<Incoming>, app: &App) -> Answer {
    let id = request_id_of(&req);
    scored(req, app, id)
        .await
        .unwrap_or_else(|e| e.answer(Shape::OpenAi))
}

pub async fn classify(req: Request<Incoming>, app: &App) -> Answer {
    let id = request_id_of(&req);
    classified(req, app, id)
        .await
        .unwrap_or_else(|e| e.answer(Shape::OpenAi))
}

async fn scored(req: Request<Incoming>, app: &App, id: String) -> Result<Answer, Refusal> {
    let mut call = admit(req, app, Need::Rerank).await?;
    let asked: Score = call::parse(&call.body)?;
    call.prioritize(call::lane(asked.priority.as_ref())?);
    let rows = match (asked.text_1, asked.text_2) {
        (Texts::One(query), Texts::One(doc)) => Rows::Query {
            query,
            documents: vec![doc],
            doc_cap: None,
        },
        (Texts::One(query), Texts::Many(documents)) => Rows::Query {
            query,
            documents,
            doc_cap: None,
        },
        (Texts::Many(a), Texts::Many(b)) if a.len() == b.len() => {
            Rows::Each(a.into_iter().zip(b).map(|(a, b)| Row::Two(a, b)).collect())
        }
        (Texts::Many(a), Texts::Many(b)) => {
            return Err(Refusal::invalid(
                "text_2",
                format!(
                    "`text_1` holds {} texts and `text_2` {}; lists are scored pair by pair and must be as long",
                    a.len(),
                    b.len()
                ),
            ))
        }
        (Texts::Many(_), Texts::One(_)) => {
            return Err(Refusal::invalid(
                "text_1",
                "`text_1` is a list and `text_2` one text; score one `text_1` against many `text_2`, or lists of the same length",
            ))
        }
    };
    let decl = call.decl.clone();
    let scored = call.score(app, rows, "text_2", "text_1").await?;
    let raw = asked.use_activation == Some(false);
    let scores = relevance(&decl, &scored.logits, raw)?;
    let data: Vec<Value> = scores
        .iter()
        .enumerate()
        .map(|(index, s)| json!({"index": index, "object": "score", "score": s}))
        .collect();
    let n = scored.tokens;
    Ok(scored.answer(json!({
        "id": format!("score-{id}"),
        "object": "list",
        "created": created(),
        "model": asked.model.unwrap_or_else(|| app.model_name.clone()),
        "data": data,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    })))
}

async fn classified(req: Request<Incoming>, app: &App, id: String) -> Result<Answer, Refusal> {
    let mut call = admit(req, app, Need::Classify).await?;
    let asked: Classify = call::parse(&call.body)?;
    call.prioritize(call::lane(asked.priority.as_ref())?);
    let texts = match asked.input {
        Texts::One(t) => vec![t],
        Texts::Many(t) => t,
    };
    let rows = Rows::Each(texts.into_iter().map(Row::One).collect());
    let decl = call.decl.clone();
    let scored = call.score(app, rows, "input", "input").await?;
    let raw = asked.use_activation == Some(false);
    let data: Vec<Value> = classes(&decl, &scored.logits, raw)
        .into_iter()
        .enumerate()
        .map(|(index, probs)| {
            let best = (0..probs.len())
                .max_by(|&a, &b| probs[a].total_cmp(&probs[b]))
                .unwrap_or(0);
            json!({"index": index, "label": decl.label(best), "probs": probs, "num_classes": probs.len()})
        })
        .collect();
    let n = scored.tokens;
    Ok(scored.answer(json!({
        "id": format!("classify-{id}"),
        "object": "list",
        "created": created(),
        "model": asked.model.unwrap_or_else(|| app.model_name.clone()),
        "data": data,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    })))
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
