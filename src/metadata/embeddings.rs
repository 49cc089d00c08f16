//! The `embeddings` block: how a text model makes vectors for OpenAI's `/v1/embeddings`
//! (docs/metadata.md) — `pooling` (`cls`, `mean` over the attention mask, or `none`: the
//! output already holds one vector per input), `normalize` (L2), `matryoshka` (fewer
//! `dimensions` may be asked for), `output` (which of the model's outputs, by position or
//! declared name; the first by default) and `token_ids` (whether `input` may carry ids of
//! the model's own vocabulary). It needs the model's one input to be a text input with a
//! `tokenizer` block. Every mistake stops the start naming `embeddings.<field>`.

use serde_json::{Map, Value};

use super::output_choice::output;
use super::signature::TensorSpec;
use crate::documents::Document;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    Cls,
    Mean,
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Embeddings {
    pub pooling: Pooling,
    pub normalize: bool,
    pub matryoshka: bool,
    pub token_ids: bool,
    /// The output holding the vectors: its position among the model's outputs.
    pub output: usize,
}

const FIELDS: [&str; 5] = ["pooling", "normalize", "matryoshka", "output", "token_ids"];

/// The block, if the metadata has one.
pub(super) fn parse(
    raw: &Map<String, Value>,
    inputs: Option<&[TensorSpec]>,
    outputs: Option<&[TensorSpec]>,
) -> Result<Option<Embeddings>, String> {
    let block = match raw.get("embeddings") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err("field `embeddings` must be an object".into()),
    };
    crate::near_miss::check("embeddings", block, &FIELDS, &[])?;
    if let Some(k) = block.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "field `embeddings.{k}` is not one of the block's: {}",
            FIELDS.join(", ")
        ));
    }
    if !matches!(inputs, Some([one]) if matches!(one.document, Some(Document::Text(_)))) {
        return Err("field `embeddings` needs the model's one input to be a text input with a `tokenizer` block (`inputs[0].tokenizer`)".into());
    }
    let pooling = match block.get("pooling") {
        Some(Value::String(p)) if p == "cls" => Pooling::Cls,
        Some(Value::String(p)) if p == "mean" => Pooling::Mean,
        Some(Value::String(p)) if p == "none" => Pooling::None,
        None => {
            return Err(
                "field `embeddings.pooling` is missing: \"cls\", \"mean\" or \"none\"".into(),
            )
        }
        Some(v) => {
            return Err(format!(
                "field `embeddings.pooling` is {v}; it takes \"cls\", \"mean\" or \"none\""
            ))
        }
    };
    Ok(Some(Embeddings {
        pooling,
        normalize: flag(block, "normalize")?,
        matryoshka: flag(block, "matryoshka")?,
        token_ids: flag(block, "token_ids")?,
        output: output(
            "embeddings",
            block.get("output"),
            outputs.unwrap_or_default(),
        )?,
    }))
}

fn flag(block: &Map<String, Value>, name: &str) -> Result<bool, String> {
    match block.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(format!(
            "field `embeddings.{name}` is {v}; it takes true or false"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::AppMetadata;
    use serde_json::json;

    /// `block` as the `embeddings` of a text model (and `outputs` when given), parsed.
    fn parse_with(block: Value, outputs: Option<Value>) -> Result<Option<Embeddings>, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "").unwrap();
        let mut m = json!({
            "name": "e", "model": "m.pt",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                        "tokenizer": {"file": "tokenizer.json", "max_length": 8}}],
            "embeddings": block,
        });
        if let Some(o) = outputs {
            m["outputs"] = o;
        }
        let path = dir.path().join("app-metadata.json");
        AppMetadata::parse(&path, &m.to_string())
            .map(|m| m.embeddings)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_block_is_read_with_its_defaults() {
        let e = parse_with(json!({"pooling": "mean", "normalize": true}), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            e,
            Embeddings {
                pooling: Pooling::Mean,
                normalize: true,
                matryoshka: false,
                token_ids: false,
                output: 0
            }
        );
        let two = json!([{"name": "hidden", "datatype": "FP32", "shape": [-1, -1, 8]},
                         {"name": "pooled", "datatype": "FP32", "shape": [-1, 8]}]);
        let e = parse_with(json!({"pooling": "none", "output": "pooled"}), Some(two)).unwrap();
        assert_eq!(e.unwrap().output, 1);
    }

    #[test]
    fn every_mistake_names_its_field() {
        let two = json!([{"name": "hidden", "datatype": "FP32", "shape": [-1, -1, 8]}]);
        for (block, outputs, want) in [
            (
                json!({"normalize": true}),
                None,
                "`embeddings.pooling` is missing",
            ),
            (
                json!({"pooling": "max"}),
                None,
                "`embeddings.pooling` is \"max\"",
            ),
            (
                json!({"pooling": "cls", "normalize": "yes"}),
                None,
                "`embeddings.normalize`",
            ),
            (
                json!({"pooling": "cls", "matryoshka": 1}),
                None,
                "`embeddings.matryoshka`",
            ),
            (
                json!({"pooling": "cls", "output": 3}),
                Some(two.clone()),
                "`embeddings.output` is 3",
            ),
            (
                json!({"pooling": "cls", "output": "x"}),
                Some(two),
                "`embeddings.output` is \"x\"",
            ),
            (
                json!({"pooling": "cls", "normalise": true}),
                None,
                "`embeddings.normalise` is so close to `embeddings.normalize`",
            ),
            (
                json!({"pooling": "cls", "layer": 3}),
                None,
                "`embeddings.layer` is not one of",
            ),
            (json!(["cls"]), None, "`embeddings` must be an object"),
        ] {
            let e = parse_with(block.clone(), outputs).unwrap_err();
            assert!(e.contains(want), "{block}: {e}");
        }
        // A model without a text input cannot make embeddings.
        let dir = tempfile::tempdir().unwrap();
        let m = json!({"name": "e", "model": "m.pt", "input": {"shape": [-1, 4]},
                       "embeddings": {"pooling": "cls"}});
        let e = AppMetadata::parse(&dir.path().join("a.json"), &m.to_string()).unwrap_err();
        assert!(
            e.to_string().contains("one input to be a text input"),
            "{e}"
        );
        // A near miss of the block's own name.
        let m = json!({"name": "e", "model": "m.pt", "embedings": {"pooling": "cls"}});
        let e = AppMetadata::parse(&dir.path().join("a.json"), &m.to_string()).unwrap_err();
        assert!(e.to_string().contains("`embeddings`"), "{e}");
    }
}
