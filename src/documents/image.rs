//! An `image` block ([`ImageSpec`]): the tensor's size, how an image is resized to it,
//! the normalisation, channels and dtype, and the pixel limits checked from the headers.

use serde_json::{Map, Value};

use super::{max_documents, object, unknown, whole};
use crate::schema::{kind, Dtype};

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
    /// The bytes of one image's tensor: `[3, H, W]` of `dtype` (at its own size the
    /// largest it may be, `max_pixels`).
    pub fn bytes_per_document(&self) -> u64 {
        let [h, w] = self.size.map(u64::from);
        let pixels = match self.resize {
            Resize::Keep => self.max_pixels,
            _ => h * w,
        };
        let element = match self.dtype {
            Dtype::Float64 => 8,
            Dtype::Float32 => 4,
            Dtype::Float16 | Dtype::BFloat16 => 2,
            _ => 1,
        };
        3 * pixels * element
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
            Resize::Stretch | Resize::Keep => u64::MAX,
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
    /// Not resized: each image at its own size (torchvision's detection models resize
    /// inside); `size` is then only the warm-up's image. One request's images must share
    /// a size to be stacked.
    Keep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channels {
    Rgb,
    Bgr,
}

/// The default `max_pixels`: 40 megapixels (a 12-bit camera's largest frame and then some);
/// decoding one takes 120 MB as RGB.
pub const DEFAULT_MAX_PIXELS: u64 = 40_000_000;
/// The largest side of `size` accepted.
pub const MAX_SIDE: u32 = 8192;
/// The default `max_request_pixels`: the pixels one request's images may have together
/// (64 photos of 4 megapixels; decoding them takes one to two seconds of one core).
/// Without it, 64 solid-colour 40-megapixel PNGs (130 kB each, within `max_pixels` and
/// `max_documents`) held a worker for 14–16 s.
pub const DEFAULT_MAX_REQUEST_PIXELS: u64 = 256_000_000;
/// An `image` block at `at`.
pub(super) fn image(at: &str, v: &Value) -> Result<ImageSpec, String> {
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
    let size = size(at, o.get("size"))?;
    let resize = resize(at, o, size)?;
    let dtype = dtype(at, o)?;
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
    let (max_pixels, max_request_pixels) = pixels(at, o)?;
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

/// `size`: the tensor's `[height, width]`, each side 1..=[`MAX_SIDE`]; required.
fn size(at: &str, v: Option<&Value>) -> Result<[u32; 2], String> {
    Ok(match v {
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
    })
}

/// `resize` (`stretch`, `center_crop` or `none`) and the `shorter_side` that goes with the latter.
fn resize(at: &str, o: &Map<String, Value>, size: [u32; 2]) -> Result<Resize, String> {
    let shorter = whole(
        &format!("{at}.shorter_side"),
        o.get("shorter_side"),
        1,
        u64::from(MAX_SIDE),
    )?;
    Ok(match (o.get("resize").and_then(Value::as_str), o.get("resize")) {
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
        (Some("none"), _) if shorter.is_none() => Resize::Keep,
        (Some("none"), _) => {
            return Err(format!(
                "field `{at}.shorter_side` goes with `\"resize\": \"center_crop\"`"
            ))
        }
        (_, Some(v)) => {
            return Err(format!(
                "field `{at}.resize` must be \"stretch\" (to `size`), \"center_crop\" (the shorter side to `shorter_side`, then the centre) or \"none\" (each image at its own size), found {v}"
            ))
        }
    })
}

/// `dtype` (default float32), and no `mean`/`std` with uint8.
fn dtype(at: &str, o: &Map<String, Value>) -> Result<Dtype, String> {
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
    Ok(dtype)
}

/// `max_pixels` (one image) and `max_request_pixels` (one request's images together, at
/// least one image's worth).
fn pixels(at: &str, o: &Map<String, Value>) -> Result<(u64, u64), String> {
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
    Ok((max_pixels, max_request_pixels))
}

/// `mean` or `std` (`at`): three numbers, one per channel (above 0 when `positive`).
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
