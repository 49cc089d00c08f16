//! The tokens of the model's passes: which `forward` arguments are a text input's token rows
//! (`[rows, length]`), and what each pass held — its rows × padded length (the most of any
//! pass, `vramfork_text_pass_tokens_max`, is what the token budget bounds) and its real
//! tokens beside them (`vramfork_text_tokens_total`, whose ratio is the padding
//! efficiency). Counted where passes run, so whatever door the rows came through, a batched
//! pass counts once, padded as it ran, and a request run in parts counts each part.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use tch::Tensor;

use crate::args::Arg;

/// One text input's `forward` arguments, and how its real tokens are told from padding.
pub struct TextArgs {
    pub args: Range<usize>,
    pub real: Real,
}

/// Where a text input's real tokens show.
pub enum Real {
    /// Its attention mask (argument index): the ones.
    Mask(usize),
    /// Without a mask, its ids (argument index) that are not the padding id.
    NotPad { ids: usize, pad: i64 },
}

static TEXTS: OnceLock<Vec<TextArgs>> = OnceLock::new();
/// The most tokens one pass of the text arguments held (rows × padded length).
static LARGEST: AtomicU64 = AtomicU64::new(0);
/// Tokens given to the model: real, and padded.
static TOKENS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The text inputs of this worker's `forward` arguments (set once, at boot).
pub fn configure(texts: Vec<TextArgs>) {
    let _ = TEXTS.set(texts);
}

/// The most tokens one pass of the text arguments held (`vramfork_text_pass_tokens_max`).
pub fn largest() -> u64 {
    LARGEST.load(Ordering::Relaxed)
}

/// Tokens given to the model in text passes so far: real, and padded.
pub fn totals() -> (u64, u64) {
    (
        TOKENS[0].load(Ordering::Relaxed),
        TOKENS[1].load(Ordering::Relaxed),
    )
}

/// Counts a pass about to run on `args`.
pub(super) fn note(args: &[Arg]) {
    let Some(texts) = TEXTS.get() else {
        return;
    };
    if let Some((rows, width)) = text_rows(args) {
        LARGEST.fetch_max((rows * width) as u64, Ordering::Relaxed);
    }
    let (mut real, mut padded) = (0, 0);
    for t in texts {
        let Some([rows, width]) = t.args.clone().find_map(|i| dims(args.get(i)?)) else {
            continue;
        };
        padded += (rows * width) as u64;
        real += match t.real {
            Real::Mask(i) => tensor(args.get(i)).map(|m| m.count_nonzero(None::<i64>)),
            Real::NotPad { ids, pad } => {
                tensor(args.get(ids)).map(|t| t.ne(pad).count_nonzero(None::<i64>))
            }
        }
        .map_or((rows * width) as u64, |n| n.int64_value(&[]) as u64);
    }
    TOKENS[0].fetch_add(real, Ordering::Relaxed);
    TOKENS[1].fetch_add(padded, Ordering::Relaxed);
}

/// The rows and padded length of the text arguments of `args`, when it has any.
pub(super) fn text_rows(args: &[Arg]) -> Option<(usize, usize)> {
    let (mut rows, mut width) = (0usize, 0usize);
    for t in TEXTS.get()? {
        for [r, w] in t.args.clone().filter_map(|i| dims(args.get(i)?)) {
            rows = rows.max(r);
            width = width.max(w);
        }
    }
    (rows > 0).then_some((rows, width))
}

fn tensor(a: Option<&Arg>) -> Option<&Tensor> {
    match a? {
        Arg::Tensor(t) | Arg::Padded { tensor: t, .. } => Some(t),
        _ => None,
    }
}

/// `[rows, length]` of a token-row argument.
fn dims(a: &Arg) -> Option<[usize; 2]> {
    match tensor(Some(a))?.size()[..] {
        [r, w] => Some([r as usize, w as usize]),
        _ => None,
    }
}
