//! The metadata's inputs as `forward` receives them: a document input (`BYTES` with a
//! `tokenizer` or `image` block) reaches the model as the tensors its documents become, so a
//! format that records what it takes (a `torch.export` program, an AOTInductor package) is
//! checked against those tensors, not against the `BYTES` input the client sends.

use vramfork::documents::Document;
use vramfork::metadata::{Datatype, Dtype, TensorSpec};

/// `specs` with each document input replaced by the tensors it becomes, in place: a text
/// input's feeds (`input_ids`, `attention_mask`, `token_type_ids` as it declares them), each
/// int64 `[documents, tokens]`; an image input's `[images, 3, height, width]` of its dtype.
/// Other inputs are kept as declared.
pub fn as_forward_takes(specs: &[TensorSpec]) -> Vec<TensorSpec> {
    let tensor = |name: &str, dtype: Dtype, shape: Vec<i64>| TensorSpec {
        name: name.to_string(),
        datatype: Datatype::Tensor(dtype),
        shape: Some(shape),
        document: None,
    };
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        match &spec.document {
            Some(Document::Text(t)) => out.extend(
                t.feeds
                    .iter()
                    .map(|f| tensor(f.name(), Dtype::Int64, vec![-1, -1])),
            ),
            Some(Document::Image(i)) => {
                let [h, w] = i.size.map(i64::from);
                out.push(tensor(&spec.name, i.dtype, vec![-1, 3, h, w]));
            }
            None => out.push(spec.clone()),
        }
    }
    out
}
