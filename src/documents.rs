//! Declared pre-processing of documents (issue 27): a `BYTES` input of the metadata may
//! carry a `tokenizer` block (text the worker tokenizes into `input_ids`,
//! `attention_mask`, `token_type_ids`) or an `image` block (JPEG or PNG the worker decodes,
//! resizes and normalises into `[N, 3, H, W]`). This file owns what the metadata says and
//! its checks, with errors naming the field; the worker does the work (`worker/src/documents`).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::schema::{kind, Dtype};

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

/// An `image` block.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    /// The tensor's `[height, width]`.
    pub size: [u32; 2],
    pub resize: Resize,
    /// Per channel, in the order of `channels`, applied after scaling pixels to 0..1.
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub channels: Channels,
    /// `float32`, `float16`, `bfloat16`, `float64` (scaled and normalised) or `uint8` (the
    /// pixels as they are; `mean` and `std` must then be left out).
    pub dtype: Dtype,
    /// Images with more pixels than this are refused from their header, before decoding.
    pub max_pixels: u64,
    /// The pixels one request's images may have together (all of this input's documents):
    /// more is refused (413) from the headers, before decoding.
    pub max_request_pixels: u64,
    /// Documents one request may carry in this input (more: 413).
    pub max_documents: usize,
}

impl ImageSpec {
    /// The bytes of one image's tensor: `[3, H, W]` of `dtype`.
    pub fn bytes_per_document(&self) -> u64 {
        let [h, w] = self.size.map(u64::from);
        let element = match self.dtype {
            Dtype::Float64 => 8,
            Dtype::Float32 => 4,
            Dtype::Float16 | Dtype::BFloat16 => 2,
            _ => 1,
        };
        3 * h * w * element
    }

    /// Likely unit mistakes in `mean` and `std` (the block at `at`), for a warning at start:
    /// pixels are scaled to 0..1 before they apply (torchvision's `ToTensor()` then
    /// `Normalize`), so a value over [`UNIT_MISTAKE`] — ImageNet's `[123.675, 116.28,
    /// 103.53]` — is most likely in 0–255 units, and would leave every pixel near one value.
    pub fn unit_warnings(&self, at: &str) -> Vec<String> {
        [("mean", self.mean), ("std", self.std)]
            .into_iter()
            .filter(|(_, v)| v.iter().any(|x| x.abs() > UNIT_MISTAKE))
            .map(|(field, v)| {
                let scaled = v.map(|x| (f64::from(x) / 255.0 * 1e4).round() / 1e4);
                format!(
                    "`{at}.{field}` is {v:?}: pixels are scaled to 0..1 before `mean` and `std` apply (as ToTensor() then Normalize), so values over {UNIT_MISTAKE} look like 0-255 units; in 0..1 units that is {scaled:?}"
                )
            })
            .collect()
    }

    /// The most pixels an image resized for `center_crop` (its shorter side to
    /// `shorter_side`, before its centre is cut) may have: `max_pixels`, or 4 ×
    /// `shorter_side`² when that is more (an image of aspect ratio up to 4:1 is never
    /// refused for its resized size). `stretch` resizes to `size`, which is bounded already.
    pub fn max_resized_pixels(&self) -> u64 {
        match self.resize {
            Resize::Stretch => u64::MAX,
            Resize::ShorterSideThenCrop(n) => self.max_pixels.max(4 * u64::from(n).pow(2)),
        }
    }
}

/// A `mean` or `std` value above this (in absolute value) is most likely in 0–255 units
/// ([`ImageSpec::unit_warnings`]).
pub const UNIT_MISTAKE: f32 = 2.0;

/// How an image is brought to `size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resize {
    /// Straight to `size`, aspect ratio not kept.
    Stretch,
    /// The shorter side to this many pixels (aspect kept, the longer side rounded down, as
    /// torchvision's `Resize(n)`), then the centre cut to `size` (torchvision's `CenterCrop`).
    ShorterSideThenCrop(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channels {
    Rgb,
    Bgr,
}

/// The default `max_pixels`: 40 megapixels (a 12-bit camera's largest frame and then some);
/// decoding one takes 120 MB as RGB.
pub const DEFAULT_MAX_PIXELS: u64 = 40_000_000;
/// The largest `max_length` accepted.
pub const MAX_TOKENS_LIMIT: usize = 1 << 16;
/// The largest side of `size` accepted.
pub const MAX_SIDE: u32 = 8192;
/// The default `max_request_pixels`: the pixels one request's images may have together
/// (64 photos of 4 megapixels; decoding them takes one to two seconds of one core).
/// Without it, 64 solid-colour 40-megapixel PNGs (130 kB each, within `max_pixels` and
/// `max_documents`) held a worker for 14–16 s (issue 46).
pub const DEFAULT_MAX_REQUEST_PIXELS: u64 = 256_000_000;
/// The default `max_documents`: documents one request may carry in one input.
pub const DEFAULT_MAX_DOCUMENTS: usize = 64;
/// The largest `max_documents` accepted.
pub const MAX_DOCUMENTS_LIMIT: usize = 4096;
/// The most bytes of tensors the documents of one request may become (all its document
/// inputs together, each document counted at the largest it can be): 1 GiB. A request
/// over it is refused (413) before anything is decoded or tokenized.
pub const MAX_PREPROCESSED_BYTES: u64 = 1 << 30;
/// Bytes of text per token the tokenizer reads at most: a document is tokenized from at
/// most its first `max_length` × this many bytes ([`TextSpec::max_text_bytes`]).
pub const TEXT_BYTES_PER_TOKEN: usize = 1024;

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
        (Some(t), None) => Document::Text(text(&format!("{at}.tokenizer"), t, base)?),
        (None, Some(i)) => Document::Image(image(&format!("{at}.image"), i)?),
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

fn text(at: &str, v: &Value, base: &Path) -> Result<TextSpec, String> {
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
    let feeds = match o.get("feeds") {
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
    };
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

fn three(at: &str, v: Option<&Value>, default: f32, positive: bool) -> Result<[f32; 3], String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok([default; 3]);
    };
    let bad = || {
        format!(
            "field `{at}` must be an array of 3 numbers (one per channel){}, found {v}",
            if positive { ", each above 0" } else { "" }
        )
    };
    let items = v.as_array().filter(|a| a.len() == 3).ok_or_else(bad)?;
    let mut out = [0.0; 3];
    for (o, item) in out.iter_mut().zip(items) {
        let x = item.as_f64().ok_or_else(bad)? as f32;
        if !x.is_finite() || (positive && x <= 0.0) {
            return Err(bad());
        }
        *o = x;
    }
    Ok(out)
}

