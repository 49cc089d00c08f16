//! `image_segmenter`'s post-processing, as TorchServe's `ImageSegmenter.postprocess` does
//! it: the model's `out` output (`[N, K, H, W]` scores of `K` classes) softmaxed over the
//! classes, and for each pixel the best class (as a float, as TorchServe stacks it with the
//! probabilities) and its probability: `[H][W][2]` per image. Computed from the output's
//! bytes and written as JSON text directly: a 224×224 image is 50,176 pixels.

use crate::infer::OutTensor;

/// Each image's `[[[class, probability], …], …]` (rows of pixels) as JSON text.
pub fn segmented(out: &OutTensor) -> Result<Vec<Vec<u8>>, String> {
    let &[n, k, h, w] = out.shape.as_slice() else {
        return Err(format!(
            "image_segmenter reads the model's `{}` output as [N, classes, H, W] scores; it has shape {:?}",
            out.name, out.shape
        ));
    };
    let scores = out.floats_or_half().map_err(|other| {
        format!(
            "image_segmenter reads float scores; the model's `{}` output is {other}",
            out.name
        )
    })?;
    let (n, k, h, w) = (
        n.max(0) as usize,
        k.max(0) as usize,
        h.max(0) as usize,
        w.max(0) as usize,
    );
    if k == 0 || scores.len() != n * k * h * w {
        return Err(format!(
            "image_segmenter: the model's `{}` output has no classes or fewer scores than its shape",
            out.name
        ));
    }
    let plane = h * w;
    let mut ryu = ryu::Buffer::new();
    Ok((0..n)
        .map(|i| {
            let image = &scores[i * k * plane..(i + 1) * k * plane];
            let mut text = Vec::with_capacity(plane * 20 + 2 * h + 2);
            text.push(b'[');
            for y in 0..h {
                if y > 0 {
                    text.push(b',');
                }
                text.push(b'[');
                for x in 0..w {
                    if x > 0 {
                        text.push(b',');
                    }
                    let (class, p) = best(image, k, plane, y * w + x);
                    text.push(b'[');
                    text.extend_from_slice(ryu.format(class as f32).as_bytes());
                    text.push(b',');
                    text.extend_from_slice(ryu.format(p).as_bytes());
                    text.push(b']');
                }
                text.push(b']');
            }
            text.push(b']');
            text
        })
        .collect())
}

/// The pixel `at`'s best class of `k` (the first of equal ones) and its softmax
/// probability, rounded to float32 as torch's float32 softmax gives it; a pixel whose
/// scores are not finite gives probability 0 (written as JSON's nearest, not NaN).
fn best(image: &[f64], k: usize, plane: usize, at: usize) -> (usize, f32) {
    let score = |c: usize| image[c * plane + at];
    let mut class = 0;
    for c in 1..k {
        if score(c) > score(class) {
            class = c;
        }
    }
    let top = score(class);
    let sum: f64 = (0..k).map(|c| (score(c) - top).exp()).sum();
    let p = (1.0 / sum) as f32;
    (class, if p.is_finite() { p } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramfork::metadata::{Datatype, Dtype};

    #[test]
    fn each_pixel_is_its_best_class_and_softmax_probability() {
        // One image, two classes, 1×2 pixels: pixel 0 favours class 1, pixel 1 class 0.
        let scores = [0.0f32, 2.0, 1.0, 0.0];
        let out = OutTensor {
            name: "out".into(),
            datatype: Datatype::Tensor(Dtype::Float32),
            shape: vec![1, 2, 1, 2],
            data: scores.iter().flat_map(|f| f.to_le_bytes()).collect(),
        };
        let images = segmented(&out).unwrap();
        let got: serde_json::Value = serde_json::from_slice(&images[0]).unwrap();
        let p = |d: f64| 1.0 / (1.0 + (-d).exp());
        let want = [[1.0, p(1.0)], [0.0, p(2.0)]];
        for (x, (class, prob)) in want.iter().map(|v| (v[0], v[1])).enumerate() {
            assert_eq!(got[0][x][0].as_f64(), Some(class), "{got}");
            assert!(
                (got[0][x][1].as_f64().unwrap() - prob).abs() < 1e-6,
                "{got}"
            );
        }
        let flat = OutTensor {
            shape: vec![4],
            ..out
        };
        assert!(segmented(&flat).unwrap_err().contains("[N, classes, H, W]"));
    }
}
