//! Image documents: JPEG or PNG bytes decoded (the `image` crate), resized with libtorch's
//! antialiased bilinear filter on the 8-bit pixels (its port of Pillow's, which torchvision's
//! `Resize` uses on PIL images; rounded to whole levels between its two passes as Pillow
//! rounds), the centre cut as torchvision's `CenterCrop` cuts it, scaled to 0..1 and
//! normalised (`mean`, `std`), into `[N, 3, H, W]`.
//!
//! Memory is bounded before a byte is decoded: the pixel count is read from the header and
//! checked against `max_pixels`, and so is the size the image would be resized to before
//! `center_crop` cuts its centre (a 1,000,000 × 40 strip would otherwise become 256 ×
//! 6,400,000); decoding is limited to the header's size. The whole image is only ever held
//! as 8-bit pixels (3 bytes a pixel, plus what the decoder needs), never as floats: floats
//! are made of the resized image only. A decompression bomb is a 400, not a worker out of
//! memory.

use std::io::Cursor;
use std::time::Instant;

use image::{ImageFormat, ImageReader, Limits};
use tch::{Kind, Tensor};
use vramfork::documents::{Channels, ImageSpec, Resize};
use vramfork::metadata::Dtype;

use super::jpeg::jpeg_complete;
use super::DocError;
use crate::args::{kind_of, tensor_from_bytes};

/// The documents of one request as one tensor, `[blobs, 3, H, W]`. Their pixels together
/// are checked against `max_request_pixels` from the headers, before anything is decoded
/// (413); decoding stops between images once `until` has passed.
pub fn batch(
    spec: &ImageSpec,
    name: &str,
    blobs: &[Vec<u8>],
    until: Option<Instant>,
) -> Result<Tensor, DocError> {
    let at = |i: usize| move |e: String| DocError::Bad(format!("input {name}: element {i}: {e}"));
    let sizes = blobs
        .iter()
        .enumerate()
        .map(|(i, b)| sized(spec, b).map_err(at(i)))
        .collect::<Result<Vec<_>, _>>()?;
    let total: u64 = sizes.iter().map(Sized::pixels).sum();
    if total > spec.max_request_pixels {
        return Err(DocError::TooLarge(format!(
            "input {name}: its {} images have {total} pixels together; one request may decode at most {} (`max_request_pixels`): send them in several requests, or smaller",
            blobs.len(),
            spec.max_request_pixels
        )));
    }
    if spec.resize == Resize::Keep {
        one_size(name, &sizes)?;
    }
    let mut one = Vec::with_capacity(blobs.len());
    for (i, (b, size)) in blobs.iter().zip(sizes).enumerate() {
        super::stop_at(until)?;
        one.push(decode_sized(spec, b, size).map_err(at(i))?);
    }
    if one.is_empty() {
        let [h, w] = spec.size.map(i64::from);
        return Ok(Tensor::zeros(
            [0, 3, h, w],
            (kind_of(spec.dtype), tch::Device::Cpu),
        ));
    }
    Tensor::f_stack(&one, 0).map_err(|e| DocError::Bad(format!("input {name}: {e}")))
}

/// Images kept at their own size are stacked into one tensor only when they share it: a
/// request's images of several sizes are refused (400), naming them.
fn one_size(name: &str, sizes: &[Sized]) -> Result<(), DocError> {
    let Some(first) = sizes.first() else {
        return Ok(());
    };
    match sizes.iter().position(|z| (z.w, z.h) != (first.w, first.h)) {
        None => Ok(()),
        Some(i) => Err(DocError::Bad(format!(
            "input {name}: element 0 is {}×{} and element {i} is {}×{}: this model takes each image at its own size, so one request's images must be of one size (send the others in their own requests)",
            first.w, first.h, sizes[i].w, sizes[i].h
        ))),
    }
}

/// One image as `[3, H, W]` of the declared dtype.
#[cfg(test)]
pub fn decode(spec: &ImageSpec, bytes: &[u8]) -> Result<Tensor, String> {
    decode_sized(spec, bytes, sized(spec, bytes)?)
}

/// A JPEG or PNG image's width and height, from its header.
fn header(bytes: &[u8]) -> Result<(u32, u32), String> {
    reader(bytes)?
        .into_dimensions()
        .map_err(|e| format!("cannot read the image's header: {e}"))
}

