//! The Open Inference Protocol's classification extension, protocol-neutral: a requested
//! output with `parameters.classification: N` (tritonclient's `class_count`) is answered as
//! a `BYTES` tensor of its `N` best classes per row, best first, each `"value:index"` or
//! `"value:index:label"` as Triton writes them. The values are the output's, or — for the
//! output a `classify` block declares — after its activation (softmax by default), so they
//! equal what the classify endpoints answer; labels come from that block's `id2label`, else
//! the output's `labels` block.

use vramfork::metadata::rerank::Activation;
use vramfork::metadata::{AppMetadata, Datatype};

use super::OutTensor;
use crate::error::ApiError;

/// `tensors` with each output named in `asked` (name, class count) made into its classes.
pub fn apply(
    metadata: &AppMetadata,
    tensors: Vec<OutTensor>,
    asked: &[(String, usize)],
) -> Result<Vec<OutTensor>, ApiError> {
    if asked.is_empty() {
        return Ok(tensors);
    }
    tensors
        .into_iter()
        .map(|t| match asked.iter().find(|(name, _)| *name == t.name) {
            Some(&(_, count)) => classes(metadata, &t, count).map_err(ApiError::BadRequest),
            None => Ok(t),
        })
        .collect()
}

/// The position of the output `name` among the model's (declared, else `output__N`).
fn position(metadata: &AppMetadata, name: &str) -> Option<usize> {
    match metadata.outputs.as_deref() {
        Some(declared) => declared.iter().position(|o| o.name == name),
        None => name.strip_prefix("output__")?.parse().ok(),
    }
}

fn classes(metadata: &AppMetadata, t: &OutTensor, count: usize) -> Result<OutTensor, String> {
    let values = t.floats().map_err(|other| {
        format!(
            "output {}: the classification extension reads FP32 or FP64 outputs, and this one is {other}",
            t.name
        )
    })?;
    let Some(&width) = t.shape.last().filter(|&&w| w > 0) else {
        return Err(format!(
            "output {}: the classification extension needs classes in the last dimension, and its shape is {:?}",
            t.name, t.shape
        ));
    };
    let at = position(metadata, &t.name);
    let declared = metadata.classify.as_ref().filter(|c| Some(c.output) == at);
    let activation = declared.map_or(Activation::None, |c| {
        Activation::or_default(c.activation, width as usize, Activation::Softmax)
    });
    let names: Option<Vec<String>> = declared.and_then(|c| c.id2label.clone()).or_else(|| {
        at.and_then(|i| metadata.labels.get(&i))
            .map(|l| l.names.clone())
    });
    let k = count.min(width as usize);
    let mut data = Vec::new();
    for row in values.chunks(width as usize) {
        let row: Vec<f32> = row.iter().map(|&v| v as f32).collect();
        let scored = activation.apply(&row);
        let mut order: Vec<usize> = (0..scored.len()).collect();
        order.sort_by(|&a, &b| scored[b].total_cmp(&scored[a]));
        for &i in order.iter().take(k) {
            let text = match names.as_ref().and_then(|n| n.get(i)) {
                Some(label) => format!("{}:{i}:{label}", scored[i]),
                None => format!("{}:{i}", scored[i]),
            };
            data.extend_from_slice(&(text.len() as u32).to_le_bytes());
            data.extend_from_slice(text.as_bytes());
        }
    }
    let mut shape = t.shape.clone();
    *shape.last_mut().expect("a last dimension") = k as i64;
    Ok(OutTensor {
        name: t.name.clone(),
        datatype: Datatype::Bytes,
        shape,
        data,
    })
}
