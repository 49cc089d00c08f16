//! Declared pre-processing of documents: a `BYTES` input of the metadata may
//! carry a `tokenizer` block (text the worker tokenizes into `input_ids`,
//! `attention_mask`, `token_type_ids`) or an `image` block (JPEG or PNG the worker decodes,
//! resizes and normalises into `[N, 3, H, W]`). These files own what the metadata says and
//! its checks, with errors naming the field; the worker does the work (`worker/src/documents`).
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | [`Document`], the per-request limits, which block an input has, the checks both blocks use |
//! | `text.rs` | the `tokenizer` block ([`TextSpec`]) |
//! | `image.rs` | the `image` block ([`ImageSpec`]) |

mod image;
mod text;

use std::path::Path;

use serde_json::{Map, Value};

use crate::schema::kind;
pub use image::{
    Channels, ImageSpec, Resize, DEFAULT_MAX_PIXELS, DEFAULT_MAX_REQUEST_PIXELS, MAX_SIDE,
    UNIT_MISTAKE,
};
pub use text::{Feed, Padding, TextSpec, MAX_TOKENS_LIMIT, TEXT_BYTES_PER_TOKEN};

/// What a document input becomes before `forward`.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    Text(TextSpec),
    Image(ImageSpec),
}

/// The refusal (413) of a request with `n` documents in input `name`, which takes at most
/// `max`: the same words whether the parser counted them or the pre-processing did.
pub fn too_many(name: &str, n: usize, max: usize) -> String {
    format!(
        "input {name}: {n} documents in one request; this input takes at most {max} (`max_documents`): send them in several requests"
    )
}

impl Document {
    /// Documents one request may carry in this input.
    pub fn max_documents(&self) -> usize {
        match self {
            Document::Text(t) => t.max_documents,
            Document::Image(i) => i.max_documents,
        }
    }
}

/// The default `max_documents`: documents one request may carry in one input.
pub const DEFAULT_MAX_DOCUMENTS: usize = 64;
/// The largest `max_documents` accepted.
pub const MAX_DOCUMENTS_LIMIT: usize = 4096;
/// The most bytes of tensors the documents of one request may become (all its document
/// inputs together, each document counted at the largest it can be): 1 GiB. A request
/// over it is refused (413) before anything is decoded or tokenized.
pub const MAX_PREPROCESSED_BYTES: u64 = 1 << 30;
/// `max_documents` of the block at `at` (default [`DEFAULT_MAX_DOCUMENTS`]).
fn max_documents(at: &str, o: &Map<String, Value>) -> Result<usize, String> {
    Ok(whole(
        &format!("{at}.max_documents"),
        o.get("max_documents"),
        1,
        MAX_DOCUMENTS_LIMIT as u64,
    )?
    .map_or(DEFAULT_MAX_DOCUMENTS, |n| n as usize))
}

/// The document block of `inputs[i]` (`at` names it, e.g. `inputs[0]`), if it has one;
/// `base` is the metadata's folder.
pub fn parse(
    at: &str,
    o: &Map<String, Value>,
    is_bytes: bool,
    base: &Path,
) -> Result<Option<Document>, String> {
    let doc = match (o.get("tokenizer"), o.get("image")) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(format!(
                "field `{at}` has both `tokenizer` and `image`; an input is text or an image"
            ))
        }
        (Some(t), None) => Document::Text(text::text(&format!("{at}.tokenizer"), t, base)?),
        (None, Some(i)) => Document::Image(image::image(&format!("{at}.image"), i)?),
    };
    if !is_bytes {
        let block = match doc {
            Document::Text(_) => "tokenizer",
            Document::Image(_) => "image",
        };
        return Err(format!(
            "field `{at}.{block}` needs `{at}.datatype` \"BYTES\" (clients send the documents; the model gets the tensors)"
        ));
    }
    Ok(Some(doc))
}

/// The block at `at` as an object.
fn object<'a>(at: &str, v: &'a Value) -> Result<&'a Map<String, Value>, String> {
    match v {
        Value::Object(o) => Ok(o),
        other => Err(format!(
            "field `{at}` must be an object, found {}",
            kind(other)
        )),
    }
}

/// Refuses a key of the block at `at` that is not one of `known`: a near miss of one as a
/// typo of it (`crate::near_miss`), any other as not known.
fn unknown(at: &str, o: &Map<String, Value>, known: &[&str]) -> Result<(), String> {
    crate::near_miss::check(at, o, known, &[])?;
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "field `{at}.{k}` is not known; `{at}` takes {}",
            known.join(", ")
        )),
        None => Ok(()),
    }
}