/// A reader of `bytes` when they are a JPEG or PNG image; else why not.
fn reader(bytes: &[u8]) -> Result<ImageReader<Cursor<&[u8]>>, String> {
    let r = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| e.to_string())?;
    match r.format() {
        Some(ImageFormat::Jpeg | ImageFormat::Png) => Ok(r),
        Some(f) => Err(format!(
            "{} images are not supported (JPEG and PNG are)",
            f.extensions_str()
                .first()
                .unwrap_or(&"this kind of")
                .to_uppercase()
        )),
        None => Err(format!(
            "not a JPEG or PNG image ({} bytes starting with {})",
            bytes.len(),
            bytes[..bytes.len().min(8)]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        )),
    }
}

/// What an image's header allows: its size and the size it is resized to before its
/// centre is cut, both checked against the spec's bounds (nothing decoded yet).
#[derive(Clone, Copy)]
struct Sized {
    w: u32,
    h: u32,
    nh: i64,
    nw: i64,
}

impl Sized {
    fn pixels(&self) -> u64 {
        u64::from(self.w) * u64::from(self.h)
    }
}

/// An image's [`Sized`] from its header, or why it is refused.
fn sized(spec: &ImageSpec, bytes: &[u8]) -> Result<Sized, String> {
    let (w, h) = header(bytes)?;
    let pixels = u64::from(w) * u64::from(h);
    if pixels > spec.max_pixels {
        return Err(format!(
            "the image is {w}×{h} ({pixels} pixels); this input takes at most {} (`max_pixels`)",
            spec.max_pixels
        ));
    }
    let [th, tw] = spec.size.map(i64::from);
    let (nh, nw) = match spec.resize {
        Resize::Stretch => (th, tw),
        Resize::Keep => (i64::from(h), i64::from(w)),
        Resize::ShorterSideThenCrop(short) => {
            let (nh, nw) = shorter_side(i64::from(h), i64::from(w), i64::from(short));
            let resized = (nh as u64).saturating_mul(nw as u64);
            if resized > spec.max_resized_pixels() {
                return Err(format!(
                    "the image is {w}×{h}: with its shorter side resized to {short} pixels it would be {nw}×{nh} ({resized} pixels) before its centre is cut, more than this input takes ({}: `max_pixels`, or 4 × `shorter_side`² when that is more)",
                    spec.max_resized_pixels()
                ));
            }
            (nh, nw)
        }
    };
    Ok(Sized { w, h, nh, nw })
}

/// [`decode`] for an image already [`sized`].
fn decode_sized(spec: &ImageSpec, bytes: &[u8], z: Sized) -> Result<Tensor, String> {
    let Sized { w, h, nh, nw } = z;
    let pixels = z.pixels();
    let [th, tw] = spec.size.map(i64::from);
    let mut r = reader(bytes)?;
    if r.format() == Some(ImageFormat::Jpeg) && !jpeg_complete(bytes) {
        // The decoder would fill the missing part with grey and say nothing (Pillow refuses
        // such a file: "image file is truncated").
        return Err("the JPEG is cut short: no end-of-image marker after its image data".into());
    }
    let mut limits = Limits::default();
    limits.max_image_width = Some(w);
    limits.max_image_height = Some(h);
    // RGBA at 16 bits a channel, the largest a PNG decodes to, and the RGB copy.
    limits.max_alloc = Some(pixels * 11 + (1 << 20));
    r.limits(limits);
    let rgb = r
        .decode()
        .map_err(|e| format!("cannot decode the image: {e}"))?
        .into_rgb8();
    let (w, h) = (i64::from(rgb.width()), i64::from(rgb.height()));
    let pixels = tensor_from_bytes(rgb.as_raw(), &[h, w, 3], Kind::Uint8)
        .map_err(|e| format!("cannot make the image's tensor: {e}"))?
        .permute([2, 0, 1])
        .unsqueeze(0);
    drop(rgb);
    let out = match spec.resize {
        Resize::Stretch => resized(&pixels, th, tw),
        Resize::ShorterSideThenCrop(_) => center_crop(&resized(&pixels, nh, nw), th, tw),
        Resize::Keep => pixels.shallow_clone(),
    };
    drop(pixels);
    let out = out.squeeze_dim(0);
    let out = match spec.channels {
        Channels::Rgb => out,
        Channels::Bgr => out.flip([0]),
    };
    if spec.dtype == Dtype::UInt8 {
        return Ok(out.contiguous());
    }
    let mean = Tensor::from_slice(&spec.mean).view([3, 1, 1]);
    let std = Tensor::from_slice(&spec.std).view([3, 1, 1]);
    let mean = match spec.channels {
        Channels::Rgb => mean,
        Channels::Bgr => mean.flip([0]),
    };
    let std = match spec.channels {
        Channels::Rgb => std,
        Channels::Bgr => std.flip([0]),
    };
    Ok(((out.to_kind(Kind::Float) / 255.0 - mean) / std).to_kind(kind_of(spec.dtype)))
}

