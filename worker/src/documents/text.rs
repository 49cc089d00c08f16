//! Text documents tokenized with Hugging Face's `tokenizers` (the `tokenizer.json` a model
//! ships): each document encoded with its special tokens, cut to `max_length` (or refused
//! when `truncation` is off), then the request's rows padded together — to its longest
//! document (the batcher pads further when requests share a pass) or to `max_length`.
//!
//! A long document is not tokenized in full to keep its first `max_length` tokens: with
//! truncation on, its first [`FIRST_BYTES_PER_TOKEN`] × `max_length` bytes are, then 4 times
//! as many while those do not show that the kept tokens are final, up to
//! [`TextSpec::max_text_bytes`] ([`Text::encode_one`]); with truncation off, a document
//! longer than that is refused unread.

use tch::{Kind, Tensor};
use tokenizers::{Encoding, PostProcessor, Tokenizer, TruncationParams};
use vramfork::documents::{Feed, Padding, TextSpec};

use crate::args::Arg;

/// Bytes of text per token tokenized first (a long document's first `max_length` × this
/// many bytes): English runs at 4 to 6 bytes a token, CJK at 3 a character.
pub const FIRST_BYTES_PER_TOKEN: usize = 16;
/// The fewest bytes of a long document tokenized first.
const FIRST_BYTES_MIN: usize = 1024;

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
        let added = tokenizer
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        if spec.max_length < added {
            return Err(format!(
                "the tokenizer {} adds {added} special tokens to every document; `max_length` ({}) must leave room for them",
                spec.file.display(),
                spec.max_length
            ));
        }
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

    /// What the metadata declared.
    pub fn spec(&self) -> &TextSpec {
        &self.spec
    }

    /// One document's tokens, cut to `max_length` when truncation is on, reading no more of
    /// it than it takes: a prefix of the text is tokenized, and its first `max_length`
    /// tokens are the whole text's when they all come from words (the pre-tokenizer's
    /// splits) before the prefix's last word — the only one a cut can change — and the
    /// prefix has tokens beyond them. Otherwise a prefix 4 times as long is tried, up to
    /// [`TextSpec::max_text_bytes`]; a text that shows nothing by then (megabytes of
    /// whitespace, one 100-kilobyte word) gives the tokens of that much of it.
    pub fn encode_one(&self, doc: &str) -> Result<Encoding, String> {
        let limit = self.spec.max_text_bytes();
        let encode = |text: &str| {
            self.tokenizer
                .encode(text, true)
                .map_err(|e| format!("cannot be tokenized: {e}"))
        };
        if !self.spec.truncation {
            if doc.len() > limit {
                return Err(format!(
                    "has {} bytes; with truncation off this input takes at most {limit} bytes of text (`max_length` × {})",
                    doc.len(),
                    vramfork::documents::TEXT_BYTES_PER_TOKEN
                ));
            }
            return encode(doc);
        }
        let mut bound = (self.spec.max_length * FIRST_BYTES_PER_TOKEN)
            .max(FIRST_BYTES_MIN)
            .min(limit);
        loop {
            if doc.len() <= bound {
                return encode(doc);
            }
            let mut cut = bound;
            while !doc.is_char_boundary(cut) {
                cut -= 1;
            }
            let enc = encode(&doc[..cut])?;
            if bound >= limit || kept_tokens_are_final(&enc) {
                return Ok(enc);
            }
            bound = bound.saturating_mul(4).min(limit);
        }
    }

    /// The `feeds` tensors for `docs` (int64, `[docs, length]`, padded): with `"longest"`
    /// padding as [`Arg::Padded`] so a batch can pad them further.
    pub fn encode(&self, name: &str, docs: &[String]) -> Result<Vec<Arg>, String> {
        let mut rows = Vec::with_capacity(docs.len());
        for (i, doc) in docs.iter().enumerate() {
            let mut enc = self
                .encode_one(doc)
                .map_err(|e| format!("input {name}: element {i} {e}"))?;
            // What was cut off is not needed (and can be most of the prefix).
            drop(enc.take_overflowing());
            if enc.len() > self.spec.max_length {
                return Err(format!(
                    "input {name}: element {i} has {} tokens; max_length is {} and truncation is off",
                    enc.len(),
                    self.spec.max_length
                ));
            }
            rows.push(enc);
        }
        Ok(self.feeds(&rows))
    }

    /// The `feeds` tensors of tokenized `rows` (int64, `[rows, length]`, padded to the
    /// longest row or to `max_length`): with `"longest"` padding as [`Arg::Padded`] so a
    /// batch can pad them further.
    pub fn feeds<R: Row>(&self, rows: &[R]) -> Vec<Arg> {
        let width = match self.spec.padding {
            Padding::MaxLength => self.spec.max_length,
            Padding::Longest => rows.iter().map(|r| r.len()).max().unwrap_or(0),
        };
        let n = rows.len();
        self.spec
            .feeds
            .iter()
            .map(|&feed| {
                let pad = match feed {
                    Feed::InputIds => self.pad_id,
                    Feed::AttentionMask => 0,
                    Feed::TokenTypeIds => self.pad_type_id,
                };
                let mut flat = vec![pad; n * width];
                for (row, enc) in flat.chunks_mut(width.max(1)).zip(rows) {
                    for (dst, v) in row.iter_mut().zip(enc.values(feed)) {
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
            .collect()
    }

    /// The id its rows are padded with.
    pub fn pad_id(&self) -> i64 {
        self.pad_id
    }

    /// The tokenizer itself, for pair encoding (`pair.rs`).
    pub(super) fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The ids the tokenizer's vocabulary has (its added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
}

/// One tokenized document as the `feeds` take it: its ids, attention mask and token type
/// ids, all of one length.
pub trait Row {
    fn len(&self) -> usize;
    fn values(&self, feed: Feed) -> &[u32];
}

/// A row borrowed is the row (a door's passes take its rows where they lie).
impl<R: Row> Row for &R {
    fn len(&self) -> usize {
        (**self).len()
    }

    fn values(&self, feed: Feed) -> &[u32] {
        (**self).values(feed)
    }
}

impl Row for Encoding {
    fn len(&self) -> usize {
        Encoding::len(self)
    }

    fn values(&self, feed: Feed) -> &[u32] {
        match feed {
            Feed::InputIds => self.get_ids(),
            Feed::AttentionMask => self.get_attention_mask(),
            Feed::TokenTypeIds => self.get_type_ids(),
        }
    }
}

/// Whether the tokens `enc` kept (after truncation) are those the whole text would give:
/// they all come from words before the last word of the prefix that was tokenized (only
/// that word can be changed by what follows the cut), and tokens from a later word exist.
fn kept_tokens_are_final(enc: &Encoding) -> bool {
    let kept = enc.get_word_ids().iter().flatten().max();
    let rest = enc
        .get_overflowing()
        .iter()
        .flat_map(|o| o.get_word_ids().iter().flatten())
        .max();
    match (kept, rest) {
        (Some(k), Some(r)) => r > k,
        // Nothing kept but the special tokens (`max_length` leaves no room for more).
        (None, Some(_)) => true,
        (_, None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::path::Path;

    /// A BERT-style WordPiece `tokenizer.json` (lower-cased, [CLS] … [SEP]) whose vocabulary
    /// is every letter and digit, alone and as a continuation, and some common words.
    fn wordpiece() -> Value {
        let mut vocab = serde_json::Map::new();
        let mut add = |t: String| {
            let id = vocab.len();
            vocab.entry(t).or_insert(json!(id));
        };
        for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] {
            add(t.into());
        }
        for c in ('a'..='z').chain('0'..='9') {
            add(c.to_string());
            add(format!("##{c}"));
        }
        for c in "`~!@#$%^&*()-_=+[]{}|;:'\",.<>/?\\".chars() {
            add(c.to_string());
        }
        for w in "the a of and to in is it that worker model request with for on as are be \
                  not by one its each master gpu cuda memory text image document ##s ##ing ##ed"
            .split_whitespace()
        {
            add(w.into());
        }
        let special = |id: u32, t: &str| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        };
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [special(0, "[PAD]"), special(1, "[UNK]"), special(2, "[CLS]"),
                             special(3, "[SEP]")],
            "normalizer": {"type": "BertNormalizer", "clean_text": true,
                           "handle_chinese_chars": true, "strip_accents": null,
                           "lowercase": true},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {
                    "[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                    "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
            "decoder": null,
            "model": {"type": "WordPiece", "unk_token": "[UNK]",
                      "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                      "vocab": vocab}
        })
    }

    /// A GPT-2-style byte-level BPE `tokenizer.json`: the 256 byte symbols and a few merges.
    fn byte_level() -> Value {
        // GPT-2's bytes_to_unicode.
        let mut bs: Vec<u32> = (u32::from('!')..=u32::from('~'))
            .chain(0xA1..=0xAC)
            .chain(0xAE..=0xFF)
            .collect();
        let mut cs = bs.clone();
        let mut n = 0;
        for b in 0..256 {
            if !bs.contains(&b) {
                bs.push(b);
                cs.push(256 + n);
                n += 1;
            }
        }
        let mut vocab = serde_json::Map::new();
        for c in &cs {
            let id = vocab.len();
            vocab.insert(char::from_u32(*c).unwrap().to_string(), json!(id));
        }
        let merges = [
            ("Ġ", "t"),
            ("h", "e"),
            ("Ġt", "he"),
            ("Ġ", "a"),
            ("i", "n"),
            ("e", "r"),
            ("o", "r"),
            ("Ġ", "w"),
            ("Ġw", "or"),
            ("Ġ", "m"),
            ("Ġ", "s"),
        ];
        for (a, b) in merges {
            let id = vocab.len();
            vocab.entry(format!("{a}{b}")).or_insert(json!(id));
        }
        let merges: Vec<String> = merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
        json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                              "trim_offsets": true, "use_regex": true},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": true,
                               "trim_offsets": false, "use_regex": true},
            "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": merges}
        })
    }

    fn spec(file: &Path, max_length: usize, truncation: bool) -> TextSpec {
        TextSpec {
            file: file.to_path_buf(),
            max_length,
            truncation,
            padding: Padding::Longest,
            feeds: vec![Feed::InputIds, Feed::AttentionMask, Feed::TokenTypeIds],
            pad_id: None,
            max_documents: 64,
        }
    }

    /// What the tokenizer gives for the whole text, then cut to `max_length` (Python's
    /// `tokenizer(text, truncation=True, max_length=…)`).
    fn reference(file: &Path, max_length: usize, text: &str) -> Encoding {
        let mut t = Tokenizer::from_file(file).unwrap();
        t.with_truncation(Some(TruncationParams {
            max_length,
            ..TruncationParams::default()
        }))
        .unwrap();
        t.encode(text, true).unwrap()
    }

    /// English prose with code and tables: the project's own documents.
    fn prose() -> String {
        [
            include_str!("../../../README.md"),
            include_str!("../../../docs/production.md"),
            include_str!("../../../docs/metadata.md"),
        ]
        .concat()
    }

    fn texts() -> Vec<(&'static str, String)> {
        let prose = prose();
        let readme = prose.as_str();
        let mut end = 40_000;
        while !readme.is_char_boundary(end) {
            end -= 1;
        }
        let readme = &readme[..end];
        let spaced = readme[..4000].replace(' ', &" ".repeat(40));
        let cjk = "文档在工作进程中预处理，图像被解码。".repeat(1000);
        let emoji = "ok 🚀🚀 naïve café — ".repeat(1000);
        let late = format!("{}{readme}", "\n".repeat(3000));
        let long_word = format!("{}{readme}", "x".repeat(5000));
        vec![
            ("the docs", readme.to_string()),
            ("spaces 40 times", spaced),
            ("CJK", cjk),
            ("emoji and accents", emoji),
            ("3000 newlines first", late),
            ("a 5000-byte word first", long_word),
        ]
    }

    #[test]
    fn a_long_text_gives_the_tokens_full_tokenization_then_truncation_gives() {
        let dir = tempfile::tempdir().unwrap();
        for (kind, json) in [("wordpiece", wordpiece()), ("byte-level", byte_level())] {
            let file = dir.path().join(format!("{kind}.json"));
            std::fs::write(&file, serde_json::to_vec(&json).unwrap()).unwrap();
            for max_length in [2, 5, 24, 128, 512] {
                let text = Text::load(&spec(&file, max_length, true)).unwrap();
                for (what, doc) in texts() {
                    let got = text.encode_one(&doc).unwrap();
                    let want = reference(&file, max_length, &doc);
                    let at = format!("{kind}, max_length {max_length}, {what}");
                    assert_eq!(got.get_ids(), want.get_ids(), "{at}");
                    assert_eq!(got.get_type_ids(), want.get_type_ids(), "{at}");
                    assert_eq!(got.get_attention_mask(), want.get_attention_mask(), "{at}");
                    assert_eq!(got.get_offsets(), want.get_offsets(), "{at}");
                }
            }
        }
    }

    #[test]
    fn a_huge_text_is_not_tokenized_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("wordpiece.json");
        std::fs::write(&file, serde_json::to_vec(&wordpiece()).unwrap()).unwrap();
        let prose = prose();
        let doc = prose.repeat((31 << 20) / prose.len() + 1);
        assert!(doc.len() > 30 << 20, "{}", doc.len());
        let text = Text::load(&spec(&file, 24, true)).unwrap();
        let got = text.encode_one(&doc).unwrap();
        // What was tokenized, kept and cut off, ends within the first max_length × 1024
        // bytes: the tokens' offsets say how far into the text the tokenizer read.
        let read = std::iter::once(&got)
            .chain(got.get_overflowing())
            .flat_map(|e| e.get_offsets().iter().map(|o| o.1))
            .max()
            .unwrap();
        assert!(
            read > 0 && read <= 24 * 1024,
            "read {read} of {} bytes",
            doc.len()
        );
        let first = reference(&file, 24, &doc[..100_000]);
        assert_eq!(got.get_ids(), first.get_ids());
        // With truncation off, a text over max_length × 1024 bytes is refused unread.
        let strict = Text::load(&spec(&file, 24, false)).unwrap();
        let e = strict.encode_one(&doc).unwrap_err();
        assert!(
            e.contains(&format!("has {} bytes", doc.len()))
                && e.contains("takes at most 24576 bytes of text"),
            "{e}"
        );
        // Under it, tokenized in full (and refused later for its tokens).
        assert!(strict.encode_one(&doc[..20_000]).unwrap().len() > 24);
    }

    #[test]
    fn max_length_must_leave_room_for_the_special_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("wordpiece.json");
        std::fs::write(&file, serde_json::to_vec(&wordpiece()).unwrap()).unwrap();
        let e = Text::load(&spec(&file, 1, true)).err().unwrap();
        assert!(
            e.contains("adds 2 special tokens") && e.contains("`max_length` (1)"),
            "{e}"
        );
    }
}
