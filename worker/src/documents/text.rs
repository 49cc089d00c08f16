//! Text documents tokenized with Hugging Face's `tokenizers` (the `tokenizer.json` a model
//! ships): each document encoded with its special tokens, cut to `max_length` (or refused
//! when `truncation` is off), then the request's rows padded together — to its longest
//! document (the batcher pads further when requests share a pass) or to `max_length`.

use tch::{Kind, Tensor};
use tokenizers::{Tokenizer, TruncationParams};
use vramfork::documents::{Feed, Padding, TextSpec};

use crate::args::Arg;

/// A loaded tokenizer and what the metadata declared for it.
pub struct Text {
    tokenizer: Tokenizer,
    spec: TextSpec,
    pad_id: i64,
    pad_type_id: i64,
}

impl Text {
    /// Reads the tokenizer; `Err` says why it cannot be used.
    pub fn load(spec: &TextSpec) -> Result<Text, String> {
        let mut tokenizer = Tokenizer::from_file(&spec.file)
            .map_err(|e| format!("cannot load the tokenizer {}: {e}", spec.file.display()))?;
        // Its own padding (if the file has one) is replaced by ours; its truncation by
        // `max_length` (or none: then a long document is refused, not cut).
        let own_padding = tokenizer.get_padding().cloned();
        tokenizer.with_padding(None);
        let truncation = spec.truncation.then(|| TruncationParams {
            max_length: spec.max_length,
            ..TruncationParams::default()
        });
        tokenizer
            .with_truncation(truncation)
            .map_err(|e| format!("tokenizer {}: {e}", spec.file.display()))?;
        let pad_id = spec
            .pad_id
            .or(own_padding.as_ref().map(|p| p.pad_id))
            .or_else(|| tokenizer.token_to_id("[PAD]"))
            .or_else(|| tokenizer.token_to_id("<pad>"))
            .unwrap_or(0);
        Ok(Text {
            tokenizer,
            spec: spec.clone(),
            pad_id: pad_id.into(),
            pad_type_id: own_padding.map_or(0, |p| p.pad_type_id.into()),
        })
    }

    /// The `feeds` tensors for `docs` (int64, `[docs, length]`, padded): with `"longest"`
    /// padding as [`Arg::Padded`] so a batch can pad them further.
    pub fn encode(&self, name: &str, docs: &[String]) -> Result<Vec<Arg>, String> {
        let mut rows = Vec::with_capacity(docs.len());
        for (i, doc) in docs.iter().enumerate() {
            let enc = self
                .tokenizer
                .encode(doc.as_str(), true)
                .map_err(|e| format!("input {name}: element {i} cannot be tokenized: {e}"))?;
            if enc.len() > self.spec.max_length {
                return Err(format!(
                    "input {name}: element {i} has {} tokens; max_length is {} and truncation is off",
                    enc.len(),
                    self.spec.max_length
                ));
            }
            rows.push(enc);
        }
        let width = match self.spec.padding {
            Padding::MaxLength => self.spec.max_length,
            Padding::Longest => rows.iter().map(|r| r.len()).max().unwrap_or(0),
        };
        let n = rows.len();
        Ok(self
            .spec
            .feeds
            .iter()
            .map(|&feed| {
                let pad = match feed {
                    Feed::InputIds => self.pad_id,
                    Feed::AttentionMask => 0,
                    Feed::TokenTypeIds => self.pad_type_id,
                };
                let mut flat = vec![pad; n * width];
                for (row, enc) in flat.chunks_mut(width.max(1)).zip(&rows) {
                    let values: &[u32] = match feed {
                        Feed::InputIds => enc.get_ids(),
                        Feed::AttentionMask => enc.get_attention_mask(),
                        Feed::TokenTypeIds => enc.get_type_ids(),
                    };
                    for (dst, v) in row.iter_mut().zip(values) {
                        *dst = i64::from(*v);
                    }
                }
                let t = Tensor::from_slice(&flat).reshape([n as i64, width as i64]);
                debug_assert_eq!(t.kind(), Kind::Int64);
                match self.spec.padding {
                    Padding::Longest => Arg::Padded { tensor: t, pad },
                    Padding::MaxLength => Arg::Tensor(t),
                }
            })
            .collect())
    }
}