/// A whole number `min..=max` at `at`, when given.
fn whole(at: &str, v: Option<&Value>, min: u64, max: u64) -> Result<Option<u64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| (min..=max).contains(n))
            .map(Some)
            .ok_or_else(|| format!("field `{at}` must be a whole number {min}..={max}, found {v}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Dtype;

    fn parse_json(block: &str, bytes: bool) -> Result<Option<Document>, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tok.json"), "{}").unwrap();
        let v: Value = serde_json::from_str(block).unwrap();
        parse("inputs[0]", v.as_object().unwrap(), bytes, dir.path())
    }

    #[test]
    fn text_blocks_take_defaults_and_name_bad_fields() {
        let Some(Document::Text(t)) = parse_json(
            r#"{"tokenizer": {"file": "tok.json", "max_length": 8}}"#,
            true,
        )
        .unwrap() else {
            panic!("not text")
        };
        assert_eq!(t.max_length, 8);
        assert!(t.truncation);
        assert_eq!(t.padding, Padding::Longest);
        assert_eq!(t.feeds, [Feed::InputIds, Feed::AttentionMask]);
        assert!(t.file.ends_with("tok.json"));
        assert_eq!(t.max_documents, DEFAULT_MAX_DOCUMENTS);
        assert_eq!(t.bytes_per_document(), 2 * 8 * 8);
        assert_eq!(t.max_text_bytes(), 8 * TEXT_BYTES_PER_TOKEN);
        for (block, want) in [
            (
                r#"{"tokenizer": {"file": "tok.json"}}"#,
                "`inputs[0].tokenizer.max_length` is missing",
            ),
            (
                r#"{"tokenizer": {"file": "nope.json", "max_length": 8}}"#,
                "`inputs[0].tokenizer.file`",
            ),
            (
                r#"{"tokenizer": {"file": "tok.json", "max_length": 0}}"#,
                "`inputs[0].tokenizer.max_length` must be a whole number 1..=",
            ),
            (
                r#"{"tokenizer": {"file": "tok.json", "max_length": 8, "padding": "left"}}"#,
                "`inputs[0].tokenizer.padding`",
            ),
            (
                r#"{"tokenizer": {"file": "tok.json", "max_length": 8, "feeds": ["input_ids", "input_ids"]}}"#,
                "listed twice",
            ),
            (
                r#"{"tokenizer": {"file": "tok.json", "max_length": 8, "feeds": ["ids"]}}"#,
                "`inputs[0].tokenizer.feeds[0]`",
            ),
            (
                r#"{"tokenizer": {"file": "tok.json", "max_length": 8, "max_documents": 0}}"#,
                "`inputs[0].tokenizer.max_documents` must be a whole number 1..=4096",
            ),
            (
                r#"{"tokenizer": {"file": "tok.json", "max_length": 8, "lower": true}}"#,
                "`inputs[0].tokenizer.lower` is not known",
            ),
            (
                r#"{"tokenizer": {"file": "tok.json", "max_length": 8}, "image": {"size": [2, 2]}}"#,
                "both `tokenizer` and `image`",
            ),
        ] {
            let e = parse_json(block, true).unwrap_err();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
        let e = parse_json(
            r#"{"tokenizer": {"file": "tok.json", "max_length": 8}}"#,
            false,
        )
        .unwrap_err();
        assert!(e.contains("needs `inputs[0].datatype` \"BYTES\""), "{e}");
    }

    #[test]
    fn image_blocks_take_defaults_and_name_bad_fields() {
        let Some(Document::Image(i)) = parse_json(
            r#"{"image": {"size": [224, 224], "resize": "center_crop", "shorter_side": 256,
                          "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}"#,
            true,
        )
        .unwrap() else {
            panic!("not an image")
        };
        assert_eq!(i.size, [224, 224]);
        assert_eq!(i.resize, Resize::ShorterSideThenCrop(256));
        assert_eq!((i.dtype, i.channels), (Dtype::Float32, Channels::Rgb));
        assert_eq!(i.max_pixels, DEFAULT_MAX_PIXELS);
        assert_eq!(i.max_documents, DEFAULT_MAX_DOCUMENTS);
        assert_eq!(i.bytes_per_document(), 3 * 224 * 224 * 4);
        // 4 × 256² is less than the default max_pixels.
        assert_eq!(i.max_resized_pixels(), DEFAULT_MAX_PIXELS);
        let Some(Document::Image(i)) = parse_json(
            r#"{"image": {"size": [8, 8], "resize": "center_crop", "shorter_side": 100,
                          "max_pixels": 1000, "dtype": "uint8", "max_documents": 3}}"#,
            true,
        )
        .unwrap() else {
            panic!("not an image")
        };
        assert_eq!((i.max_documents, i.max_resized_pixels()), (3, 40_000));
        assert_eq!(i.bytes_per_document(), 3 * 8 * 8);
        let Some(Document::Image(i)) = parse_json(r#"{"image": {"size": [4, 6]}}"#, true).unwrap()
        else {
            panic!("not an image")
        };
        assert_eq!(
            (i.resize, i.mean, i.std),
            (Resize::Stretch, [0.0; 3], [1.0; 3])
        );
        let Some(Document::Image(i)) =
            parse_json(r#"{"image": {"size": [4, 6], "resize": "none"}}"#, true).unwrap()
        else {
            panic!("not an image")
        };
        assert_eq!(i.resize, Resize::Keep);
        // At its own size an image is as large as `max_pixels` allows.
        assert_eq!(i.bytes_per_document(), 3 * DEFAULT_MAX_PIXELS * 4);
        for (block, want) in [
            (r#"{"image": {}}"#, "`inputs[0].image.size` is missing"),
            (
                r#"{"image": {"size": [3, 3], "resize": "none", "shorter_side": 4}}"#,
                "goes with",
            ),
            (
                r#"{"image": {"size": [0, 3]}}"#,
                "`inputs[0].image.size[0]`",
            ),
            (
                r#"{"image": {"size": [3, 3], "std": [1, 0, 1]}}"#,
                "`inputs[0].image.std`",
            ),
            (
                r#"{"image": {"size": [3, 3], "mean": [1, 1]}}"#,
                "`inputs[0].image.mean`",
            ),
            (
                r#"{"image": {"size": [3, 3], "resize": "fit"}}"#,
                "`inputs[0].image.resize`",
            ),
            (
                r#"{"image": {"size": [9, 9], "resize": "center_crop", "shorter_side": 4}}"#,
                "smaller than",
            ),
            (
                r#"{"image": {"size": [3, 3], "shorter_side": 4}}"#,
                "goes with",
            ),
            (
                r#"{"image": {"size": [3, 3], "dtype": "int64"}}"#,
                "`inputs[0].image.dtype`",
            ),
            (
                r#"{"image": {"size": [3, 3], "dtype": "uint8", "mean": [0, 0, 0]}}"#,
                "pixels as they are",
            ),
            (
                r#"{"image": {"size": [3, 3], "channels": "RGBA"}}"#,
                "`inputs[0].image.channels`",
            ),
            (
                r#"{"image": {"size": [3, 3], "max_documents": 5000}}"#,
                "`inputs[0].image.max_documents` must be a whole number 1..=4096, found 5000",
            ),
            (
                r#"{"image": {"size": [3, 3], "max_pixels": 0}}"#,
                "`inputs[0].image.max_pixels`",
            ),
        ] {
            let e = parse_json(block, true).unwrap_err();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }

    #[test]
    fn mean_and_std_in_0_255_units_are_warned_of_naming_the_field() {
        let image = |block: &str| match parse_json(block, true).unwrap() {
            Some(Document::Image(i)) => i,
            _ => panic!("not an image"),
        };
        // ImageNet's in 0..1 units, the defaults, and 0.5/0.5: nothing to say.
        for block in [
            r#"{"image": {"size": [8, 8], "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}"#,
            r#"{"image": {"size": [8, 8]}}"#,
            r#"{"image": {"size": [8, 8], "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}"#,
            r#"{"image": {"size": [8, 8], "mean": [-1.5, 0, 2], "std": [2, 1, 1]}}"#,
        ] {
            assert!(
                image(block).unit_warnings("inputs[0].image").is_empty(),
                "{block}"
            );
        }
        // ImageNet's in 0-255 units: both named, with the values in 0..1 units.
        let w = image(
            r#"{"image": {"size": [8, 8], "mean": [123.675, 116.28, 103.53], "std": [58.395, 57.12, 57.375]}}"#,
        )
        .unit_warnings("inputs[1].image");
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("`inputs[1].image.mean` is [123.675, 116.28, 103.53]")
                && w[0].contains("0-255 units")
                && w[0].contains("[0.485, 0.456, 0.406]"),
            "{}",
            w[0]
        );
        assert!(
            w[1].starts_with("`inputs[1].image.std` is [58.395, 57.12, 57.375]")
                && w[1].contains("[0.229, 0.224, 0.225]"),
            "{}",
            w[1]
        );
        // One channel is enough.
        let w = image(r#"{"image": {"size": [8, 8], "std": [1, 1, 255]}}"#)
            .unit_warnings("inputs[0].image");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("`inputs[0].image.std`"), "{}", w[0]);
    }
}
