//! What the rerank, score and classify doors need of the model's declaration: its `rerank`
//! or `classify` block (checked when the metadata is read, `src/metadata/rerank.rs` and
//! `classify.rs`), with the name the v2 encoding gives the output and the class names. A
//! model without the block answers 404 naming what its metadata lacks.

use hyper::StatusCode;
use vramfork::metadata::rerank::{Activation, PairTruncation, MAX_DOCUMENTS};
use vramfork::metadata::AppMetadata;

use super::refusal::Refusal;

/// Which block a door needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Rerank,
    Classify,
}

#[derive(Debug, Clone)]
pub struct Declaration {
    /// The output's name as the v2 encoding names it.
    pub output: String,
    /// The relevance's column (rerank); `None`: the whole row (classify).
    pub logit: Option<usize>,
    pub activation: Option<Activation>,
    pub truncation: PairTruncation,
    pub max_documents: usize,
    /// Class names (classify), by index, when declared.
    pub labels: Option<Vec<String>>,
}

impl Declaration {
    /// The activation for rows of `logits`: as declared, else sigmoid for one logit and,
    /// for more, none (rerank, as `CrossEncoder`) or softmax (classify, as TEI).
    pub fn activation(&self, logits: usize) -> Activation {
        let many = match self.logit {
            Some(_) => Activation::None,
            None => Activation::Softmax,
        };
        Activation::or_default(self.activation, logits, many)
    }

    /// Class `i`'s name: declared, else Hugging Face's default.
    pub fn label(&self, i: usize) -> String {
        self.labels
            .as_ref()
            .and_then(|l| l.get(i).cloned())
            .unwrap_or_else(|| format!("LABEL_{i}"))
    }
}

/// The model's declaration for `need`, or a 404 saying what it lacks.
pub fn of(metadata: &AppMetadata, need: Need) -> Result<Declaration, Refusal> {
    let name = |at: usize| {
        metadata
            .outputs
            .as_deref()
            .and_then(|o| o.get(at))
            .map_or_else(|| format!("output__{at}"), |o| o.name.clone())
    };
    match (need, &metadata.rerank, &metadata.classify) {
        (Need::Rerank, Some(r), _) => Ok(Declaration {
            output: name(r.output),
            logit: Some(r.logit),
            activation: r.activation,
            truncation: r.truncation,
            max_documents: r.max_documents,
            labels: None,
        }),
        (Need::Classify, _, Some(c)) => Ok(Declaration {
            output: name(c.output),
            logit: None,
            activation: c.activation,
            truncation: PairTruncation::OnlySecond,
            max_documents: MAX_DOCUMENTS,
            labels: c.id2label.clone().or_else(|| {
                metadata.labels.get(&c.output).map(|l| l.names.clone())
            }),
        }),
        (Need::Rerank, ..) => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            "rerank_not_declared",
            "this model does not rerank: its metadata has no `rerank` block (docs/metadata.md: Rerank and classify)",
        )),
        (Need::Classify, ..) => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            "classify_not_declared",
            "this model does not classify: its metadata has no `classify` block (docs/metadata.md: Rerank and classify)",
        )),
    }
}
