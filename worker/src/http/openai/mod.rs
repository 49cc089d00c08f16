//! OpenAI's embeddings API, so that OpenAI's SDKs and LangChain's
//! `OpenAIEmbeddings` work against a text model unchanged: `POST /v1/embeddings`
//! (`embed.rs`: the request read by `request.rs` in one streaming pass, `walk.rs`, tokenized by `tokens.rs`, pooled by
//! `vectors.rs`, as the model's `embeddings` block declares, `declaration.rs`), `GET
//! /v1/models` and `GET /v1/models/{id}` (here; their answers are KServe v1's too, whose
//! predict is `kserve/`'s). Every answer under `/v1/`, refusals
//! included, is in OpenAI's shape (`error.rs`).

pub mod declaration;
pub mod embed;
pub mod error;
pub mod request;
pub mod tokens;
pub mod vectors;
mod walk;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{json, Value};

use self::error::OaiError;
use crate::app::App;
use crate::error::ApiError;
use crate::http::answer::Answer;

/// Whether `path` is under `/v1/`.
pub fn owns(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/")
}

/// A refusal of the server's own (token auth) for a path under `/v1/`, in OpenAI's shape.
pub fn refusal(e: ApiError) -> Answer {
    OaiError::from(e).answer()
}

pub async fn route(req: Request<Incoming>, app: &App) -> Answer {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let model = path.strip_prefix("/v1/models/");
    let done = match (path.as_str(), &method, model) {
        ("/v1/embeddings", &Method::POST, _) => embed::embeddings(req, app).await,
        ("/v1/embeddings", _, _) => Err(ApiError::not_allowed(&method, &path, "POST").into()),
        // OpenAI's list, with KServe v1's `models` beside it: one answer both clients read.
        ("/v1/models", &Method::GET, _) => Ok(Answer::ok(
            json!({"object": "list", "data": [model_object(app)], "models": [app.model_name]}),
        )),
        (_, &Method::GET, Some(id)) => one_model(id, app),
        ("/v1/models", _, _) | (_, _, Some(_)) => {
            Err(ApiError::not_allowed(&method, &path, "GET").into())
        }
        _ => Err(OaiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route for {method} {path}; under /v1 this server answers POST /v1/embeddings, POST /v1/rerank, POST /v1/classify, GET /v1/models and GET /v1/models/{{id}}"),
        )),
    };
    done.unwrap_or_else(OaiError::answer)
}

/// The served model as OpenAI lists models: its name (`--model-name`, else the metadata's);
/// with KServe v1's `name` and `ready` (`GET /v1/models/{name}`), which OpenAI's clients
/// ignore.
fn model_object(app: &App) -> Value {
    json!({"id": app.model_name, "object": "model", "created": 0, "owned_by": "vramfork",
           "name": app.model_name, "ready": !app.shared.get().stopping()})
}

fn one_model(id: &str, app: &App) -> Result<Answer, OaiError> {
    // A TorchServe archive's own name too, as KServe v1's clients of its runtime call it.
    let archive = app.metadata.archive.as_ref();
    if id != app.model_name && archive.is_none_or(|a| a.model_name != id) {
        return Err(OaiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!(
                "the model '{id}' does not exist; this server serves '{}'",
                app.model_name
            ),
        ));
    }
    Ok(Answer::ok(model_object(app)))
}
