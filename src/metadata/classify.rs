//! The `classify` block: how a sequence classifier answers the classify and predict
//! endpoints (docs/metadata.md) — `output` (which of the model's outputs, by position or
//! declared name; the first by default), `activation` (by default softmax over a row of
//! several logits, sigmoid for one, as text-embeddings-inference and sentence-transformers
//! do; `none` for raw logits) and `id2label` (class names, as a Hugging Face config writes
//! them: `{"0": "negative", …}`, or a list). Without `id2label`, the output's `labels` block
//! names the classes, else `LABEL_0…`. Texts and pairs are tokenized as the `rerank` block
//! does (`only_second` truncation). Every mistake stops the start naming
//! `classify.<field>`.

use serde_json::{Map, Value};

use super::rerank::{activation, block, classes, output, Activation};
use super::signature::TensorSpec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classify {
    /// The output holding the logits: its position among the model's outputs.
    pub output: usize,
    pub activation: Option<Activation>,
    /// Class names by index (`id2label`), when declared.
    pub id2label: Option<Vec<String>>,
}

const FIELDS: [&str; 3] = ["output", "activation", "id2label"];

/// The block, if the metadata has one.
pub(super) fn parse(
    raw: &Map<String, Value>,
    inputs: Option<&[TensorSpec]>,
    outputs: Option<&[TensorSpec]>,
) -> Result<Option<Classify>, String> {
    let Some(block) = block("classify", raw, &FIELDS, inputs)? else {
        return Ok(None);
    };
    let output = output("classify", block.get("output"), outputs.unwrap_or_default())?;
    let id2label = id2label(block.get("id2label"))?;
    if let (Some(names), Some(n)) = (&id2label, classes(outputs, output)) {
        if names.len() as i64 != n {
            return Err(format!(
                "field `classify.id2label` names {} classes; output {output} is declared with {n}",
                names.len()
            ));
        }
    }
    Ok(Some(Classify {
        output,
        activation: activation("classify", block.get("activation"))?,
        id2label,
    }))
}

/// `id2label`: a list of names, or an object from "0", "1", … to names (every index once).
fn id2label(v: Option<&Value>) -> Result<Option<Vec<String>>, String> {
    let bad = |v: &Value| {
        format!("field `classify.id2label` is {v}; it takes a list of class names or an object from each class index (\"0\", \"1\", …) to its name")
    };
    let names = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>(),
        Some(Value::Object(o)) => {
            let mut names = vec![None; o.len()];
            for (k, name) in o {
                let i: usize = k.parse().map_err(|_| bad(v.unwrap()))?;
                let slot = names.get_mut(i).ok_or_else(|| {
                    format!(
                        "field `classify.id2label` has the index {i}; with {} names the indices run from 0 to {}",
                        o.len(),
                        o.len() - 1
                    )
                })?;
                *slot = name.as_str().map(str::to_string);
            }
            names.into_iter().collect()
        }
        Some(v) => return Err(bad(v)),
    };
    match names {
        Some(n) if !n.is_empty() => Ok(Some(n)),
        _ => Err(bad(v.unwrap())),
    }
}
