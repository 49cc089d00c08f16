//! The token budget of a text pass (`max_batch_tokens`): what one forward pass of a text
//! input may hold, counted as rows × padded length (TEI's `--max-batch-tokens`). A text
//! model's memory grows with the tokens of a pass (and its attention with their length), so
//! the budget, not the row count, is what bounds the largest pass a client can cause. The
//! warm-up runs the budget's worst shape ([`TokenBudget::worst_rows`] documents of
//! `max_length` tokens), so the footprint measured at start bounds every pass.

use serde_json::{Map, Value};

use super::{kind, AppMetadata};
use crate::documents::{Document, TextSpec};

/// The budget when the metadata gives none, at most: TEI's default `--max-batch-tokens`.
pub const DEFAULT_BATCH_TOKENS: usize = 16_384;
/// The largest `max_batch_tokens` accepted.
pub const MAX_BATCH_TOKENS_LIMIT: u64 = 1 << 24;

/// `max_batch_tokens`: a whole number 1..=[`MAX_BATCH_TOKENS_LIMIT`] when given.
pub(super) fn parse(raw: &Map<String, Value>) -> Result<Option<usize>, String> {
    let bad = |found: String| {
        format!(
            "field `max_batch_tokens` must be a whole number 1..={MAX_BATCH_TOKENS_LIMIT} (the tokens one pass of a text input may hold: rows × padded length), found {found}"
        )
    };
    match raw.get("max_batch_tokens") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|n| (1..=MAX_BATCH_TOKENS_LIMIT).contains(n))
            .map(|n| Some(n as usize))
            .ok_or_else(|| bad(n.to_string())),
        Some(v) => Err(bad(kind(v).to_string())),
    }
}

/// Rows one pass of text input `text` may hold whatever their length: `max_batch_size` with
/// batching, else the input's `max_documents`.
pub fn pass_rows(text: &TextSpec, max_batch_size: u32) -> usize {
    match max_batch_size {
        0 => text.max_documents,
        n => n as usize,
    }
    .max(1)
}

/// What one pass of a text input may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    /// Rows × padded length a pass may hold (a single longer document runs alone).
    pub tokens: usize,
    /// Rows a pass may hold whatever their length: `max_batch_size` with batching, else the
    /// input's `max_documents`.
    pub max_rows: usize,
    /// The input's `max_length`.
    pub max_length: usize,
    /// Whether the metadata gave it (`max_batch_tokens`), rather than the default.
    pub given: bool,
}

impl TokenBudget {
    /// The budget of text input `text`: `max_batch_tokens`, else the rows a pass may hold ×
    /// `max_length`, at most [`DEFAULT_BATCH_TOKENS`] (and at least one full document).
    pub fn of(given: Option<usize>, text: &TextSpec, max_batch_size: u32) -> TokenBudget {
        let max_rows = pass_rows(text, max_batch_size);
        let max_length = text.max_length.max(1);
        let tokens = given.unwrap_or_else(|| {
            (max_rows * max_length)
                .min(DEFAULT_BATCH_TOKENS)
                .max(max_length)
        });
        TokenBudget {
            tokens,
            max_rows,
            max_length,
            given: given.is_some(),
        }
    }

    /// The rows of the budget's worst pass: documents of `max_length` tokens, as many as the
    /// budget holds (one at least: a longer document runs alone), at most `max_rows`.
    pub fn worst_rows(&self) -> usize {
        (self.tokens / self.max_length).clamp(1, self.max_rows)
    }

    /// The same budget holding `tokens` (what a warm-up proved).
    pub fn holding(self, tokens: usize) -> TokenBudget {
        TokenBudget { tokens, ..self }
    }
}

impl AppMetadata {
    /// The token budget of each declared text input, by input index.
    pub fn token_budgets(&self, max_batch_size: u32) -> Vec<(usize, TokenBudget)> {
        let inputs = self.inputs.as_deref().unwrap_or_default();
        inputs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match &s.document {
                Some(Document::Text(t)) => {
                    Some((i, TokenBudget::of(self.max_batch_tokens, t, max_batch_size)))
                }
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(max_length: usize, max_documents: usize) -> TextSpec {
        TextSpec {
            file: "tokenizer.json".into(),
            max_length,
            truncation: true,
            padding: crate::documents::Padding::Longest,
            feeds: vec![],
            pad_id: None,
            max_documents,
        }
    }

    #[test]
    fn the_default_is_the_rows_a_pass_holds_at_max_length_at_most_teis() {
        // Without batching the rows are the input's max_documents: 64 × 512 is over 16,384.
        let b = TokenBudget::of(None, &text(512, 64), 0);
        assert_eq!((b.tokens, b.worst_rows(), b.given), (16_384, 32, false));
        // With batching, max_batch_size rows.
        let b = TokenBudget::of(None, &text(128, 64), 8);
        assert_eq!((b.tokens, b.worst_rows()), (1024, 8));
        // A budget below one document still runs one document alone.
        let b = TokenBudget::of(Some(100), &text(512, 64), 0);
        assert_eq!((b.tokens, b.worst_rows(), b.given), (100, 1, true));
        let b = TokenBudget::of(Some(1 << 20), &text(16, 64), 4);
        assert_eq!(b.worst_rows(), 4, "never more rows than a pass holds");
    }

    #[test]
    fn the_field_is_a_whole_number_in_range() {
        let parsed = |v: Value| {
            let mut m = Map::new();
            m.insert("max_batch_tokens".into(), v);
            parse(&m)
        };
        assert_eq!(parsed(Value::from(4096)), Ok(Some(4096)));
        assert_eq!(parse(&Map::new()), Ok(None));
        for (v, found) in [
            (Value::from(0), "found 0"),
            (Value::from(-5), "found -5"),
            (Value::from(2.5), "found 2.5"),
            (Value::from("4096"), "found a string"),
            (Value::from(MAX_BATCH_TOKENS_LIMIT + 1), "found 16777217"),
        ] {
            let e = parsed(v).unwrap_err();
            assert!(
                e.contains("`max_batch_tokens`") && e.ends_with(found),
                "{e}"
            );
        }
    }
}
