//! Which of the model's outputs a block reads (`embeddings.output`, `rerank.output`,
//! `classify.output`): a position among the outputs, or a declared output's name.

use serde_json::Value;

use super::signature::TensorSpec;

/// The output `name.output` names: a position, or a declared output's name.
pub(super) fn output(
    name: &str,
    given: Option<&Value>,
    declared: &[TensorSpec],
) -> Result<usize, String> {
    let Some(v) = given.filter(|v| !v.is_null()) else {
        return Ok(0);
    };
    let found = match (v.as_u64(), v.as_str()) {
        (Some(i), _) if declared.is_empty() || (i as usize) < declared.len() => Some(i as usize),
        (_, Some(n)) => declared.iter().position(|o| o.name == n),
        _ => None,
    };
    found.ok_or_else(|| {
        format!(
            "field `{name}.output` is {v}; it takes the position of one of the model's outputs{}",
            if declared.is_empty() {
                String::new()
            } else {
                format!(
                    " (0 to {}) or the name of a declared one",
                    declared.len() - 1
                )
            }
        )
    })
}
