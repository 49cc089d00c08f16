//! A request's documents (texts, images) made into the model's inputs before its pass.

use std::time::{Duration, Instant};

use super::Deadline;
use crate::app::App;
use crate::args::{Arg, Inputs};
use crate::documents::DocError;
use crate::error::ApiError;
use crate::observe::access_log::{Preprocess, Trace};

/// Documents pre-processed (tokenized, decoded) on the pool, off the event loop, under the
/// request's deadlines: `--request-timeout` from the start of the work, and the client's
/// (`deadline`). Past either it stops between documents and the request is answered now.
/// The inputs as the model takes them, and how long that took (`None`: no document input).
/// Inputs holding no documents (no `Strings` or `Blobs` argument) pass as they are: their
/// handler tokenized them itself (`/v1/embeddings`, which counts tokens and takes ids).
/// The work's start, length and document counts go in the request's `trace` (its
/// `preprocess` span).
pub(super) async fn preprocess(
    app: &App,
    inputs: Inputs,
    deadline: Option<&Deadline>,
    arrived: Instant,
    trace: Option<&Trace>,
) -> Result<(Inputs, Option<Duration>), ApiError> {
    let documents = |a: &Arg| matches!(a, Arg::Strings(_) | Arg::Blobs(_));
    let Some(docs) = app
        .documents
        .as_ref()
        .filter(|_| inputs.args.iter().any(documents))
    else {
        return Ok((inputs, None));
    };
    let (texts, images) = docs.counts(&inputs);
    let work = docs.run(
        &app.input_specs,
        inputs,
        deadline.map(|d| d.at()),
        app.request_timeout,
    );
    let (inputs, took) = match work.await {
        Ok(done) => done,
        Err(DocError::Stopped { client: true }) => {
            return Err(deadline.expect("a client deadline").expired(arrived))
        }
        Err(DocError::Stopped { client: false }) => {
            return Err(ApiError::PreprocessTimeout(
                app.request_timeout.as_millis() as u64
            ))
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(m) = &app.metrics {
        m.preprocessed(took);
    }
    if let Some(t) = trace {
        t.preprocessed(Preprocess {
            after: crate::observe::access_log::work_began_after(arrived, took),
            took,
            texts,
            images,
        });
    }
    Ok((inputs, Some(took)))
}
