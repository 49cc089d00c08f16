//! The blocks an entry of the signature may carry: `tokenizer` and `image` on inputs (what
//! the worker makes of documents, `crate::documents`) and `labels` on outputs (class names,
//! `crate::labels`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::{Datatype, TensorSpec};

/// The `tokenizer` and `image` blocks of the declared `inputs` (none on `outputs`), with the
/// shape a document input has: `[-1]`, one document per row.
pub(super) fn documents(
    raw: &Map<String, Value>,
    inputs: Option<&mut [TensorSpec]>,
    path: &Path,
) -> Result<(), String> {
    let base = path.parent().unwrap_or(Path::new("."));
    if let (Some(Value::Array(items)), Some(specs)) = (raw.get("inputs"), inputs) {
        for (i, (item, spec)) in items.iter().zip(specs.iter_mut()).enumerate() {
            let Value::Object(o) = item else { continue };
            let at = format!("inputs[{i}]");
            spec.document =
                crate::documents::parse(&at, o, spec.datatype == Datatype::Bytes, base)?;
            if spec.document.is_some() && spec.shape.as_ref().is_some_and(|s| s.len() != 1) {
                return Err(format!(
                    "field `{at}.shape`: a document input has one dimension, the documents ([-1])"
                ));
            }
        }
    }
    if let Some(Value::Array(items)) = raw.get("outputs") {
        for (i, item) in items.iter().enumerate() {
            for block in ["tokenizer", "image"] {
                if item.get(block).is_some() {
                    return Err(format!(
                        "field `outputs[{i}].{block}`: pre-processing applies to inputs only"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The `labels` blocks of the declared `outputs`, by output index.
pub(super) fn labels(
    raw: &Map<String, Value>,
    outputs: Option<&[TensorSpec]>,
    path: &Path,
) -> Result<BTreeMap<usize, crate::labels::Labels>, String> {
    let base = path.parent().unwrap_or(Path::new("."));
    let mut out = BTreeMap::new();
    if let (Some(Value::Array(items)), Some(specs)) = (raw.get("outputs"), outputs) {
        for (i, (item, spec)) in items.iter().zip(specs).enumerate() {
            let Value::Object(o) = item else { continue };
            let classes = spec.shape.as_ref().and_then(|s| s.last().copied());
            if let Some(l) = crate::labels::parse(&format!("outputs[{i}]"), o, base, classes)? {
                out.insert(i, l);
            }
        }
    }
    Ok(out)
}
