//! Vectors from the model's output (its typed output: raw little-endian tensor data): pooled per input (`cls`: its first token; `mean`: the average
//! over its tokens, the attention mask's ones, padding left out; `none`: the output's row),
//! cut to `dimensions` (Matryoshka models) and L2-normalised when declared or cut; written
//! as JSON floats or base64 of little-endian `f32` bytes (OpenAI's `encoding_format`).

use base64::Engine;

use vramfork::metadata::embeddings::Pooling;

use crate::infer::OutTensor;

/// One pass's output: its shape and its elements.
pub struct Output {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Output {
    /// The output from the model's typed output.
    pub fn read(t: &OutTensor) -> Result<Output, String> {
        let shape = t.shape.iter().map(|n| *n as usize).collect();
        let data = t
            .floats()
            .map_err(|other| {
                format!(
                    "the embeddings output is {other}; vectors are made from FP32 or FP64 outputs"
                )
            })?
            .into_iter()
            .map(|x| x as f32)
            .collect();
        Ok(Output { shape, data })
    }

    /// One vector per row of `lengths` (each row's token count), pooled as declared.
    pub fn pool(&self, pooling: Pooling, lengths: &[usize]) -> Result<Vec<Vec<f32>>, String> {
        let rows = lengths.len();
        let expect = match pooling {
            Pooling::None => "[inputs, width]",
            Pooling::Cls | Pooling::Mean => "[inputs, tokens, width]",
        };
        let wrong = || {
            format!(
                "the embeddings output has shape {:?} for {rows} inputs; pooling \"{}\" takes {expect}",
                self.shape,
                match pooling {
                    Pooling::Cls => "cls",
                    Pooling::Mean => "mean",
                    Pooling::None => "none",
                }
            )
        };
        let n: usize = self.shape.iter().product();
        if self.shape.first() != Some(&rows) || n != self.data.len() {
            return Err(wrong());
        }
        match (pooling, self.shape.as_slice()) {
            (Pooling::None, &[_, w]) => {
                Ok(self.data.chunks(w.max(1)).map(<[f32]>::to_vec).collect())
            }
            (Pooling::Cls, &[_, t, w]) if t > 0 => Ok((0..rows)
                .map(|r| self.data[r * t * w..r * t * w + w].to_vec())
                .collect()),
            (Pooling::Mean, &[_, t, w]) if lengths.iter().all(|&l| l >= 1 && l <= t) => Ok(lengths
                .iter()
                .enumerate()
                .map(|(r, &len)| {
                    let mut sum = vec![0f64; w];
                    for tok in 0..len {
                        let at = (r * t + tok) * w;
                        for (s, x) in sum.iter_mut().zip(&self.data[at..at + w]) {
                            *s += f64::from(*x);
                        }
                    }
                    sum.iter().map(|s| (s / len as f64) as f32).collect()
                })
                .collect()),
            _ => Err(wrong()),
        }
    }
}

/// `v` cut to `dimensions` (when given and smaller), then L2-normalised when `normalize`
/// or cut.
pub fn finish(mut v: Vec<f32>, dimensions: Option<usize>, normalize: bool) -> Vec<f32> {
    let cut = dimensions.is_some_and(|d| d < v.len());
    if let Some(d) = dimensions.filter(|_| cut) {
        v.truncate(d);
    }
    if normalize || cut {
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        if norm > 0.0 {
            for x in &mut v {
                *x = (f64::from(*x) / norm) as f32;
            }
        }
    }
    v
}

/// OpenAI's `base64` encoding: the vector's little-endian `f32` bytes.
pub fn base64(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_cutting_and_normalising() {
        // Two inputs of 2 and 1 tokens, padded to 2, width 2.
        let out = Output {
            shape: vec![2, 2, 2],
            data: vec![1., 2., 3., 4., 5., 6., 100., 100.],
        };
        assert_eq!(
            out.pool(Pooling::Cls, &[2, 1]).unwrap(),
            vec![vec![1., 2.], vec![5., 6.]]
        );
        // The padding position (100, 100) is left out.
        assert_eq!(
            out.pool(Pooling::Mean, &[2, 1]).unwrap(),
            vec![vec![2., 3.], vec![5., 6.]]
        );
        assert!(out.pool(Pooling::None, &[2, 1]).is_err());
        assert!(out.pool(Pooling::Cls, &[2, 1, 1]).is_err());
        let flat = Output {
            shape: vec![1, 2],
            data: vec![3., 4.],
        };
        assert_eq!(flat.pool(Pooling::None, &[5]).unwrap(), vec![vec![3., 4.]]);
        assert_eq!(finish(vec![3., 4.], None, true), vec![0.6, 0.8]);
        assert_eq!(finish(vec![3., 4.], Some(2), false), vec![3., 4.]);
        assert_eq!(finish(vec![3., 4., 12.], Some(1), false), vec![1.]);
        let b = base64(&[1.0, -2.5]);
        let bytes = base64::engine::general_purpose::STANDARD.decode(b).unwrap();
        assert_eq!(
            bytes,
            [1f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat()
        );
    }
}
