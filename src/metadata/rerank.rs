//! The `rerank` block: how a cross-encoder scores (query, document) pairs for the rerank and
//! score endpoints (docs/metadata.md) — `output` (which of the model's outputs, by position
//! or declared name; the first by default), `logit` (which column of a `[pairs, logits]`
//! output is the relevance; 0 by default), `activation` (`sigmoid`, `softmax` over the row
//! before the logit is taken, or `none`; by default sigmoid for a one-logit output, none
//! otherwise, as sentence-transformers' `CrossEncoder` does), `truncation` (`only_second`
//! by default: the query is never cut and one that leaves no room is refused;
//! `longest_first`, as Hugging Face tokenizers' `truncation=True`) and `max_documents` (per
//! request, 1,000 by default). It needs the model's one input to be a text input with a
//! `tokenizer` block, whose `feeds` say whether `token_type_ids` reach the model. Every
//! mistake stops the start naming `rerank.<field>`; the same helpers read the `classify`
//! block (`classify.rs`).

use serde_json::{Map, Value};

pub(super) use super::output_choice::output;
use super::signature::TensorSpec;
use crate::documents::Document;

/// What is applied to a row of logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Sigmoid,
    Softmax,
    None,
}

impl Activation {
    pub fn name(self) -> &'static str {
        match self {
            Activation::Sigmoid => "sigmoid",
            Activation::Softmax => "softmax",
            Activation::None => "none",
        }
    }

    /// As declared, else sentence-transformers' default for a row of `logits`: sigmoid for
    /// one, `many` otherwise.
    pub fn or_default(given: Option<Activation>, logits: usize, many: Activation) -> Activation {
        given.unwrap_or(if logits == 1 {
            Activation::Sigmoid
        } else {
            many
        })
    }

    /// `row` with the activation applied (softmax over the whole row).
    pub fn apply(self, row: &[f32]) -> Vec<f32> {
        match self {
            Activation::None => row.to_vec(),
            Activation::Sigmoid => row
                .iter()
                .map(|&x| (1.0 / (1.0 + (-f64::from(x)).exp())) as f32)
                .collect(),
            Activation::Softmax => {
                let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x.into()));
                let exp: Vec<f64> = row.iter().map(|&x| (f64::from(x) - max).exp()).collect();
                let sum: f64 = exp.iter().sum();
                exp.iter().map(|e| (e / sum) as f32).collect()
            }
        }
    }
}

/// How a pair longer than `max_length` is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairTruncation {
    /// Only the document; a query that leaves no room for one is refused.
    OnlySecond,
    /// A token at a time from the longer of the two.
    LongestFirst,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rerank {
    /// The output holding the logits: its position among the model's outputs.
    pub output: usize,
    pub logit: usize,
    pub activation: Option<Activation>,
    pub truncation: PairTruncation,
    pub max_documents: usize,
}

/// Documents a request may carry by default.
pub const MAX_DOCUMENTS: usize = 1000;
/// The largest `max_documents` accepted.
pub const MAX_DOCUMENTS_LIMIT: u64 = 100_000;

const FIELDS: [&str; 5] = [
    "output",
    "logit",
    "activation",
    "truncation",
    "max_documents",
];

/// The block, if the metadata has one.
pub(super) fn parse(
    raw: &Map<String, Value>,
    inputs: Option<&[TensorSpec]>,
    outputs: Option<&[TensorSpec]>,
) -> Result<Option<Rerank>, String> {
    let Some(block) = block("rerank", raw, &FIELDS, inputs)? else {
        return Ok(None);
    };
    let truncation = match block.get("truncation") {
        None | Some(Value::Null) => PairTruncation::OnlySecond,
        Some(Value::String(s)) if s == "only_second" => PairTruncation::OnlySecond,
        Some(Value::String(s)) if s == "longest_first" => PairTruncation::LongestFirst,
        Some(v) => {
            return Err(format!(
                "field `rerank.truncation` is {v}; it takes \"only_second\" (the query is never cut) or \"longest_first\""
            ))
        }
    };
    let logit = whole("rerank.logit", block.get("logit"), 0, 1 << 20)?.unwrap_or(0) as usize;
    let max_documents = whole(
        "rerank.max_documents",
        block.get("max_documents"),
        1,
        MAX_DOCUMENTS_LIMIT,
    )?
    .map_or(MAX_DOCUMENTS, |n| n as usize);
    let output = output("rerank", block.get("output"), outputs.unwrap_or_default())?;
    if let Some(n) = classes(outputs, output) {
        if logit as i64 >= n {
            return Err(format!(
                "field `rerank.logit` is {logit}; output {output} is declared with {n} logits (0 to {})",
                n - 1
            ));
        }
    }
    Ok(Some(Rerank {
        output,
        logit,
        activation: activation("rerank", block.get("activation"))?,
        truncation,
        max_documents,
    }))
}

/// The declared size of output `at`'s last dimension, when known.
pub(super) fn classes(outputs: Option<&[TensorSpec]>, at: usize) -> Option<i64> {
    let spec = outputs?.get(at)?;
    spec.shape.as_ref()?.last().copied().filter(|&n| n > 0)
}

/// The block `name` as an object, its fields checked against `fields`, on a model whose one
/// input is text.
pub(super) fn block<'a>(
    name: &str,
    raw: &'a Map<String, Value>,
    fields: &[&str],
    inputs: Option<&[TensorSpec]>,
) -> Result<Option<&'a Map<String, Value>>, String> {
    let block = match raw.get(name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(format!("field `{name}` must be an object")),
    };
    crate::near_miss::check(name, block, fields, &[])?;
    if let Some(k) = block.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(format!(
            "field `{name}.{k}` is not one of the block's: {}",
            fields.join(", ")
        ));
    }
    if !matches!(inputs, Some([one]) if matches!(one.document, Some(Document::Text(_)))) {
        return Err(format!("field `{name}` needs the model's one input to be a text input with a `tokenizer` block (`inputs[0].tokenizer`)"));
    }
    Ok(Some(block))
}

