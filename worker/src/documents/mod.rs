//! Documents in: the declared pre-processing of `BYTES` inputs, run on a
//! request's parsed input before it joins the model's queue. Text is tokenized with the
//! input's `tokenizer.json` ([`text`]), images are decoded, resized and normalised
//! ([`image`]); every other argument passes through. A bad document is a 400 naming the
//! input and the element; a request with more documents than an input's `max_documents`, or
//! whose documents could become more than [`MAX_PREPROCESSED_BYTES`] of tensors, is a 413
//! before anything is decoded; a failure of the pre-processing itself (a panic) is a 500.
//! Nothing here can take the worker down.
//!
//! The work runs off the event loop and off the model thread, at most `--torch-threads`
//! requests at a time ([`Documents::permits`]), each with one intra-op thread, so
//! pre-processing never has more cores than the model would use. It runs under the
//! request's deadlines (`--request-timeout` from its start, the client's own): past them it
//! stops between documents ([`DocError::Stopped`]) and the HTTP side answers at once, so a
//! costly request holds neither its client nor the worker.

pub mod image;
mod jpeg;
pub mod pair;
pub mod passes;
pub mod text;

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use tokio::sync::Semaphore;
use vramfork::documents::{Document, MAX_PREPROCESSED_BYTES};
use vramfork::metadata::TensorSpec;

use crate::args::{Arg, Inputs};

/// Why a request's documents were not pre-processed.
#[derive(Debug, Clone, PartialEq)]
pub enum DocError {
    /// A bad document (not UTF-8, not an image, too many pixels…): 400.
    Bad(String),
    /// More documents than `max_documents`, or more tensor bytes than a request may make:
    /// 413, before anything was decoded.
    TooLarge(String),
    /// The pre-processing itself failed (a panic on its thread): 500.
    Failed(String),
    /// A deadline passed: the client's (`client`), or `--request-timeout` counted from the
    /// start of the work. The work stops before its next document; the request is answered
    /// at once.
    Stopped { client: bool },
}

impl From<String> for DocError {
    fn from(e: String) -> DocError {
        DocError::Bad(e)
    }
}

