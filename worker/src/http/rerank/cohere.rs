//! Cohere's rerank: `POST /v2/rerank` (the `cohere` SDK's `ClientV2`) and `POST /v1/rerank`
//! (its `Client`, and Jina's shape as vLLM and others serve it). `documents` are strings or
//! objects with `text`; `top_n` absent, null or 0 means every document; results come best
//! first with their `index` and `relevance_score`, and `document.text` when
//! `return_documents` is true (the default on `/v1/rerank`, as at Jina; not on
//! `/v2/rerank`, as at Cohere). `max_tokens_per_doc` cuts each document to that many tokens.
//! `usage` and Cohere's `meta.tokens` carry the tokens given to the model. vLLM's
//! `priority` (lower is served earlier, 0 the default) picks the request's lane.

use hyper::body::Incoming;
use hyper::Request;
use serde::Deserialize;
use serde_json::{json, Value};

use super::call::{self, admit, Call, Rows};
use super::declaration::Need;
use super::refusal::{Refusal, Shape};
use super::{by_score, relevance, Document};
use crate::app::App;
use crate::http::answer::Answer;
use crate::http::request::request_id_of;

#[derive(Deserialize)]
struct Asked {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<Document>,
    #[serde(default)]
    top_n: Option<i64>,
    #[serde(default)]
    return_documents: Option<bool>,
    #[serde(default)]
    max_tokens_per_doc: Option<i64>,
    /// vLLM's (its `/rerank` takes this shape): lower is served earlier, 0 the default.
    #[serde(default)]
    priority: Option<Value>,
}

/// Which version of the API, and so which defaults and shape.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

pub async fn rerank(req: Request<Incoming>, app: &App, version: Version) -> Answer {
    let shape = match version {
        Version::V1 => Shape::OpenAi,
        Version::V2 => Shape::Cohere,
    };
    let id = request_id_of(&req);
    answer(req, app, version, id)
        .await
        .unwrap_or_else(|e| e.answer(shape))
}

async fn answer(
    req: Request<Incoming>,
    app: &App,
    version: Version,
    id: String,
) -> Result<Answer, Refusal> {
    let call = admit(req, app, Need::Rerank).await?;
    ranked(call, app, version, id).await
}

/// An admitted request read as Cohere's (or Jina's) and answered.
pub async fn ranked(
    mut call: Call<'_>,
    app: &App,
    version: Version,
    id: String,
) -> Result<Answer, Refusal> {
    let asked: Asked = call::parse(&call.body)?;
    call.prioritize(call::lane(asked.priority.as_ref())?);
    let top_n = top_n(asked.top_n)?;
    let doc_cap = match asked.max_tokens_per_doc {
        None => None,
        Some(n) if n >= 1 => Some(n as usize),
        Some(n) => {
            return Err(Refusal::invalid(
                "max_tokens_per_doc",
                format!("`max_tokens_per_doc` is {n}; it takes 1 or more"),
            ))
        }
    };
    let documents: Vec<String> = asked.documents.into_iter().map(Document::text).collect();
    let decl = call.decl.clone();
    let rows = Rows::Query {
        query: asked.query,
        documents: documents.clone(),
        doc_cap,
    };
    let scored = call.score(app, rows, "documents", "query").await?;
    let scores = relevance(&decl, &scored.logits, false)?;
    let with_text = asked.return_documents.unwrap_or(version == Version::V1);
    let results: Vec<Value> = by_score(&scores, top_n)
        .into_iter()
        .map(|i| {
            let mut r = json!({"index": i, "relevance_score": scores[i]});
            if with_text {
                r["document"] = json!({"text": documents[i]});
            }
            r
        })
        .collect();
    let n = scored.tokens;
    let body = json!({
        "id": id,
        "model": asked.model.unwrap_or_else(|| app.model_name.clone()),
        "results": results,
        "usage": {"prompt_tokens": n, "total_tokens": n},
        "meta": {
            "api_version": {"version": if version == Version::V1 { "1" } else { "2" }},
            "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": n, "output_tokens": 0},
        },
    });
    Ok(scored.answer(body))
}

/// `top_n`: absent, null or 0 = all; negative is refused.
pub fn top_n(given: Option<i64>) -> Result<Option<usize>, Refusal> {
    match given {
        None | Some(0) => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as usize)),
        Some(n) => Err(Refusal::invalid(
            "top_n",
            format!("`top_n` is {n}; it takes 1 or more (0, null or no `top_n`: every document)"),
        )),
    }
}
