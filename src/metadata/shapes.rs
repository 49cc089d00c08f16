//! The shapes a pass runs at: the warm-up passes' and the profiling pass's, from the
//! declared inputs and the metadata's `warmup_inputs` and `profile_input`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{kind, AppMetadata, TensorSpec};

impl AppMetadata {
    /// The input shapes of the warm-up passes, one set (a shape per declared input, in
    /// order) per shape the worker will run at: with batching (`max_batch_size` > 1), the
    /// full batch first (`max_batch_size` rows in the leading dimension of every input that
    /// declares it `-1` or declares no shape), then the one-request shape —
    /// `warmup_inputs`' where given, else the declared shape with `-1` as 1. `None` when an
    /// input has neither a declared shape nor a `warmup_inputs` one.
    pub fn warmup_shapes(&self, max_batch_size: u32) -> Option<Vec<Vec<Vec<i64>>>> {
        let specs = self.inputs.as_ref()?;
        let one: Vec<Vec<i64>> = specs
            .iter()
            .map(|s| {
                if let Some(w) = self.warmup_inputs.as_ref().and_then(|w| w.get(&s.name)) {
                    return Some(w.clone());
                }
                Some(
                    s.shape
                        .as_ref()?
                        .iter()
                        .map(|d| if *d < 0 { 1 } else { *d })
                        .collect(),
                )
            })
            .collect::<Option<_>>()?;
        let batched = match max_batch_size {
            0 | 1 => one.clone(),
            n => with_rows(specs, &one, i64::from(n)),
        };
        Some(if batched == one {
            vec![one]
        } else {
            vec![batched, one]
        })
    }

    /// The shapes a profiling pass uses, one per declared input in order: `profile_input`'s
    /// where given, else the declared shape with a leading `-1` as `batch` (the rows a
    /// batching worker stacks: `max_batch_size`, 1 without batching) and other `-1` as 1 —
    /// or, for a model with text inputs, as the rows of their token budgets' worst pass
    /// (`batch_tokens.rs`; the pass runs their documents at `max_length`). `None` when an
    /// input has no declared shape (nothing to build a pass from).
    pub fn profile_shapes(&self, batch: u32) -> Option<Vec<Vec<i64>>> {
        let specs = self.inputs.as_ref()?;
        let worst = self
            .token_budgets(batch)
            .iter()
            .map(|(_, b)| b.worst_rows())
            .max();
        let batch = worst.map_or(batch, |w| w as u32);
        specs
            .iter()
            .map(|s| {
                if let Some(p) = self.profile_input.as_ref().and_then(|p| p.get(&s.name)) {
                    return Some(p.clone());
                }
                let shape = s.shape.as_ref()?;
                Some(
                    shape
                        .iter()
                        .enumerate()
                        .map(|(i, d)| match (i, *d < 0) {
                            (0, true) => i64::from(batch.max(1)),
                            (_, true) => 1,
                            _ => *d,
                        })
                        .collect(),
                )
            })
            .collect()
    }
}

/// `shapes` (one per input of `specs`) with `rows` in the leading dimension of every input
/// that declares it `-1` (or declares no shape): the rows of a batch, or of a text input's
/// worst pass.
pub fn with_rows(specs: &[TensorSpec], shapes: &[Vec<i64>], rows: i64) -> Vec<Vec<i64>> {
    specs
        .iter()
        .zip(shapes)
        .map(|(spec, shape)| {
            let mut shape = shape.clone();
            let open = spec.shape.as_ref().is_none_or(|d| d.first() == Some(&-1));
            if open && !shape.is_empty() {
                shape[0] = rows;
            }
            shape
        })
        .collect()
}

/// `profile_input` or `warmup_inputs` (`key`): one shape (a model with one declared input)
/// or an object of shapes by input name; each must fit its input's declared shape with every
/// size ≥ 1.
pub(super) fn parse_shapes(
    key: &str,
    v: &Value,
    inputs: Option<&[TensorSpec]>,
) -> Result<BTreeMap<String, Vec<i64>>, String> {
    let Some(specs) = inputs else {
        return Err(format!(
            "field `{key}` needs the model's inputs declared (`input` or `inputs`)"
        ));
    };
    let given: Vec<(String, &Value)> = match v {
        Value::Array(_) => match specs {
            [one] => vec![(one.name.clone(), v)],
            _ => {
                return Err(format!(
                    "field `{key}`: the model has {} inputs; give an object of shapes by input name",
                    specs.len()
                ))
            }
        },
        Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
        other => {
            return Err(format!(
                "field `{key}` must be a shape (an array of sizes) or an object of shapes by input name, found {}",
                kind(other)
            ))
        }
    };
    let mut out = BTreeMap::new();
    for (name, shape) in given {
        let Some(spec) = specs.iter().find(|s| s.name == name) else {
            return Err(format!(
                "field `{key}`: the model has no input named '{name}'"
            ));
        };
        let field = format!("{key}.{name}");
        let Value::Array(dims) = shape else {
            return Err(format!(
                "field `{field}` must be an array of sizes ≥ 1, found {}",
                kind(shape)
            ));
        };
        let shape = dims
            .iter()
            .enumerate()
            .map(|(i, d)| match d.as_i64() {
                Some(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "field `{field}[{i}]` must be a size ≥ 1, found {d}"
                )),
            })
            .collect::<Result<Vec<i64>, String>>()?;
        if let Some(declared) = &spec.shape {
            let fits = declared.len() == shape.len()
                && declared.iter().zip(&shape).all(|(w, g)| *w == -1 || w == g);
            if !fits {
                return Err(format!(
                    "`{field}` is {shape:?}, which input '{name}' (shape {declared:?}, -1 = any size) does not accept"
                ));
            }
        }
        out.insert(name, shape);
    }
    Ok(out)
}
