//! The inputs of `/v1/embeddings` as token rows, made on the documents pool: texts with the
//! model's tokenizer (its special tokens, `max_length` and `truncation` as for any request),
//! token ids taken as given (ids of the model's own vocabulary, special tokens included),
//! cut to `max_length` when truncation is on. Each row's token count is what `usage` counts
//! and what mean pooling averages over; the rows cut are counted for `X-Truncated-Inputs`.

use std::time::Instant;

use vramfork::documents::Feed;

use super::request::Input;
use crate::documents::text::{Row, Text};
use crate::documents::{stop_at, DocError};

/// One input's tokens: ids, attention mask (all ones) and token type ids.
pub struct Tokens {
    ids: Vec<u32>,
    mask: Vec<u32>,
    types: Vec<u32>,
}

impl Tokens {
    fn of_ids(ids: Vec<u32>) -> Tokens {
        Tokens {
            mask: vec![1; ids.len()],
            types: vec![0; ids.len()],
            ids,
        }
    }
}

impl Row for Tokens {
    fn len(&self) -> usize {
        self.ids.len()
    }

    fn values(&self, feed: Feed) -> &[u32] {
        match feed {
            Feed::InputIds => &self.ids,
            Feed::AttentionMask => &self.mask,
            Feed::TokenTypeIds => &self.types,
        }
    }
}

/// The rows of a request's inputs, and how many of them were cut to `max_length`.
pub struct Tokenized {
    pub rows: Vec<Tokens>,
    pub truncated: usize,
}

/// `input` as rows, stopping between inputs once `until` has passed.
pub fn tokenize(text: &Text, input: Input, until: Instant) -> Result<Tokenized, DocError> {
    let spec = text.spec();
    let max = spec.max_length;
    let mut truncated = 0;
    let mut rows = Vec::with_capacity(input.len());
    match input {
        Input::Texts(texts) => {
            for (i, doc) in texts.iter().enumerate() {
                stop_at(Some(until))?;
                let enc = text
                    .encode_one(doc)
                    .map_err(|e| DocError::Bad(format!("`input[{i}]` {e}")))?;
                if enc.len() > max {
                    return Err(DocError::Bad(format!(
                        "`input[{i}]` has {} tokens; this model takes at most {max} (`max_length`) and its truncation is off",
                        enc.len()
                    )));
                }
                truncated += usize::from(!enc.get_overflowing().is_empty());
                rows.push(Tokens {
                    ids: enc.get_ids().to_vec(),
                    mask: enc.get_attention_mask().to_vec(),
                    types: enc.get_type_ids().to_vec(),
                });
            }
        }
        Input::Ids(all) => {
            let vocab = text.vocab_size();
            for (i, mut ids) in all.into_iter().enumerate() {
                stop_at(Some(until))?;
                if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
                    return Err(DocError::Bad(format!(
                        "`input[{i}]` holds token id {id}; this model's vocabulary has {vocab} ids (0 to {})",
                        vocab - 1
                    )));
                }
                if ids.len() > max {
                    if !spec.truncation {
                        return Err(DocError::Bad(format!(
                            "`input[{i}]` has {} tokens; this model takes at most {max} (`max_length`) and its truncation is off",
                            ids.len()
                        )));
                    }
                    ids.truncate(max);
                    truncated += 1;
                }
                rows.push(Tokens::of_ids(ids));
            }
        }
    }
    Ok(Tokenized { rows, truncated })
}
