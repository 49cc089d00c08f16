//! What `/v1/embeddings` needs of the model's declaration: the metadata's `embeddings` block
//! (checked when the metadata is read, `src/metadata/embeddings.rs`), with the name the v2
//! encoding gives its output. A model without the block — or without a text input, which
//! the block requires — answers 404 naming what its metadata lacks.

use hyper::StatusCode;
use vramfork::documents::Document;
use vramfork::metadata::embeddings::Pooling;
use vramfork::metadata::AppMetadata;

use super::error::OaiError;

#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    pub pooling: Pooling,
    pub normalize: bool,
    pub matryoshka: bool,
    pub token_ids: bool,
    /// The output's name as the v2 encoding names it: as `outputs` declares, else
    /// `output__N`.
    pub output: String,
}

fn lacking(message: &str) -> OaiError {
    OaiError::new(
        StatusCode::NOT_FOUND,
        "embeddings_not_declared",
        format!("this model has no embeddings: {message} (docs/metadata.md: Embeddings)"),
    )
}

/// The model's declaration, or why it has none.
pub fn of(metadata: &AppMetadata) -> Result<Declaration, OaiError> {
    let Some(e) = &metadata.embeddings else {
        let text = matches!(
            metadata.inputs.as_deref(),
            Some([one]) if matches!(one.document, Some(Document::Text(_)))
        );
        return Err(lacking(if text {
            "its metadata has no `embeddings` block (`{\"pooling\": \"cls\" | \"mean\" | \"none\", …}`)"
        } else {
            "/v1/embeddings needs a model whose one input is a text input with a `tokenizer` block, and an `embeddings` block in its metadata"
        }));
    };
    let output = metadata
        .outputs
        .as_deref()
        .and_then(|o| o.get(e.output))
        .map_or_else(|| format!("output__{}", e.output), |o| o.name.clone());
    Ok(Declaration {
        pooling: e.pooling,
        normalize: e.normalize,
        matryoshka: e.matryoshka,
        token_ids: e.token_ids,
        output,
    })
}
