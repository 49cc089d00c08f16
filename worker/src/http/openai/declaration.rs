//! How a model makes embeddings, as its metadata declares them: the top-level `embeddings`
//! block (docs/metadata.md) — `pooling` (`cls`, `mean` over the attention mask, or `none`:
//! the output already holds one vector per input), `normalize` (L2), `matryoshka` (smaller
//! `dimensions` may be asked for), `output` (which of the model's outputs, by position or
//! declared name; the first by default) and `token_ids` (whether `input` may carry token
//! ids of the model's own vocabulary). The model's one input must be a text input with a
//! `tokenizer` block. A model without either answers `/v1/embeddings` with 404 naming what
//! its metadata lacks; a block that is not valid is the server's fault (500).

use hyper::StatusCode;
use serde_json::{Map, Value};
use vramfork::documents::Document;
use vramfork::metadata::AppMetadata;

use super::error::OaiError;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pooling {
    Cls,
    Mean,
    None,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    pub pooling: Pooling,
    pub normalize: bool,
    pub matryoshka: bool,
    pub token_ids: bool,
    /// The output's name as the v2 encoding names it.
    pub output: String,
}

const FIELDS: [&str; 5] = ["pooling", "normalize", "matryoshka", "output", "token_ids"];

fn lacking(message: String) -> OaiError {
    OaiError::new(StatusCode::NOT_FOUND, "embeddings_not_declared", message)
}

fn invalid(message: String) -> OaiError {
    OaiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "invalid_embeddings_metadata",
        format!("the metadata's `embeddings` block is not valid: {message}"),
    )
}

/// The model's declaration, or why it has none.
pub fn of(metadata: &AppMetadata) -> Result<Declaration, OaiError> {
    let text_input = matches!(
        metadata.inputs.as_deref(),
        Some([one]) if matches!(one.document, Some(Document::Text(_)))
    );
    if !text_input {
        return Err(lacking(
            "this model has no embeddings: /v1/embeddings needs a model whose one input is a text input with a `tokenizer` block (`inputs[0].tokenizer` in its metadata)".into(),
        ));
    }
    let block = match metadata.raw.get("embeddings") {
        None => {
            return Err(lacking(
                "this model has no embeddings: its metadata has no `embeddings` block (`{\"pooling\": \"cls\" | \"mean\" | \"none\", \"normalize\": …}`)".into(),
            ))
        }
        Some(Value::Object(o)) => o,
        Some(_) => return Err(invalid("it must be an object".into())),
    };
    if let Some(k) = block.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(invalid(format!(
            "unknown field `{k}`; it takes {}",
            FIELDS.join(", ")
        )));
    }
    let pooling = match block.get("pooling").and_then(Value::as_str) {
        Some("cls") => Pooling::Cls,
        Some("mean") => Pooling::Mean,
        Some("none") => Pooling::None,
        _ => {
            return Err(invalid(format!(
                "`pooling` is {}; it takes \"cls\", \"mean\" or \"none\"",
                block.get("pooling").unwrap_or(&Value::Null)
            )))
        }
    };
    Ok(Declaration {
        pooling,
        normalize: flag(block, "normalize")?,
        matryoshka: flag(block, "matryoshka")?,
        token_ids: flag(block, "token_ids")?,
        output: output(metadata, block.get("output"))?,
    })
}

fn flag(block: &Map<String, Value>, name: &str) -> Result<bool, OaiError> {
    match block.get(name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(invalid(format!("`{name}` is {v}; it takes true or false"))),
    }
}

/// The v2 name of the output the vectors come from: the declared outputs' names, else
/// `output__N`.
fn output(metadata: &AppMetadata, given: Option<&Value>) -> Result<String, OaiError> {
    let declared = metadata.outputs.as_deref().unwrap_or_default();
    let name_of = |i: usize| {
        declared
            .get(i)
            .map_or_else(|| format!("output__{i}"), |o| o.name.clone())
    };
    match given {
        None => Ok(name_of(0)),
        Some(v) => match (v.as_u64(), v.as_str()) {
            (Some(i), _) if declared.is_empty() || (i as usize) < declared.len() => {
                Ok(name_of(i as usize))
            }
            (_, Some(name)) if declared.iter().any(|o| o.name == name) => Ok(name.into()),
            _ => Err(invalid(format!(
                "`output` is {v}; it takes the position of one of the model's outputs or the name of a declared one"
            ))),
        },
    }
}
