//! One rerank, score or classify request through the core, whatever its door: admitted,
//! counted and bounded as every model request is (`--max-queue-wait`, the client's deadline,
//! `--max-requests`, the body limit; a model without the door's block refuses first), its
//! body read whole; its rows (texts, or pairs) tokenized on the documents pool under
//! `--request-timeout` and the client's deadline (`pair.rs` beside the tokenizer); run
//! sorted by length in passes of at most `max_batch_size` rows (without batching, the text
//! input's `max_documents`), each through the core's pass, and put back in the request's
//! order; one row of logits per row, for the door to activate and shape.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Request, StatusCode};
use tokenizers::Encoding;

use super::declaration::{self, Declaration, Need};
use super::refusal::Refusal;
use crate::app::App;
use crate::documents::pair::PairError;
use crate::documents::DocError;
use crate::http::answer::Answer;
use crate::http::request::{self, meta_of, refuse};
use crate::infer::{text_passes, Admitted, OutTensor, Working};
use crate::observe::access_log::Tokenize;
use vramfork::lanes::{self, Lane};

/// A row to score: one text, or a pair (a query and a document).
pub enum Row {
    One(String),
    Two(String, String),
}

/// What a request asks to score: one query against documents, or rows of their own.
pub enum Rows {
    Query {
        query: String,
        documents: Vec<String>,
        /// The client's cap on each document's tokens (Cohere's `max_tokens_per_doc`).
        doc_cap: Option<usize>,
    },
    Each(Vec<Row>),
}

impl Rows {
    fn len(&self) -> usize {
        match self {
            Rows::Query { documents, .. } => documents.len(),
            Rows::Each(rows) => rows.len(),
        }
    }
}

/// The header saying how many rows were cut to the model's `max_length` (as on
/// `/v1/embeddings`).
pub const TRUNCATED: &str = "x-truncated-inputs";

/// An admitted request with its body.
pub struct Call<'a> {
    admitted: Admitted<'a>,
    pub decl: Declaration,
    pub body: Vec<u8>,
    working: Option<Working<'a>>,
}

/// Each row's logits, with what the answer says of them.
pub struct Scored {
    pub logits: Vec<Vec<f32>>,
    /// Tokens given to the model, all rows.
    pub tokens: usize,
    pub truncated: usize,
    preprocess: Duration,
    forward: Duration,
    last: bool,
}

impl Scored {
    /// `body` answered with `X-Truncated-Inputs`, `Server-Timing` and the last request's close.
    pub fn answer(&self, body: serde_json::Value) -> Answer {
        let mut a = Answer::ok(body);
        a.close = self.last;
        a.timing = Some((self.preprocess, self.forward));
        a.headers
            .push((TRUNCATED, HeaderValue::from(self.truncated)));
        a
    }
}

/// Admits the request as one needing the block `need` (a model without it refuses before
/// the request counts as a model request), and reads its body.
pub async fn admit(req: Request<Incoming>, app: &App, need: Need) -> Result<Call<'_>, Refusal> {
    let decl = match declaration::of(&app.metadata, need) {
        Ok(decl) => decl,
        Err(refused) => {
            let meta = meta_of(&req)?;
            return Err(refuse(req, app, &meta, refused).await);
        }
    };
    let (admitted, body) = request::admit(req, app).await?;
    Ok(Call {
        admitted,
        decl,
        body,
        // Work from here, as a parsed request is: each pass then counts as its own.
        working: Some(Working::enter(&app.shared)),
    })
}

/// The body as JSON of type `T`, or a 400 naming what is wrong with it.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(body).map_err(|e| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("the request body is not a valid request: {e}"),
        )
    })
}

/// vLLM's `priority` field (lower is served earlier, 0 the default): its lane, or a 400
/// naming the field.
pub fn lane(priority: Option<&serde_json::Value>) -> Result<Option<Lane>, Refusal> {
    match priority {
        None => Ok(None),
        Some(v) => lanes::of_vllm_json(v).map_err(|e| Refusal::invalid("priority", e)),
    }
}