/// `[1, 3, h, w]` uint8 resized to `[1, 3, nh, nw]` uint8 with libtorch's antialiased
/// bilinear filter, one axis at a time (a pass that keeps its axis's size is skipped, as
/// libtorch skips it). libtorch resizes the width first; here the order is the one whose
/// intermediate image is smaller, so that stretching a tall strip to a wide `size` never
/// holds the strip at the new width (`min(h × nw, nh × w)` is at most √(pixels × nh × nw)).
fn resized(pixels: &Tensor, nh: i64, nw: i64) -> Tensor {
    let size = pixels.size();
    let (h, w) = (size[2], size[3]);
    let pass = |t: &Tensor, oh: i64, ow: i64| {
        t.internal_upsample_bilinear2d_aa([oh, ow], false, None, None)
    };
    match (h == nh, w == nw) {
        (true, true) => pixels.shallow_clone(),
        (true, false) | (false, true) => pass(pixels, nh, nw),
        (false, false) if h * nw <= nh * w => pass(&pass(pixels, h, nw), nh, nw),
        (false, false) => pass(&pass(pixels, nh, w), nh, nw),
    }
}

/// torchvision's `Resize(n)` size for an `h`×`w` image: the shorter side `n`, the longer
/// `int(n * long / short)` (`_compute_resized_output_size`).
pub fn shorter_side(h: i64, w: i64, n: i64) -> (i64, i64) {
    let (short, long) = if w <= h { (w, h) } else { (h, w) };
    let new_long = (n as f64 * long as f64 / short as f64) as i64;
    if w <= h {
        (new_long, n)
    } else {
        (n, new_long)
    }
}

