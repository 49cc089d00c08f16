//! A request's token rows for the model's one text input, run through the core in passes of
//! at most `max_batch_size` rows (without batching, the input's `max_documents`) and at most
//! the token budget (`max_batch_tokens`), shortest rows first (`documents/passes.rs`), each
//! pass's tokens on the request's span. The text doors (`/v1/embeddings`, rerank, score,
//! classify) read each pass's one output their own way.

use std::time::Duration;

use vramfork::documents::Padding;
use vramfork::metadata::batch_tokens::pass_rows;

use super::{Admitted, Encoding, OutTensor, Parsed, Wanted};
use crate::app::App;
use crate::args::Inputs;
use crate::documents::passes::{by_length, tokens};
use crate::documents::text::Row;
use crate::error::ApiError;
use crate::runner::parts::token_budget;

/// What one more pass costs on the CPU, in tokens: a forward pass's fixed part (dispatching
/// each layer's operators, a few milliseconds for a small encoder on one thread) against
/// what one padded token costs (a tenth of a millisecond or more).
const CPU_PASS_COST_TOKENS: usize = 32;

/// Runs `rows` in passes asking for the model's output `output`; `each` gets a pass's rows
/// (indices into `rows`, shortest first) and its outputs. Returns the passes' forward time.
pub async fn text_passes<R: Row, E: From<ApiError>>(
    app: &App,
    admitted: &mut Admitted<'_>,
    rows: &[R],
    output: &str,
    mut each: impl FnMut(&[usize], Vec<OutTensor>) -> Result<(), E>,
) -> Result<Duration, E> {
    let docs = app.documents.as_ref().expect("tokenized on the documents");
    let text = docs.text(0).expect("a text input");
    let per_pass = pass_rows(text.spec(), app.metadata.max_batch_size);
    let width = (text.spec().padding == Padding::MaxLength).then_some(text.spec().max_length);
    let lengths: Vec<usize> = rows.iter().map(Row::len).collect();
    let mut forward = Duration::ZERO;
    // On the CPU a pass costs about its padded tokens plus a fixed part: passes are cut where
    // the two together are least. On a GPU, as few passes as fit.
    let pass_cost = (!app.hw.on_gpu()).then_some(CPU_PASS_COST_TOKENS);
    for pass in by_length(&lengths, per_pass, token_budget(), width, pass_cost) {
        let (real, padded) = tokens(pass.iter().map(|&i| lengths[i]), width);
        let chunk: Vec<&R> = pass.iter().map(|&i| &rows[i]).collect();
        let inputs = Inputs {
            args: text.feeds(&chunk),
        };
        let wanted = Wanted {
            outputs: Some(vec![output.to_string()]),
            declared: app.metadata.outputs.clone(),
        };
        let out = admitted
            .run_made(Parsed {
                inputs,
                encoding: Encoding::Tensors(wanted),
                timeout: None,
                extra: (),
            })
            .await?
            .out;
        if let Some(t) = admitted.meta().trace.as_deref() {
            t.pass_tokens(real, padded);
        }
        forward += out.forward;
        each(&pass, out.outputs.tensors().map_err(ApiError::Run)?)?;
    }
    Ok(forward)
}
