//! A `tokenizer` block ([`TextSpec`]): the tokenizer.json, lengths, truncation, padding
//! and the `forward` arguments ([`Feed`]) a text document becomes.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{max_documents, object, unknown, whole};
use crate::schema::kind;

/// A `tokenizer` block.
#[derive(Debug, Clone, PartialEq)]
pub struct TextSpec {
    /// The `tokenizer.json` (Hugging Face's format), resolved against the metadata's folder.
    pub file: PathBuf,
    /// Tokens per document at most, special tokens included.
    pub max_length: usize,
    /// Longer documents are cut to `max_length` (`true`) or refused with 400 (`false`).
    pub truncation: bool,
    pub padding: Padding,
    /// The `forward` arguments this input becomes, in order, at its place among the inputs.
    pub feeds: Vec<Feed>,
    /// The id padding uses; `None`: the tokenizer's own padding id, else `[PAD]`, `<pad>`, 0.
    pub pad_id: Option<u32>,
    /// Documents one request may carry in this input (more: 413).
    pub max_documents: usize,
}

impl TextSpec {
    /// The most bytes of one document the tokenizer reads: with truncation on, what lies
    /// beyond is never tokenized; with it off, a longer document is refused unread.
    pub fn max_text_bytes(&self) -> usize {
        self.max_length * TEXT_BYTES_PER_TOKEN
    }

    /// The largest the tensors of one document can be: `feeds` int64 rows of `max_length`.
    pub fn bytes_per_document(&self) -> u64 {
        (self.feeds.len() * self.max_length * 8) as u64
    }
}

/// How the rows of one forward pass are padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// To the longest document of the pass (a request, or a batch of requests).
    Longest,
    /// Always to `max_length`.
    MaxLength,
}

/// One tensor a tokenized document gives the model (int64, `[rows, length]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    InputIds,
    AttentionMask,
    TokenTypeIds,
}

impl Feed {
    pub const NAMES: &'static str = "\"input_ids\", \"attention_mask\", \"token_type_ids\"";

    pub fn parse(s: &str) -> Option<Feed> {
        Some(match s {
            "input_ids" => Feed::InputIds,
            "attention_mask" => Feed::AttentionMask,
            "token_type_ids" => Feed::TokenTypeIds,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Feed::InputIds => "input_ids",
            Feed::AttentionMask => "attention_mask",
            Feed::TokenTypeIds => "token_type_ids",
        }
    }
}

/// The largest `max_length` accepted.
pub const MAX_TOKENS_LIMIT: usize = 1 << 16;
/// Bytes of text per token the tokenizer reads at most: a document is tokenized from at
/// most its first `max_length` × this many bytes ([`TextSpec::max_text_bytes`]).
pub const TEXT_BYTES_PER_TOKEN: usize = 1024;

/// A `tokenizer` block at `at`; `base` is the metadata's folder.
pub(super) fn text(at: &str, v: &Value, base: &Path) -> Result<TextSpec, String> {
    let o = object(at, v)?;
    unknown(
        at,
        o,
        &[
            "file",
            "max_length",
            "truncation",
            "padding",
            "feeds",
            "pad_id",
            "max_documents",
        ],
    )?;
    let file = match o.get("file") {
        Some(Value::String(s)) if !s.is_empty() => base.join(s),
        Some(v) => {
            return Err(format!(
                "field `{at}.file` must be the path of a tokenizer.json, found {}",
                kind(v)
            ))
        }
        None => {
            return Err(format!(
                "field `{at}.file` is missing (the tokenizer.json, relative to the metadata)"
            ))
        }
    };
    if !file.is_file() {
        return Err(format!(
            "field `{at}.file`: {} is not a file",
            file.display()
        ));
    }
    let max_length = whole(
        &format!("{at}.max_length"),
        o.get("max_length"),
        1,
        MAX_TOKENS_LIMIT as u64,
    )?
    .ok_or_else(|| format!("field `{at}.max_length` is missing (tokens per document at most)"))?
        as usize;
    let (truncation, padding) = truncation_and_padding(at, o)?;
    let feeds = feeds(at, o.get("feeds"))?;
    let pad_id =
        whole(&format!("{at}.pad_id"), o.get("pad_id"), 0, u32::MAX as u64)?.map(|n| n as u32);
    Ok(TextSpec {
        file,
        max_length,
        truncation,
        padding,
        feeds,
        pad_id,
        max_documents: max_documents(at, o)?,
    })
}

/// `truncation` (default: cut long documents) and `padding` (default: to the longest).
fn truncation_and_padding(at: &str, o: &Map<String, Value>) -> Result<(bool, Padding), String> {
    let truncation = match o.get("truncation") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(format!(
                "field `{at}.truncation` must be true (cut long documents) or false (refuse them), found {v}"
            ))
        }
    };
    let padding = match o.get("padding") {
        None | Some(Value::Null) => Padding::Longest,
        Some(Value::String(s)) if s == "longest" => Padding::Longest,
        Some(Value::String(s)) if s == "max_length" => Padding::MaxLength,
        Some(v) => {
            return Err(format!(
                "field `{at}.padding` must be \"longest\" or \"max_length\", found {v}"
            ))
        }
    };
    Ok((truncation, padding))
}

/// `feeds`: the `forward` arguments a tokenized document becomes, in order, each once
/// (default: `input_ids`, `attention_mask`).
fn feeds(at: &str, v: Option<&Value>) -> Result<Vec<Feed>, String> {
    Ok(match v {
        None | Some(Value::Null) => vec![Feed::InputIds, Feed::AttentionMask],
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut feeds = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let f = item.as_str().and_then(Feed::parse).ok_or_else(|| {
                    format!(
                        "field `{at}.feeds[{i}]` must be one of {}, found {item}",
                        Feed::NAMES
                    )
                })?;
                if feeds.contains(&f) {
                    return Err(format!(
                        "field `{at}.feeds[{i}]`: \"{}\" is listed twice",
                        f.name()
                    ));
                }
                feeds.push(f);
            }
            feeds
        }
        Some(v) => {
            return Err(format!(
            "field `{at}.feeds` must be a non-empty array of {} in forward()'s order, found {v}",
            Feed::NAMES
        ))
        }
    })
}
