//! `POST /v1/embeddings`: admitted, counted and bounded as every model request is by the
//! core (`infer/`: `--max-queue-wait`, client deadline, `--max-requests`, body limit); the body
//! read as OpenAI's request (`request.rs`); its inputs tokenized on the documents pool
//! (`tokens.rs`) under `--request-timeout` and the client's deadline; run in passes of at most
//! `max_batch_size` inputs (without batching, the input's `max_documents`), each through the
//! core's pass; pooled into vectors (`vectors.rs`); answered in OpenAI's shape with
//! `usage` (tokens given to the model), `X-Truncated-Inputs` (inputs cut to `max_length`) and
//! `Server-Timing` (the tokenizing, and the passes' forward time summed).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Request, StatusCode};
use serde::Serialize;

use super::declaration::{self, Declaration};
use super::error::OaiError;
use super::request::{self, Format, Input, Rules};
use super::tokens::{tokenize, Tokenized};
use super::vectors::{base64, finish, Output};
use crate::app::App;
use crate::documents::text::Row;
use crate::documents::DocError;
use crate::error::ApiError;
use crate::http::answer::Answer;
use crate::http::request::{admit, meta_of, refuse};
use crate::infer::{text_passes, Admitted, Meta, Working};
use crate::observe::access_log::Tokenize;

/// The header saying how many inputs were cut to the model's `max_length`.
pub const TRUNCATED: &str = "x-truncated-inputs";

/// The width of the vectors this worker's model makes, learnt from its first pass (0 until
/// then): `dimensions` is checked against it before the inputs are tokenized.
static WIDTH: AtomicUsize = AtomicUsize::new(0);

/// The text input's `max_length` (0 without one: such a model answers 404 before this).
fn max_length(app: &App) -> usize {
    let text = app.documents.as_ref().and_then(|d| d.text(0));
    text.map_or(0, |t| t.spec().max_length)
}

#[derive(Serialize)]
struct Item {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

pub async fn embeddings(req: Request<Incoming>, app: &App) -> Result<Answer, OaiError> {
    // A model that makes no embeddings refuses before the request counts as a model request.
    let decl = match declaration::of(&app.metadata) {
        Ok(decl) => decl,
        Err(refused) => {
            let meta = meta_of(&req)?;
            return Err(refuse(req, app, &meta, refused).await);
        }
    };
    let (mut admitted, body) = admit(req, app).await?;
    // Work from here, as a parsed request is: each pass then counts as its own.
    let working = Working::enter(&app.shared);
    let rules = Rules {
        token_ids: decl.token_ids,
        max_ids: max_length(app).max(request::MAX_IDS_PER_INPUT),
    };
    let asked = tokio::task::spawn_blocking(move || request::parse(&body, rules))
        .await
        .map_err(|e| ApiError::BadRequest(format!("could not parse the request body: {e}")))??;
    admitted.prioritize(asked.priority);
    // The vectors' width, once a pass has shown it: a wrong `dimensions` costs no tokenizing.
    match WIDTH.load(Ordering::Relaxed) {
        0 => {}
        width => check_dimensions(asked.dimensions, &decl, width)?,
    }
    let (tokens, preprocess) = tokenized(app, admitted.meta(), asked.input).await?;
    let lengths: Vec<usize> = tokens.rows.iter().map(Row::len).collect();
    if let Some(t) = &admitted.meta().trace {
        t.tokenized(Tokenize {
            after: crate::observe::access_log::work_began_after(
                admitted.meta().arrived,
                preprocess,
            ),
            took: preprocess,
            inputs: lengths.len() as u32,
            tokens: lengths.iter().sum::<usize>() as u64,
            truncated: tokens.truncated as u32,
        });
    }
    drop(working);
    let (vectors, forward, last) = passes(app, &mut admitted, &decl, tokens.rows, &lengths).await?;
    let width = vectors.first().map_or(0, Vec::len);
    WIDTH.store(width, Ordering::Relaxed);
    check_dimensions(asked.dimensions, &decl, width)?;
    let data: Vec<Item> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let v = finish(v, asked.dimensions, decl.normalize);
            Item {
                object: "embedding",
                index,
                embedding: match asked.format {
                    Format::Float => Vector::Float(v),
                    Format::Base64 => Vector::Base64(base64(&v)),
                },
            }
        })
        .collect();
    let n: usize = lengths.iter().sum();
    let body = serde_json::json!({
        "object": "list",
        "data": data,
        "model": asked.model,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    });
    let mut answer = Answer::ok(body);
    answer.close = last;
    answer.timing = Some((preprocess, forward));
    answer
        .headers
        .push((TRUNCATED, HeaderValue::from(tokens.truncated)));
    Ok(answer)
}