fn image(at: &str, v: &Value) -> Result<ImageSpec, String> {
    let o = object(at, v)?;
    unknown(
        at,
        o,
        &[
            "size",
            "resize",
            "shorter_side",
            "mean",
            "std",
            "channels",
            "dtype",
            "max_pixels",
            "max_request_pixels",
            "max_documents",
        ],
    )?;
    let size = match o.get("size") {
        Some(Value::Array(a)) if a.len() == 2 => {
            let side = |i: usize| {
                a[i].as_u64()
                    .filter(|n| (1..=u64::from(MAX_SIDE)).contains(n))
                    .map(|n| n as u32)
                    .ok_or_else(|| {
                        format!(
                            "field `{at}.size[{i}]` must be a whole number 1..={MAX_SIDE}, found {}",
                            a[i]
                        )
                    })
            };
            [side(0)?, side(1)?]
        }
        Some(v) => {
            return Err(format!(
                "field `{at}.size` must be [height, width], found {v}"
            ))
        }
        None => return Err(format!("field `{at}.size` is missing ([height, width])")),
    };
    let shorter = whole(
        &format!("{at}.shorter_side"),
        o.get("shorter_side"),
        1,
        u64::from(MAX_SIDE),
    )?;
    let resize = match (o.get("resize").and_then(Value::as_str), o.get("resize")) {
        (_, None) | (_, Some(Value::Null)) | (Some("stretch"), _) => {
            if shorter.is_some() {
                return Err(format!(
                    "field `{at}.shorter_side` goes with `\"resize\": \"center_crop\"`"
                ));
            }
            Resize::Stretch
        }
        (Some("center_crop"), _) => {
            let n = shorter.unwrap_or(u64::from(size[0].max(size[1]))) as u32;
            if n < size[0].min(size[1]) {
                return Err(format!(
                    "field `{at}.shorter_side` ({n}) is smaller than `{at}.size` {size:?}: nothing to cut the centre from"
                ));
            }
            Resize::ShorterSideThenCrop(n)
        }
        (_, Some(v)) => {
            return Err(format!(
                "field `{at}.resize` must be \"stretch\" (to `size`) or \"center_crop\" (the shorter side to `shorter_side`, then the centre), found {v}"
            ))
        }
    };
    let dtype = match o.get("dtype") {
        None | Some(Value::Null) => Dtype::Float32,
        Some(Value::String(s)) => match Dtype::parse(s) {
            Some(
                d @ (Dtype::Float32
                | Dtype::Float16
                | Dtype::BFloat16
                | Dtype::Float64
                | Dtype::UInt8),
            ) => d,
            _ => {
                return Err(format!(
                "field `{at}.dtype` must be \"float32\", \"float16\", \"bfloat16\", \"float64\" or \"uint8\", found \"{s}\""
            ))
            }
        },
        Some(v) => {
            return Err(format!(
                "field `{at}.dtype` must be a string, found {}",
                kind(v)
            ))
        }
    };
    if dtype == Dtype::UInt8 && (o.contains_key("mean") || o.contains_key("std")) {
        return Err(format!(
            "field `{at}`: `mean` and `std` apply to float images; with \"dtype\": \"uint8\" the model gets the pixels as they are"
        ));
    }
    let channels = match o.get("channels") {
        None | Some(Value::Null) => Channels::Rgb,
        Some(Value::String(s)) if s == "RGB" => Channels::Rgb,
        Some(Value::String(s)) if s == "BGR" => Channels::Bgr,
        Some(v) => {
            return Err(format!(
                "field `{at}.channels` must be \"RGB\" or \"BGR\", found {v}"
            ))
        }
    };
    let max_pixels = whole(&format!("{at}.max_pixels"), o.get("max_pixels"), 1, 1 << 32)?
        .unwrap_or(DEFAULT_MAX_PIXELS);
    let max_request_pixels = match whole(
        &format!("{at}.max_request_pixels"),
        o.get("max_request_pixels"),
        1,
        1 << 40,
    )? {
        Some(n) if n < max_pixels => {
            return Err(format!(
                "field `{at}.max_request_pixels` ({n}) is below `{at}.max_pixels` ({max_pixels}): one image could then never be sent; raise it or lower `max_pixels`"
            ))
        }
        Some(n) => n,
        None => DEFAULT_MAX_REQUEST_PIXELS.max(max_pixels),
    };
    Ok(ImageSpec {
        size,
        resize,
        mean: three(&format!("{at}.mean"), o.get("mean"), 0.0, false)?,
        std: three(&format!("{at}.std"), o.get("std"), 1.0, true)?,
        channels,
        dtype,
        max_pixels,
        max_request_pixels,
        max_documents: max_documents(at, o)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for (block, want) in [
            (r#"{"image": {}}"#, "`inputs[0].image.size` is missing"),
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