impl Call<'_> {
    /// Its passes wait in `lane` (`None`: in the header's, or the normal lane).
    pub fn prioritize(&mut self, lane: Option<Lane>) {
        self.admitted.prioritize(lane);
    }

    /// The logits of each row, in the request's order. `field` names the documents (or
    /// inputs) in refusals; `query` the query.
    pub async fn score(
        mut self,
        app: &App,
        rows: Rows,
        field: &'static str,
        query: &'static str,
    ) -> Result<Scored, Refusal> {
        let n = rows.len();
        if n > self.decl.max_documents {
            return Err(Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_many_documents",
                format!(
                    "`{field}` holds {n} items; this server takes at most {} a request (`rerank.max_documents`)",
                    self.decl.max_documents
                ),
            ));
        }
        let (rows, truncated, preprocess) = self.tokenized(app, rows, field, query).await?;
        drop(self.working.take());
        let tokens = rows.iter().map(Encoding::len).sum();
        let meta = self.admitted.meta();
        if let Some(t) = &meta.trace {
            t.tokenized(Tokenize {
                after: crate::observe::access_log::work_began_after(meta.arrived, preprocess),
                took: preprocess,
                inputs: rows.len() as u32,
                tokens: tokens as u64,
                truncated: truncated as u32,
            });
        }
        let (logits, forward) = self.passes(app, rows).await?;
        Ok(Scored {
            logits,
            tokens,
            truncated,
            preprocess,
            forward,
            last: self.admitted.claim(),
        })
    }

    async fn tokenized(
        &self,
        app: &App,
        rows: Rows,
        field: &'static str,
        query: &'static str,
    ) -> Result<(Vec<Encoding>, usize, Duration), Refusal> {
        let docs = app.documents.clone().ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                "no_text_input",
                "this model has no text input with a tokenizer",
            )
        })?;
        let how = self.decl.truncation;
        let work = docs.on_pool(
            self.admitted.meta().deadline.map(|d| d.at()),
            app.request_timeout,
            move |d, until| {
                let text = d
                    .text(0)
                    .ok_or_else(|| DocError::Failed("the model's one input is not text".into()))?;
                let mut out = Vec::with_capacity(rows.len());
                let mut cut = 0;
                let pair = |i: usize, q: &str, doc: &str, cap| {
                    text.encode_pair(q, doc, how, cap).map_err(|e| match e {
                        PairError::Query(m) => DocError::Bad(format!("`{query}` {m}")),
                        PairError::Document(m) => DocError::Bad(format!("`{field}[{i}]` {m}")),
                    })
                };
                let mut push = |p: crate::documents::pair::Pair| {
                    cut += usize::from(p.truncated);
                    out.push(p.encoding);
                };
                match rows {
                    Rows::Query {
                        query: q,
                        documents,
                        doc_cap,
                    } => {
                        for (i, doc) in documents.iter().enumerate() {
                            crate::documents::stop_at(Some(until))?;
                            push(pair(i, &q, doc, doc_cap)?);
                        }
                    }
                    Rows::Each(rows) => {
                        for (i, row) in rows.iter().enumerate() {
                            crate::documents::stop_at(Some(until))?;
                            match row {
                                Row::Two(a, b) => push(pair(i, a, b, None)?),
                                Row::One(t) => {
                                    let mut enc = text
                                        .encode_one(t)
                                        .map_err(|e| DocError::Bad(format!("`{field}[{i}]` {e}")))?;
                                    let over = enc.take_overflowing();
                                    if enc.len() > text.spec().max_length {
                                        return Err(DocError::Bad(format!("`{field}[{i}]` has {} tokens; this model takes at most {} (`max_length`) and its truncation is off", enc.len(), text.spec().max_length)));
                                    }
                                    push(crate::documents::pair::Pair {
                                        encoding: enc,
                                        truncated: !over.is_empty(),
                                    });
                                }
                            }
                        }
                    }
                }
                Ok((out, cut))
            },
        );
        match work.await {
            Ok(((rows, cut), took)) => {
                if let Some(m) = &app.metrics {
                    m.preprocessed(took);
                }
                Ok((rows, cut, took))
            }
            Err(DocError::Bad(m)) => Err(Refusal::invalid(field, m)),
            Err(DocError::Stopped { client: true }) => {
                let meta = self.admitted.meta();
                let deadline = meta.deadline.expect("a client deadline");
                Err(deadline.expired(meta.arrived).into())
            }
            Err(DocError::Stopped { client: false }) => Err(
                crate::error::ApiError::PreprocessTimeout(app.request_timeout.as_millis() as u64)
                    .into(),
            ),
            Err(e) => Err(crate::error::ApiError::from(e).into()),
        }
    }

    /// The rows run shortest first in passes, their logits put back in the rows' order.
    async fn passes(
        &mut self,
        app: &App,
        rows: Vec<Encoding>,
    ) -> Result<(Vec<Vec<f32>>, Duration), Refusal> {
        let mut logits = vec![Vec::new(); rows.len()];
        let output = self.decl.output.clone();
        let forward = text_passes(app, &mut self.admitted, &rows, &output, |pass, tensors| {
            let one = tensors
                .first()
                .ok_or_else(|| failed("the model returned no output".into()))?;
            for (row, &i) in rows_of(one, pass.len())?.into_iter().zip(pass) {
                logits[i] = row;
            }
            Ok::<_, Refusal>(())
        })
        .await?;
        Ok((logits, forward))
    }
}

fn failed(e: String) -> Refusal {
    Refusal::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "output_error",
        format!("{e}; see the `rerank` and `classify` blocks in docs/metadata.md"),
    )
}

/// One row of logits per input: the output is `[rows]` (one logit each) or `[rows, logits]`,
/// FP32 or FP64.
fn rows_of(t: &OutTensor, rows: usize) -> Result<Vec<Vec<f32>>, Refusal> {
    let data: Vec<f32> = t
        .floats()
        .map_err(|other| {
            failed(format!(
                "the output is {other}; scores are read from FP32 or FP64 logits"
            ))
        })?
        .into_iter()
        .map(|x| x as f32)
        .collect();
    let shape: Vec<usize> = t.shape.iter().map(|&n| n as usize).collect();
    match shape.as_slice() {
        [n] if *n == rows && data.len() == rows => Ok(data.iter().map(|&x| vec![x]).collect()),
        [n, k] if *n == rows && *k > 0 && data.len() == rows * k => {
            Ok(data.chunks(*k).map(<[f32]>::to_vec).collect())
        }
        s => Err(failed(format!(
            "the output has shape {s:?} for {rows} rows; scores are read from [rows] or [rows, logits]"
        ))),
    }
}