pub(super) fn activation(name: &str, v: Option<&Value>) -> Result<Option<Activation>, String> {
    Ok(match v {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "sigmoid" => Some(Activation::Sigmoid),
        Some(Value::String(s)) if s == "softmax" => Some(Activation::Softmax),
        Some(Value::String(s)) if s == "none" => Some(Activation::None),
        Some(v) => {
            return Err(format!(
                "field `{name}.activation` is {v}; it takes \"sigmoid\", \"softmax\" or \"none\""
            ))
        }
    })
}

fn whole(at: &str, v: Option<&Value>, min: u64, max: u64) -> Result<Option<u64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "field `{at}` is {v}; it takes a whole number from {min} to {max}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::AppMetadata;
    use serde_json::json;

    /// `extra` merged into the metadata of a text model with one declared 3-wide output.
    fn parse_with(extra: Value) -> Result<AppMetadata, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "").unwrap();
        let mut m = json!({
            "name": "r", "model": "m.pt",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                        "tokenizer": {"file": "tokenizer.json", "max_length": 8}}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}],
        });
        for (k, v) in extra.as_object().unwrap() {
            m[k] = v.clone();
        }
        AppMetadata::parse(&dir.path().join("app-metadata.json"), &m.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_blocks_are_read_with_their_defaults() {
        let m = parse_with(
            json!({"rerank": {}, "classify": {"id2label": {"1": "b", "0": "a", "2": "c"}}}),
        )
        .unwrap();
        assert_eq!(
            m.rerank,
            Some(Rerank {
                output: 0,
                logit: 0,
                activation: None,
                truncation: PairTruncation::OnlySecond,
                max_documents: MAX_DOCUMENTS,
            })
        );
        let c = m.classify.unwrap();
        assert_eq!(c.id2label, Some(vec!["a".into(), "b".into(), "c".into()]));
        let m = parse_with(
            json!({"rerank": {"output": "logits", "logit": 2, "activation": "softmax",
                                             "truncation": "longest_first", "max_documents": 5}}),
        )
        .unwrap();
        let r = m.rerank.unwrap();
        assert_eq!(
            (r.logit, r.activation, r.truncation, r.max_documents),
            (
                2,
                Some(Activation::Softmax),
                PairTruncation::LongestFirst,
                5
            )
        );
    }

    #[test]
    fn every_mistake_names_its_field() {
        for (extra, want) in [
            (
                json!({"rerank": {"activation": "tanh"}}),
                "`rerank.activation` is \"tanh\"",
            ),
            (
                json!({"rerank": {"truncation": "only_first"}}),
                "`rerank.truncation`",
            ),
            (
                json!({"rerank": {"logit": 3}}),
                "`rerank.logit` is 3; output 0 is declared with 3 logits",
            ),
            (
                json!({"rerank": {"max_documents": 0}}),
                "`rerank.max_documents` is 0",
            ),
            (
                json!({"rerank": {"output": "x"}}),
                "`rerank.output` is \"x\"",
            ),
            (
                json!({"rerank": {"activaton": "none"}}),
                "`rerank.activaton` is so close to `rerank.activation`",
            ),
            (
                json!({"rerank": {"layer": 1}}),
                "`rerank.layer` is not one of",
            ),
            (json!({"rerank": []}), "`rerank` must be an object"),
            (
                json!({"classify": {"id2label": ["a", "b"]}}),
                "`classify.id2label` names 2 classes; output 0 is declared with 3",
            ),
            (
                json!({"classify": {"id2label": {"0": "a", "1": "b", "5": "c"}}}),
                "has the index 5",
            ),
            (
                json!({"classify": {"id2label": {"x": "a"}}}),
                "`classify.id2label` is",
            ),
            (
                json!({"classify": {"activation": 1}}),
                "`classify.activation` is 1",
            ),
            (json!({"rerenk": {}}), "`rerank`"),
        ] {
            let e = parse_with(extra.clone()).unwrap_err();
            assert!(e.contains(want), "{extra}: {e}");
        }
        // A model without a text input cannot rerank.
        let dir = tempfile::tempdir().unwrap();
        let m = json!({"name": "r", "model": "m.pt", "input": {"shape": [-1, 4]}, "rerank": {}});
        let e = AppMetadata::parse(&dir.path().join("a.json"), &m.to_string()).unwrap_err();
        assert!(
            e.to_string()
                .contains("`rerank` needs the model's one input to be a text input"),
            "{e}"
        );
    }

    #[test]
    fn the_activations_are_sentence_transformers() {
        let row = [1.0f32, 2.0, 3.0];
        let s = Activation::Softmax.apply(&row);
        let sum: f32 = s.iter().sum();
        assert!(
            (sum - 1.0).abs() < 1e-6 && s[2] > s[1] && s[1] > s[0],
            "{s:?}"
        );
        assert!((Activation::Softmax.apply(&[0.0, 0.0])[0] - 0.5).abs() < 1e-7);
        assert!((Activation::Sigmoid.apply(&[0.0])[0] - 0.5).abs() < 1e-7);
        assert_eq!(Activation::None.apply(&row), row.to_vec());
        assert_eq!(
            Activation::or_default(None, 1, Activation::None),
            Activation::Sigmoid
        );
        assert_eq!(
            Activation::or_default(None, 3, Activation::Softmax),
            Activation::Softmax
        );
        assert_eq!(
            Activation::or_default(Some(Activation::None), 1, Activation::Softmax),
            Activation::None
        );
    }
}