/// A 400 for `dimensions` other than the vectors' `width`, or fewer for a Matryoshka model.
fn check_dimensions(
    asked: Option<usize>,
    decl: &Declaration,
    width: usize,
) -> Result<(), OaiError> {
    let Some(d) = asked else { return Ok(()) };
    if d == width || (d < width && decl.matryoshka) {
        return Ok(());
    }
    Err(OaiError::invalid(
        "dimensions",
        "invalid_dimensions",
        format!(
            "`dimensions` is {d}; this model's vectors have {width}{}",
            if decl.matryoshka {
                ", and it takes that many or fewer".to_string()
            } else {
                format!(", and it is not declared Matryoshka (`embeddings.matryoshka`): it takes {width} or no `dimensions`")
            }
        ),
    ))
}

/// The inputs as token rows, on the documents pool under `--request-timeout` and the
/// client's deadline.
async fn tokenized(
    app: &App,
    meta: &Meta,
    input: Input,
) -> Result<(Tokenized, Duration), OaiError> {
    let docs = app.documents.clone().ok_or_else(|| {
        OaiError::new(
            StatusCode::NOT_FOUND,
            "embeddings_not_declared",
            "this model has no text input with a tokenizer",
        )
    })?;
    let work = docs.on_pool(
        meta.deadline.map(|d| d.at()),
        app.request_timeout,
        move |d, until| {
            let text = d
                .text(0)
                .ok_or_else(|| DocError::Failed("the model's one input is not text".into()))?;
            tokenize(text, input, until)
        },
    );
    match work.await {
        Ok((t, took)) => {
            if let Some(m) = &app.metrics {
                m.preprocessed(took);
            }
            Ok((t, took))
        }
        Err(DocError::Bad(m)) => Err(OaiError::invalid("input", "invalid_input", m)),
        Err(DocError::Stopped { client: true }) => Err(meta
            .deadline
            .expect("a client deadline")
            .expired(meta.arrived)
            .into()),
        Err(DocError::Stopped { client: false }) => {
            Err(ApiError::PreprocessTimeout(app.request_timeout.as_millis() as u64).into())
        }
        Err(e) => Err(ApiError::from(e).into()),
    }
}

/// The rows run in passes through the core (`infer::text_passes`: shortest rows first),
/// each pooled into one vector per row, answered in the request's order; with whether the
/// request was the worker's last.
async fn passes(
    app: &App,
    admitted: &mut Admitted<'_>,
    decl: &Declaration,
    rows: Vec<super::tokens::Tokens>,
    lengths: &[usize],
) -> Result<(Vec<Vec<f32>>, Duration, bool), OaiError> {
    let mut vectors = vec![Vec::new(); rows.len()];
    let failed = |e: String| {
        OaiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "output_error",
            format!("{e}; see the `embeddings` block in docs/metadata.md"),
        )
    };
    let forward = text_passes(app, admitted, &rows, &decl.output, |pass, tensors| {
        let one = tensors
            .first()
            .ok_or_else(|| failed("the model returned no output".into()))?;
        let output = Output::read(one).map_err(failed)?;
        let lengths: Vec<usize> = pass.iter().map(|&i| lengths[i]).collect();
        let pooled = output.pool(decl.pooling, &lengths).map_err(failed)?;
        for (&i, v) in pass.iter().zip(pooled) {
            vectors[i] = v;
        }
        Ok::<_, OaiError>(())
    })
    .await?;
    Ok((vectors, forward, admitted.claim()))
}
