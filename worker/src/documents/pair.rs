//! Pair encoding for cross-encoders and pair classifiers: `query` and `document` tokenized
//! apart, then joined by the tokenizer's own pair template (`[CLS] q [SEP] d [SEP]` with
//! token type ids 0 then 1 for BERT), as Hugging Face tokenizers encode a pair. Cut to the
//! text input's `max_length` as the `rerank` block says: `only_second` cuts the document
//! alone and refuses a query that leaves it no room (so the query is never lost);
//! `longest_first` cuts a token at a time from the longer, as `truncation=True` does.
//! A document is read from at most its first `max_length` × 1,024 bytes when truncation is
//! on, as single texts are.

use tokenizers::{Encoding, PostProcessor, TruncationDirection};
use vramfork::documents::TEXT_BYTES_PER_TOKEN;
use vramfork::metadata::rerank::PairTruncation;

use super::text::Text;

/// Why a pair could not be encoded: the query's fault, or the document's.
#[derive(Debug, PartialEq)]
pub enum PairError {
    Query(String),
    Document(String),
}

/// An encoded pair, and whether it was cut.
pub struct Pair {
    pub encoding: Encoding,
    pub truncated: bool,
}

impl Text {
    /// `query` and `document` as one row; `doc_cap` cuts the document to at most that many
    /// tokens first (a client's per-document limit).
    pub fn encode_pair(
        &self,
        query: &str,
        document: &str,
        how: PairTruncation,
        doc_cap: Option<usize>,
    ) -> Result<Pair, PairError> {
        let spec = self.spec();
        let (max, truncation) = (spec.max_length, spec.truncation);
        let tok = self.tokenizer();
        let added = tok.get_post_processor().map_or(0, |p| p.added_tokens(true));
        let limit = spec.max_text_bytes();
        let bounded = |text: &'_ str,
                       fault: fn(String) -> PairError|
         -> Result<String, PairError> {
            if text.len() <= limit {
                return Ok(text.to_string());
            }
            if !truncation {
                return Err(fault(format!(
                    "has {} bytes; with truncation off a text takes at most {limit} bytes (`max_length` × {TEXT_BYTES_PER_TOKEN})",
                    text.len()
                )));
            }
            let mut cut = limit;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            Ok(text[..cut].to_string())
        };
        let encode = |text: String, fault: fn(String) -> PairError| {
            tok.encode(text, false)
                .map_err(|e| fault(format!("cannot be tokenized: {e}")))
        };
        let q = encode(bounded(query, PairError::Query)?, PairError::Query)?;
        let mut d = encode(bounded(document, PairError::Document)?, PairError::Document)?;
        let whole = q.len() + d.len() + added;
        let mut cut = !d.get_overflowing().is_empty();
        if let Some(cap) = doc_cap.filter(|&c| c < d.len()) {
            d.truncate(cap, 0, TruncationDirection::Right);
            cut = true;
        }
        let fits = q.len() + d.len() + added <= max;
        match (truncation, how) {
            (false, _) if whole > max => {
                return Err(PairError::Document(format!(
                    "makes a pair of {whole} tokens with the query; this model takes at most {max} (`max_length`) and its truncation is off"
                )))
            }
            (true, PairTruncation::OnlySecond) if !fits => {
                let room = max.saturating_sub(added);
                if q.len() > room || !q.get_overflowing().is_empty() {
                    return Err(PairError::Query(format!(
                        "has {} tokens; with the pair's {added} special tokens this model's `max_length` of {max} leaves room for {room}, and the query is never cut (`rerank.truncation` \"only_second\")",
                        q.len() + q.get_overflowing().iter().map(Encoding::len).sum::<usize>()
                    )));
                }
                d.truncate(room - q.len(), 0, TruncationDirection::Right);
                cut = true;
            }
            (true, PairTruncation::LongestFirst) => cut |= !fits,
            _ => {}
        }
        let mut encoding = tok
            .post_process(q, Some(d), true)
            .map_err(|e| PairError::Document(format!("cannot be tokenized: {e}")))?;
        drop(encoding.take_overflowing());
        Ok(Pair {
            encoding,
            truncated: cut,
        })
    }
}