/// torchvision's `CenterCrop`: the offsets `round((size - crop) / 2)` (Python's rounding,
/// half to even); an image smaller than the crop is padded with zeros first, as it pads.
fn center_crop(img: &Tensor, th: i64, tw: i64) -> Tensor {
    let size = img.size();
    let (h, w) = (size[2], size[3]);
    let img = if th > h || tw > w {
        let (ph, pw) = ((th - h).max(0), (tw - w).max(0));
        img.constant_pad_nd([pw / 2, (pw + 1) / 2, ph / 2, (ph + 1) / 2])
    } else {
        img.shallow_clone()
    };
    let size = img.size();
    let (h, w) = (size[2], size[3]);
    let top = ((h - th) as f64 / 2.0).round_ties_even() as i64;
    let left = ((w - tw) as f64 / 2.0).round_ties_even() as i64;
    img.narrow(2, top, th).narrow(3, left, tw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_torchvision() {
        // Resize(256) of a 500×375 (h×w) image: the shorter side 256, int(256*500/375)=341.
        assert_eq!(shorter_side(500, 375, 256), (341, 256));
        assert_eq!(shorter_side(375, 500, 256), (256, 341));
        assert_eq!(shorter_side(300, 300, 224), (224, 224));
        let t = Tensor::arange(5 * 6, (Kind::Float, tch::Device::Cpu)).view([1, 1, 5, 6]);
        // (5-2)/2 = 1.5 → 2 (half to even), (6-3)/2 = 1.5 → 2.
        let c = center_crop(&t, 2, 3);
        assert_eq!(c.size(), [1, 1, 2, 3]);
        assert_eq!(c.double_value(&[0, 0, 0, 0]), (2 * 6 + 2) as f64);
        // (6-1)/2 = 2.5 → 2.
        let c = center_crop(&t, 1, 1);
        assert_eq!(c.double_value(&[0, 0, 0, 0]), (2 * 6 + 2) as f64);
        // Smaller than the crop: padded with zeros around.
        assert_eq!(center_crop(&t, 7, 6).size(), [1, 1, 7, 6]);
    }

    #[test]
    fn bad_bytes_and_bombs_are_refused_before_decoding() {
        let spec = ImageSpec {
            size: [4, 4],
            resize: Resize::Stretch,
            mean: [0.0; 3],
            std: [1.0; 3],
            channels: Channels::Rgb,
            dtype: Dtype::Float32,
            max_pixels: 100,
            max_request_pixels: 100,
            max_documents: 4,
        };
        let e = decode(&spec, b"hello").unwrap_err();
        assert!(e.contains("not a JPEG or PNG image"), "{e}");
        // A PNG header claiming 30,000 × 30,000 and nothing after it.
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend(30_000u32.to_be_bytes());
        png.extend(30_000u32.to_be_bytes());
        png.extend([8, 2, 0, 0, 0]);
        let crc = crc32(&png[12..]);
        png.extend(crc.to_be_bytes());
        let idat_at = png.len() + 4;
        png.extend(2u32.to_be_bytes());
        png.extend(b"IDAT\x78\x9c");
        png.extend(crc32(&png[idat_at..]).to_be_bytes());
        let e = decode(&spec, &png).unwrap_err();
        assert!(e.contains("30000×30000 (900000000 pixels)"), "{e}");
        // A real 2×3 PNG of one colour decodes, stretched to 4×4.
        let mut buf = Vec::new();
        image::RgbImage::from_pixel(3, 2, image::Rgb([255, 0, 51]))
            .write_to(&mut Cursor::new(&mut buf), ImageFormat::Png)
            .unwrap();
        let t = decode(&spec, &buf).unwrap();
        assert_eq!(t.size(), [3, 4, 4]);
        assert!((t.double_value(&[0, 3, 3]) - 1.0).abs() < 1e-6);
        assert!((t.double_value(&[2, 0, 0]) - 0.2).abs() < 1e-6);
        let bgr = decode(
            &ImageSpec {
                channels: Channels::Bgr,
                ..spec.clone()
            },
            &buf,
        )
        .unwrap();
        assert!((bgr.double_value(&[2, 1, 1]) - 1.0).abs() < 1e-6);
        // Cut short: a 400's message, not a panic.
        let e = decode(&spec, &buf[..buf.len() / 2]).unwrap_err();
        assert!(e.contains("cannot decode the image"), "{e}");
    }

    #[test]
    fn images_kept_at_their_own_size_stack_only_when_they_share_it() {
        let png = |w: u32, h: u32| {
            let mut out = Vec::new();
            image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 200]))
                .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
                .unwrap();
            out
        };
        let spec = ImageSpec {
            size: [8, 8],
            resize: Resize::Keep,
            mean: [0.0; 3],
            std: [1.0; 3],
            ..imagenet()
        };
        let t = batch(&spec, "data", &[png(5, 3), png(5, 3)], None).unwrap();
        assert_eq!(t.size(), [2, 3, 3, 5]);
        // ToTensor(): the pixels scaled to 0..1, nothing else.
        assert_eq!(
            f32::try_from(t.get(0).get(2).get(1).get(4)).unwrap(),
            200.0 / 255.0
        );
        let Err(DocError::Bad(e)) = batch(&spec, "data", &[png(5, 3), png(3, 5)], None) else {
            panic!("two sizes stacked")
        };
        assert!(
            e.contains("element 0 is 5×3 and element 1 is 3×5")
                && e.contains("must be of one size"),
            "{e}"
        );
    }

    /// A PNG header claiming `w`×`h` and the start of its image data, nothing more.
    fn png_header(w: u32, h: u32) -> Vec<u8> {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend(w.to_be_bytes());
        png.extend(h.to_be_bytes());
        png.extend([8, 2, 0, 0, 0]);
        let crc = crc32(&png[12..]);
        png.extend(crc.to_be_bytes());
        let idat_at = png.len() + 4;
        png.extend(2u32.to_be_bytes());
        png.extend(b"IDAT\x78\x9c");
        png.extend(crc32(&png[idat_at..]).to_be_bytes());
        png
    }

    fn imagenet() -> ImageSpec {
        ImageSpec {
            size: [224, 224],
            resize: Resize::ShorterSideThenCrop(256),
            mean: [0.0; 3],
            std: [1.0; 3],
            channels: Channels::Rgb,
            dtype: Dtype::Float32,
            max_pixels: vramfork::documents::DEFAULT_MAX_PIXELS,
            max_request_pixels: vramfork::documents::DEFAULT_MAX_REQUEST_PIXELS,
            max_documents: 4,
        }
    }

    #[test]
    fn extreme_aspect_ratios_are_refused_for_their_resized_size() {
        // 1,000,000 × 40 is within max_pixels, but resized to a shorter side of 256 it would
        // be 6,400,000 × 256: refused from the header.
        let e = decode(&imagenet(), &png_header(1_000_000, 40)).unwrap_err();
        assert!(
            e.contains("the image is 1000000×40")
                && e.contains("6400000×256 (1638400000 pixels)")
                && e.contains("more than this input takes (40000000"),
            "{e}"
        );
        // A strip of 50:1 (within the bound) is decoded and cut, as torchvision would.
        let mut buf = Vec::new();
        image::RgbImage::from_fn(2000, 40, |x, _| image::Rgb([(x % 256) as u8, 7, 200]))
            .write_to(&mut Cursor::new(&mut buf), ImageFormat::Png)
            .unwrap();
        let t = decode(&imagenet(), &buf).unwrap();
        assert_eq!(t.size(), [3, 224, 224]);
        assert!((t.double_value(&[1, 100, 100]) - 7.0 / 255.0).abs() < 1e-6);
        // Stretch never refuses for the resized size: it is `size`.
        let stretch = ImageSpec {
            resize: Resize::Stretch,
            ..imagenet()
        };
        assert_eq!(decode(&stretch, &buf).unwrap().size(), [3, 224, 224]);
    }

    #[test]
    fn resizing_one_axis_at_a_time_is_libtorchs_resize() {
        let x = Tensor::randint(256, [1, 3, 90, 70], (Kind::Uint8, tch::Device::Cpu));
        let one = |h, w| x.internal_upsample_bilinear2d_aa([h, w], false, None, None);
        // Width first (libtorch's own order, taken when its intermediate is the smaller),
        // or one axis only: the same levels.
        for (h, w) in [(200, 100), (120, 50), (90, 30), (200, 70)] {
            let got = resized(&x, h, w);
            assert_eq!(got.kind(), Kind::Uint8);
            assert!(got.equal(&one(h, w)), "{h}×{w}");
        }
        // Height first (a smaller intermediate): within a level of it.
        for (h, w) in [(40, 300), (60, 60), (30, 300)] {
            let got = resized(&x, h, w).to_kind(Kind::Int);
            let want = one(h, w).to_kind(Kind::Int);
            assert!((got - want).abs().max().int64_value(&[]) <= 1, "{h}×{w}");
        }
    }

    #[test]
    fn jpegs_are_complete_at_their_end_of_image_marker_whatever_follows() {
        let mut jpeg = Vec::new();
        image::RgbImage::from_fn(64, 48, |x, y| image::Rgb([x as u8 * 4, y as u8 * 5, 9]))
            .write_to(&mut Cursor::new(&mut jpeg), ImageFormat::Jpeg)
            .unwrap();
        assert!(jpeg_complete(&jpeg));
        // A motion photo: a video after the image, with bytes that look like markers.
        let mut motion = jpeg.clone();
        motion.extend(b"\0\0\0\x18ftypmp42\xff\xda\x00\x0c\x03\x01\x00\xff\xd8junk");
        assert!(jpeg_complete(&motion));
        let spec = ImageSpec {
            size: [48, 64],
            resize: Resize::Stretch,
            dtype: Dtype::UInt8,
            ..imagenet()
        };
        assert!(decode(&spec, &jpeg)
            .unwrap()
            .equal(&decode(&spec, &motion).unwrap()));
        // Cut anywhere inside its data: incomplete.
        for cut in [2, 20, jpeg.len() / 2, jpeg.len() - 2, jpeg.len() - 1] {
            assert!(!jpeg_complete(&jpeg[..cut]), "cut at {cut}");
        }
        assert!(!jpeg_complete(b"not a jpeg"));
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
}
