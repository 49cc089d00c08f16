//! The metadata's inputs as `forward` receives them: a document input (`BYTES` with a
//! `tokenizer` or `image` block) reaches the model as the tensors its documents become, so a
//! format that records what it takes (a `torch.export` program, an AOTInductor package) is
//! checked against those tensors, not against the `BYTES` input the client sends.

use vramfork::documents::{Document, Resize};
use vramfork::metadata::{AppMetadata, Datatype, Dtype, TensorSpec};
use vramfork::protocol::GpuAssignment;
use vramfork::torchserve::Handler;

/// What the metadata says `forward` takes (a document input as the tensors it becomes:
/// [`as_forward_takes`]), checked at load where the format records what it takes (a
/// `torch.export` program's signature).
#[derive(Debug, Clone, Default)]
pub struct Declared {
    pub inputs: Option<Vec<TensorSpec>>,
    pub max_batch_size: u32,
    /// The plan put the worker on a GPU (a simulated one too): a compiled package must be
    /// compiled for CUDA, and for the GPU's compute capability when the master told it.
    pub plan_gpu: bool,
    pub capability: Option<String>,
    /// The archive's handler is `object_detector`: `forward` takes a list of images and
    /// returns `(losses, detections)` (`detector.rs`).
    pub detector: bool,
}

impl Declared {
    pub fn of(metadata: &AppMetadata, max_batch_size: u32) -> Declared {
        Declared {
            inputs: metadata.inputs.as_deref().map(as_forward_takes),
            max_batch_size,
            plan_gpu: false,
            capability: None,
            detector: metadata
                .archive
                .as_ref()
                .is_some_and(|a| a.handler == Handler::ObjectDetector),
        }
    }

    /// With the GPU the plan put the worker on, if any.
    pub fn placed(self, gpu: Option<&GpuAssignment>) -> Declared {
        Declared {
            plan_gpu: gpu.is_some(),
            capability: gpu.and_then(|g| g.compute_capability.clone()),
            ..self
        }
    }
}

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
                let [h, w] = match i.resize {
                    Resize::Keep => [-1, -1],
                    _ => i.size.map(i64::from),
                };
                out.push(tensor(&spec.name, i.dtype, vec![-1, 3, h, w]));
            }
            None => out.push(spec.clone()),
        }
    }
    out
}
