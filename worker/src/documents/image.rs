//! Image documents: JPEG or PNG bytes decoded (the `image` crate), resized with libtorch's
//! antialiased bilinear filter (the one ported from Pillow's, which torchvision's `Resize`
//! uses on PIL images), the centre cut as torchvision's `CenterCrop` cuts it, scaled to 0..1
//! and normalised (`mean`, `std`), into `[N, 3, H, W]`. The pixel count is checked from the
//! header before anything is decoded, and decoding is bounded by it: a decompression bomb
//! is a 400, not a worker out of memory.

use std::io::Cursor;

use image::{ImageFormat, ImageReader, Limits};
use tch::{Kind, Tensor};
use vramfork::documents::{Channels, ImageSpec, Resize};
use vramfork::metadata::Dtype;

use crate::args::kind_of;

/// The documents of one request as one tensor, `[blobs, 3, H, W]`.
pub fn batch(spec: &ImageSpec, name: &str, blobs: &[Vec<u8>]) -> Result<Tensor, String> {
    let one = blobs
        .iter()
        .enumerate()
        .map(|(i, b)| decode(spec, b).map_err(|e| format!("input {name}: element {i}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if one.is_empty() {
        let [h, w] = spec.size.map(i64::from);
        return Ok(Tensor::zeros(
            [0, 3, h, w],
            (kind_of(spec.dtype), tch::Device::Cpu),
        ));
    }
    Tensor::f_stack(&one, 0).map_err(|e| format!("input {name}: {e}"))
}

/// One image as `[3, H, W]` of the declared dtype.
pub fn decode(spec: &ImageSpec, bytes: &[u8]) -> Result<Tensor, String> {
    let reader = || {
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
    };
    let (w, h) = reader()?
        .into_dimensions()
        .map_err(|e| format!("cannot read the image's header: {e}"))?;
    let pixels = u64::from(w) * u64::from(h);
    if pixels > spec.max_pixels {
        return Err(format!(
            "the image is {w}×{h} ({pixels} pixels); this input takes at most {} (`max_pixels`)",
            spec.max_pixels
        ));
    }
    let mut r = reader()?;
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
    let pixels = Tensor::from_data_size(rgb.as_raw(), &[h, w, 3], Kind::Uint8)
        .permute([2, 0, 1])
        .unsqueeze(0);
    let [th, tw] = spec.size.map(i64::from);
    let out = match spec.resize {
        Resize::Stretch => resized(&pixels, th, tw),
        Resize::ShorterSideThenCrop(short) => {
            let (nh, nw) = shorter_side(h, w, i64::from(short));
            center_crop(&resized(&pixels, nh, nw), th, tw)
        }
    }
    .squeeze_dim(0);
    let out = match spec.channels {
        Channels::Rgb => out,
        Channels::Bgr => out.flip([0]),
    };
    if spec.dtype == Dtype::UInt8 {
        return Ok(out.to_kind(Kind::Uint8));
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
    Ok(((out / 255.0 - mean) / std).to_kind(kind_of(spec.dtype)))
}

/// Whether a JPEG's last scan (`FF DA`) is followed by an end-of-image marker (`FF D9`):
/// inside the entropy-coded data a `FF` byte is always escaped, so the marker cannot occur
/// there, and a thumbnail's end (in an EXIF block) comes before the image's last scan.
fn jpeg_complete(bytes: &[u8]) -> bool {
    let last = |m: u8| bytes.windows(2).rposition(|w| w == [0xFF, m]);
    matches!((last(0xDA), last(0xD9)), (Some(sos), Some(eoi)) if eoi > sos)
}

/// `[1, 3, h, w]` uint8 resized to `[1, 3, nh, nw]` float holding whole values 0..=255 (as
/// Pillow's resize of an 8-bit image gives).
fn resized(pixels: &Tensor, nh: i64, nw: i64) -> Tensor {
    let size = pixels.size();
    let float = pixels.to_kind(Kind::Float);
    if size[2] == nh && size[3] == nw {
        return float;
    }
    float
        .internal_upsample_bilinear2d_aa([nh, nw], false, None, None)
        .round()
        .clamp(0.0, 255.0)
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