/// The pre-processing of a model's document inputs, loaded once per worker.
pub struct Documents {
    /// One per declared input, in order: what its documents become (`None`: passed through).
    inputs: Vec<Option<Prep>>,
    /// Requests pre-processed at a time (the pool's size: `--torch-threads`); a permit is
    /// held by the blocking thread doing the work, until it really ends.
    permits: Arc<Semaphore>,
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
            permits: Arc::new(Semaphore::new(pool.max(1))),
        }))
    }

    /// `input` pre-processed on the pool (a blocking thread, at most `--torch-threads` at
    /// a time, each with one intra-op thread), and how long the work took (not counting the
    /// wait for a slot). The work gets `limit` from its start (`--request-timeout`, as a
    /// forward pass does) and ends at the client's deadline `client` at the latest: past
    /// either this answers [`DocError::Stopped`] at once, and the thread stops before its
    /// next document (a slot is free again when it really has). The wait for a slot ends
    /// at the client's deadline too.
    pub async fn run(
        self: &Arc<Self>,
        specs: &Arc<Vec<TensorSpec>>,
        input: Inputs,
        client: Option<Instant>,
        limit: Duration,
    ) -> Result<(Inputs, Duration), DocError> {
        let specs = specs.clone();
        self.on_pool(client, limit, move |me, until| {
            me.prepare(&specs, input, Some(until))
        })
        .await
    }

    /// `work` on the pool as [`Documents::run`] runs a request's pre-processing (a slot
    /// among `--torch-threads`, one intra-op thread, `limit` from its start and the
    /// client's deadline `client`, both given to `work` as the instant to stop by between
    /// documents), and how long it took.
    pub async fn on_pool<T: Send + 'static>(
        self: &Arc<Self>,
        client: Option<Instant>,
        limit: Duration,
        work: impl FnOnce(&Documents, Instant) -> Result<T, DocError> + Send + 'static,
    ) -> Result<(T, Duration), DocError> {
        let slot = self.permits.clone().acquire_owned();
        let permit = match client {
            Some(c) => tokio::time::timeout_at(c.into(), slot)
                .await
                .map_err(|_| DocError::Stopped { client: true })?,
            None => slot.await,
        }
        .map_err(|_| DocError::Failed("the pre-processing pool is closed".into()))?;
        let own = Instant::now() + limit;
        let (until, by_client) = match client {
            Some(c) if c <= own => (c, true),
            _ => (own, false),
        };
        let me = self.clone();
        let work = off_thread(move || {
            let _permit = permit;
            crate::process::one_intra_thread_here();
            let start = Instant::now();
            work(&me, until).map(|t| (t, start.elapsed()))
        });
        match tokio::time::timeout_at(until.into(), work).await {
            Ok(Err(DocError::Stopped { .. })) | Err(_) => {
                Err(DocError::Stopped { client: by_client })
            }
            Ok(done) => done,
        }
    }

    /// The tokenizer of input `i`, when it is a text input.
    pub fn text(&self, i: usize) -> Option<&text::Text> {
        match self.inputs.get(i) {
            Some(Some(Prep::Text(t))) => Some(t),
            _ => None,
        }
    }

    /// The documents `input` gives to text inputs, and to image inputs (its `preprocess`
    /// span's counts).
    pub fn counts(&self, input: &Inputs) -> (u32, u32) {
        let (mut texts, mut images) = (0u32, 0u32);
        for (arg, prep) in input.args.iter().zip(&self.inputs) {
            let n = documents_in(arg).unwrap_or(0) as u32;
            match prep {
                Some(Prep::Text(_)) => texts += n,
                Some(Prep::Image(_)) => images += n,
                None => {}
            }
        }
        (texts, images)
    }

    /// 413 when `input` has more documents in an input than its `max_documents`, or when
    /// its documents, each at the largest it can become, make more than
    /// [`MAX_PREPROCESSED_BYTES`] of tensors: decided from the counts alone.
    pub fn check_size(&self, specs: &[TensorSpec], input: &Inputs) -> Result<(), DocError> {
        let mut total = 0u64;
        for ((arg, spec), prep) in input.args.iter().zip(specs).zip(&self.inputs) {
            let (Some(prep), Some(n)) = (prep, documents_in(arg)) else {
                continue;
            };
            let (max, each) = match prep {
                Prep::Text(t) => (t.spec().max_documents, t.spec().bytes_per_document()),
                Prep::Image(i) => (i.max_documents, i.bytes_per_document()),
            };
            let name = &spec.name;
            if n > max {
                return Err(DocError::TooLarge(vramfork::documents::too_many(
                    name, n, max,
                )));
            }
            total = total.saturating_add(each.saturating_mul(n as u64));
            if total > MAX_PREPROCESSED_BYTES {
                return Err(DocError::TooLarge(format!(
                    "input {name}: {n} documents of up to {each} bytes of tensors each make more than a request may become ({MAX_PREPROCESSED_BYTES} bytes of tensors, all its document inputs together): send them in several requests"
                )));
            }
        }
        Ok(())
    }

    /// The model's arguments for `input` (its arguments in declared order): a text input
    /// becomes its tokenizer's tensors (`feeds`, in order), an image input one
    /// `[N, 3, H, W]` tensor; the rest is unchanged.
    pub fn prepare(
        &self,
        specs: &[TensorSpec],
        input: Inputs,
        until: Option<Instant>,
    ) -> Result<Inputs, DocError> {
        self.check_size(specs, &input)?;
        let mut args = Vec::with_capacity(input.args.len() + 2);
        for ((arg, prep), spec) in input.args.into_iter().zip(&self.inputs).zip(specs) {
            stop_at(until)?;
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
                    args.push(Arg::Tensor(image::batch(spec, name, &blobs, until)?))
                }
                (Some(Prep::Image(spec)), Arg::Strings(b64)) => {
                    let blobs = b64
                        .iter()
                        .enumerate()
                        .map(|(i, s)| {
                            // MIME base64 (RFC 2045) wraps its lines at 76 columns
                            // (`base64` without -w0, Python's encodebytes): the line ends and
                            // any other white space are not data.
                            let data: Vec<u8> =
                                s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
                            base64::engine::general_purpose::STANDARD
                                .decode(data)
                                .map_err(|e| {
                                    format!(
                                        "input {name}: element {i} is not base64 ({e}); send images as base64 strings in JSON, or as raw bytes (v2 binary data, or a POST / body with Content-Type image/jpeg or image/png)"
                                    )
                                })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    args.push(Arg::Tensor(image::batch(spec, name, &blobs, until)?))
                }
                (Some(_), Arg::Tensor(_) | Arg::Padded { .. }) => {
                    return Err(DocError::Bad(format!(
                        "input {name} takes documents (BYTES), not a tensor"
                    )))
                }
            }
        }
        Ok(Inputs { args })
    }
}

/// [`DocError::Stopped`] once `until` has passed (which deadline it was, [`Documents::run`]
/// says).
pub fn stop_at(until: Option<Instant>) -> Result<(), DocError> {
    match until {
        Some(u) if Instant::now() >= u => Err(DocError::Stopped { client: false }),
        _ => Ok(()),
    }
}

/// The number of documents `arg` carries (`None`: not documents).
fn documents_in(arg: &Arg) -> Option<usize> {
    match arg {
        Arg::Strings(s) => Some(s.len()),
        Arg::Blobs(b) => Some(b.len()),
        Arg::Tensor(_) | Arg::Padded { .. } => None,
    }
}

/// `work` on a blocking thread; a panic there is a 500 saying the pre-processing failed
/// (the worker carries on: the panic ends that thread's task only).
async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, DocError> + Send + 'static,
) -> Result<T, DocError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        let why = match e.try_into_panic() {
            Ok(p) => p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into()),
            Err(e) => e.to_string(),
        };
        DocError::Failed(format!(
            "pre-processing the request's documents failed inside the worker ({why}); this is a fault of the server, not of the request"
        ))
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;

    #[test]
    fn a_panic_in_pre_processing_is_a_500_and_errors_keep_their_status() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = rt
            .block_on(off_thread::<()>(|| panic!("index out of bounds")))
            .unwrap_err();
        let api = ApiError::from(e);
        assert_eq!(api.status().as_u16(), 500, "{api}");
        let msg = api.to_string();
        assert!(
            msg.contains("pre-processing") && msg.contains("index out of bounds"),
            "{msg}"
        );
        assert_eq!(rt.block_on(off_thread(|| Ok(7))), Ok(7));
        let bad = ApiError::from(DocError::Bad("input x: element 0".into()));
        assert_eq!(bad.status().as_u16(), 400);
        let big = ApiError::from(DocError::TooLarge("input x: 9 documents".into()));
        assert_eq!(big.status().as_u16(), 413);
        assert!(!big.closes_connection());
    }
}
