//! Documents in (issue 27): the declared pre-processing of `BYTES` inputs, run on a
//! request's parsed input before it joins the model's queue. Text is tokenized with the
//! input's `tokenizer.json` ([`text`]), images are decoded, resized and normalised
//! ([`image`]); every other argument passes through. A bad document is a 400 naming the
//! input and the element; nothing here can take the worker down.
//!
//! The work runs off the event loop and off the model thread, at most `--torch-threads`
//! requests at a time ([`Documents::permits`]), so pre-processing never has more cores than
//! the model would use.

pub mod image;
pub mod text;

use std::time::{Duration, Instant};

use base64::Engine;
use tokio::sync::Semaphore;
use vramfork::documents::Document;
use vramfork::metadata::TensorSpec;

use crate::args::{Arg, Inputs};

/// The pre-processing of a model's document inputs, loaded once per worker.
pub struct Documents {
    /// One per declared input, in order: what its documents become (`None`: passed through).
    inputs: Vec<Option<Prep>>,
    /// Requests pre-processed at a time (the pool's size: `--torch-threads`).
    permits: Semaphore,
}

enum Prep {
    Text(Box<text::Text>),
    Image(vramfork::documents::ImageSpec),
}

impl Documents {
    /// The document inputs of `specs` loaded (tokenizers read), or `None` when there are
    /// none; `Err` names the input and the file.
    pub fn load(specs: Option<&[TensorSpec]>, pool: usize) -> Result<Option<Documents>, String> {
        let Some(specs) = specs.filter(|s| s.iter().any(|s| s.document.is_some())) else {
            return Ok(None);
        };
        let inputs = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Ok(match &s.document {
                    None => None,
                    Some(Document::Text(t)) => {
                        Some(Prep::Text(Box::new(text::Text::load(t).map_err(|e| {
                            format!("input {} (`inputs[{i}].tokenizer.file`): {e}", s.name)
                        })?)))
                    }
                    Some(Document::Image(i)) => Some(Prep::Image(i.clone())),
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Some(Documents {
            inputs,
            permits: Semaphore::new(pool.max(1)),
        }))
    }

    /// `input` pre-processed on the pool (a blocking thread, at most `--torch-threads` at
    /// a time), and how long the work took (not counting the wait for a permit).
    pub async fn run(
        self: &std::sync::Arc<Self>,
        specs: &std::sync::Arc<Vec<TensorSpec>>,
        input: Inputs,
    ) -> Result<(Inputs, Duration), String> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| "the worker is stopping".to_string())?;
        let (me, specs) = (self.clone(), specs.clone());
        tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            me.prepare(&specs, input).map(|i| (i, start.elapsed()))
        })
        .await
        .map_err(|e| format!("pre-processing failed: {e}"))?
    }

    /// The model's arguments for `input` (its arguments in declared order): a text input
    /// becomes its tokenizer's tensors (`feeds`, in order), an image input one
    /// `[N, 3, H, W]` tensor; the rest is unchanged.
    pub fn prepare(&self, specs: &[TensorSpec], input: Inputs) -> Result<Inputs, String> {
        let mut args = Vec::with_capacity(input.args.len() + 2);
        for ((arg, prep), spec) in input.args.into_iter().zip(&self.inputs).zip(specs) {
            let name = &spec.name;
            match (prep, arg) {
                (None, arg) => args.push(arg),
                (Some(Prep::Text(t)), Arg::Strings(docs)) => args.extend(t.encode(name, &docs)?),
                (Some(Prep::Text(t)), Arg::Blobs(blobs)) => {
                    let docs = blobs
                        .into_iter()
                        .enumerate()
                        .map(|(i, b)| {
                            String::from_utf8(b).map_err(|e| {
                                format!("input {name}: element {i} is not valid UTF-8 ({e})")
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    args.extend(t.encode(name, &docs)?);
                }
                (Some(Prep::Image(spec)), Arg::Blobs(blobs)) => {
                    args.push(Arg::Tensor(image::batch(spec, name, &blobs)?))
                }
                (Some(Prep::Image(spec)), Arg::Strings(b64)) => {
                    let blobs = b64
                        .iter()
                        .enumerate()
                        .map(|(i, s)| {
                            base64::engine::general_purpose::STANDARD
                                .decode(s.trim())
                                .map_err(|e| {
                                    format!(
                                        "input {name}: element {i} is not base64 ({e}); send images as base64 strings in JSON, or as raw bytes (v2 binary data, or a POST / body with Content-Type image/jpeg or image/png)"
                                    )
                                })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    args.push(Arg::Tensor(image::batch(spec, name, &blobs)?))
                }
                (Some(_), Arg::Tensor(_) | Arg::Padded { .. }) => {
                    return Err(format!(
                        "input {name} takes documents (BYTES), not a tensor"
                    ))
                }
            }
        }
        Ok(Inputs { args })
    }
}
