//! Cross-encoders and classifiers behind the APIs their clients already speak, each door a
//! thin translation over one call through the core (`call.rs`): Cohere's `/v2/rerank` and
//! `/v1/rerank` (Jina's shape too, `cohere.rs`), text-embeddings-inference's `/rerank` and
//! `/predict` (`tei.rs`), vLLM's `/score` and `/v1/classify` (`vllm.rs`). What the model
//! declares (`rerank`, `classify` blocks) is read by `declaration.rs`; refusals take each
//! API's own shape (`refusal.rs`). Scores are the activation of the declared logit (sigmoid
//! of one logit by default, as sentence-transformers' `CrossEncoder`); classes the softmax of
//! the row by default.

pub mod call;
pub mod cohere;
pub mod declaration;
pub mod refusal;
pub mod tei;
pub mod vllm;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;

use self::declaration::Declaration;
use self::refusal::{Refusal, Shape};
use crate::app::App;
use crate::http::answer::Answer;

/// The paths these doors answer.
pub fn owns(path: &str) -> bool {
    matches!(
        path,
        "/v2/rerank" | "/v1/rerank" | "/rerank" | "/predict" | "/score" | "/v1/classify"
    )
}

/// The shape of the API a path speaks.
fn shape(path: &str) -> Shape {
    match path {
        "/v2/rerank" => Shape::Cohere,
        "/score" | "/v1/rerank" | "/v1/classify" => Shape::OpenAi,
        _ => Shape::Tei,
    }
}

/// A refusal of the server's own (token auth) for one of these paths, in its API's shape.
pub fn refusal(path: &str, e: crate::error::ApiError) -> Answer {
    Refusal::from(e).answer(shape(path))
}

pub async fn route(req: Request<Incoming>, app: &App) -> Answer {
    let path = req.uri().path().to_string();
    let shape = shape(&path);
    if req.method() != Method::POST {
        let e = crate::error::ApiError::not_allowed(req.method(), &path, "POST");
        return Refusal::from(e).answer(shape);
    }
    match path.as_str() {
        "/v2/rerank" => cohere::rerank(req, app, cohere::Version::V2).await,
        "/v1/rerank" => cohere::rerank(req, app, cohere::Version::V1).await,
        "/rerank" => tei::rerank(req, app).await,
        "/predict" => tei::predict(req, app).await,
        "/score" => vllm::score(req, app).await,
        "/v1/classify" => vllm::classify(req, app).await,
        _ => Refusal::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route for {path}"),
        )
        .answer(shape),
    }
}

/// A document: a string, or an object with `text` (Cohere's and Jina's).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    pub fn text(self) -> String {
        match self {
            Document::Text(t) | Document::Object { text: t } => t,
        }
    }
}

/// Each row's relevance: the declared logit after the activation (`raw`: none).
pub fn relevance(decl: &Declaration, logits: &[Vec<f32>], raw: bool) -> Result<Vec<f32>, Refusal> {
    let at = decl.logit.unwrap_or(0);
    logits
        .iter()
        .map(|row| {
            let act = if raw {
                vramfork::metadata::rerank::Activation::None
            } else {
                decl.activation(row.len())
            };
            act.apply(row).get(at).copied().ok_or_else(|| {
                Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "output_error",
                    format!(
                        "the model gives {} logits a pair; `rerank.logit` is {at}",
                        row.len()
                    ),
                )
            })
        })
        .collect()
}

/// Each row's class scores: the activation of the row (`raw`: the logits).
pub fn classes(decl: &Declaration, logits: &[Vec<f32>], raw: bool) -> Vec<Vec<f32>> {
    logits
        .iter()
        .map(|row| match raw {
            true => row.clone(),
            false => decl.activation(row.len()).apply(row),
        })
        .collect()
}

/// The rows' indices best first (ties in the request's order), the first `top_n` of them.
pub fn by_score(scores: &[f32], top_n: Option<usize>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(top_n.unwrap_or(usize::MAX));
    order
}
