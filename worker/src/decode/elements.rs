//! A named input's elements, from a JSON value or from raw bytes, as the model argument its
//! declared datatype calls for: a tensor (numbers or booleans) or a TorchScript `List[str]`
//! (`BYTES`). Used by v2 requests (shape given by the request) and by `POST /` bodies with
//! named inputs or text (shape read from the nesting). Every error names the input.

use serde_json::Value;
use tch::Tensor;
use vramfork::metadata::Dtype;

use crate::args::{int_range, kind_of, Arg};

/// The number of elements of `shape`, refusing negative sizes and products a buffer of
/// 8-byte elements could not hold.
pub fn element_count(name: &str, shape: &[i64]) -> Result<usize, String> {
    if let Some(d) = shape.iter().find(|d| **d < 0) {
        return Err(format!(
            "input {name}: shape {shape:?} has a negative size {d}"
        ));
    }
    shape
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d as usize))
        .filter(|n| n.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(|| format!("input {name}: shape {shape:?} is too large"))
}

/// The shape of a nested JSON array (`[[1, 2], [3, 4]]` → `[2, 2]`), checking that it is
/// regular: every array at a depth has the same length, and leaves sit at one depth.
pub fn nested_shape(name: &str, v: &Value) -> Result<Vec<i64>, String> {
    let mut shape = Vec::new();
    let mut at = v;
    while let Value::Array(items) = at {
        shape.push(items.len() as i64);
        match items.first() {
            Some(first) => at = first,
            None => break,
        }
    }
    fn check(name: &str, v: &Value, shape: &[i64], path: &mut Vec<usize>) -> Result<(), String> {
        let here = || {
            let mut s = format!("input {name}: inputs");
            for i in path.iter() {
                s.push_str(&format!("[{i}]"));
            }
            s
        };
        match (v, shape.split_first()) {
            (Value::Array(items), Some((&n, rest))) => {
                if items.len() as i64 != n {
                    return Err(format!(
                        "{}: ragged array of {} elements, expected {n} like the first one at that depth",
                        here(),
                        items.len()
                    ));
                }
                for (i, item) in items.iter().enumerate() {
                    path.push(i);
                    check(name, item, rest, path)?;
                    path.pop();
                }
                Ok(())
            }
            (Value::Array(_), None) => Err(format!(
                "{}: ragged array: an array where its siblings hold values",
                here()
            )),
            (_, Some(_)) => Err(format!(
                "{}: ragged array: a value where its siblings are arrays",
                here()
            )),
            (_, None) => Ok(()),
        }
    }
    check(name, v, &shape, &mut Vec::new())?;
    Ok(shape)
}

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|x| flatten(x, out)),
        other => out.push(other),
    }
}

/// `data` (flat row-major or nested) as the leaves of `count` elements.
fn leaves<'a>(
    name: &str,
    data: &'a Value,
    shape: &[i64],
    count: usize,
) -> Result<Vec<&'a Value>, String> {
    let mut leaves = Vec::with_capacity(count.min(1 << 20));
    flatten(data, &mut leaves);
    if leaves.len() != count {
        return Err(format!(
            "input {name}: `data` has {} elements; shape {shape:?} takes {count}",
            leaves.len()
        ));
    }
    Ok(leaves)
}

/// `data` (flat row-major or nested JSON) as a tensor of `shape` and `dtype`.
pub fn tensor_from_json(
    name: &str,
    data: &Value,
    shape: &[i64],
    dtype: Dtype,
) -> Result<Tensor, String> {
    let count = element_count(name, shape)?;
    let leaves = leaves(name, data, shape, count)?;
    let bad =
        |i: usize, v: &Value, what: &str| format!("input {name}: element {i} ({v}) is not {what}");
    let t = match dtype {
        Dtype::Bool => {
            let v: Vec<bool> = leaves
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_bool().ok_or_else(|| bad(i, v, "true or false")))
                .collect::<Result<_, _>>()?;
            Tensor::from_slice(&v)
        }
        Dtype::Float32 | Dtype::Float64 | Dtype::Float16 | Dtype::BFloat16 => {
            let max = match dtype {
                Dtype::Float64 => f64::MAX,
                Dtype::Float16 => 65504.0,
                _ => f32::MAX as f64,
            };
            let v: Vec<f64> = leaves
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_f64().filter(|f| f.abs() <= max).ok_or_else(|| {
                        bad(i, v, &format!("a number the type holds (|x| ≤ {max:e})"))
                    })
                })
                .collect::<Result<_, _>>()?;
            Tensor::from_slice(&v)
        }
        _ => {
            let (lo, hi) = int_range(dtype);
            let v: Vec<i64> = leaves
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_i64()
                        .filter(|n| (lo..=hi).contains(n))
                        .ok_or_else(|| bad(i, v, &format!("an integer in {lo}..={hi}")))
                })
                .collect::<Result<_, _>>()?;
            Tensor::from_slice(&v)
        }
    };
    t.f_to_kind(kind_of(dtype))
        .and_then(|t| t.f_reshape(shape))
        .map_err(|e| format!("input {name}: {e}"))
}

/// `data` (flat or nested JSON strings) as the strings of a `BYTES` input of `shape`, in
/// row-major order: the model gets them as one `List[str]`.
pub fn strings_from_json(name: &str, data: &Value, shape: &[i64]) -> Result<Arg, String> {
    let count = element_count(name, shape)?;
    let strings = leaves(name, data, shape, count)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => checked(name, i, s.clone()),
            other => Err(format!(
                "input {name} is BYTES: element {i} ({other}) is not a string"
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok(Arg::Strings(strings))
}

/// Raw `BYTES` data (Triton's binary form: each element a 4-byte little-endian length, then
/// that many bytes), exactly `count` elements filling `raw`; each must be UTF-8, unless the
/// input is a document (`blobs`: its elements kept as bytes for pre-processing).
pub fn strings_from_bytes(
    name: &str,
    mut raw: &[u8],
    count: usize,
    blobs: bool,
) -> Result<Arg, String> {
    let mut strings = Vec::with_capacity(count.min(raw.len() / 4));
    let mut kept = Vec::new();
    for i in 0..count {
        let Some((len, rest)) = raw.split_first_chunk::<4>() else {
            return Err(format!(
                "input {name}: the binary data ends before element {i} of {count} (each element is a 4-byte little-endian length, then its bytes)"
            ));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return Err(format!(
                "input {name}: element {i} says it has {len} bytes, but only {} remain",
                rest.len()
            ));
        }
        let (bytes, rest) = rest.split_at(len);
        if blobs {
            kept.push(bytes.to_vec());
            raw = rest;
            continue;
        }
        let s = String::from_utf8(bytes.to_vec())
            .map_err(|e| format!("input {name}: element {i} is not valid UTF-8 ({e})"))?;
        strings.push(checked(name, i, s)?);
        raw = rest;
    }
    if !raw.is_empty() {
        return Err(format!(
            "input {name}: {} bytes are left after its {count} elements",
            raw.len()
        ));
    }
    if blobs {
        return Ok(Arg::Blobs(kept));
    }
    Ok(Arg::Strings(strings))
}

/// TorchScript strings end at a NUL character: refused rather than cut short.
fn checked(name: &str, i: usize, s: String) -> Result<String, String> {
    if s.contains('\0') {
        Err(format!(
            "input {name}: element {i} contains a NUL character, which a TorchScript string cannot hold"
        ))
    } else {
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strings(a: Arg) -> Vec<String> {
        match a {
            Arg::Strings(s) => s,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nested_shapes_are_read_and_must_be_regular() {
        assert_eq!(
            nested_shape("x", &json!([[1, 2], [3, 4], [5, 6]])).unwrap(),
            [3, 2]
        );
        assert_eq!(nested_shape("x", &json!([])).unwrap(), [0]);
        assert_eq!(nested_shape("x", &json!(7)).unwrap(), Vec::<i64>::new());
        assert_eq!(nested_shape("x", &json!(["a", "b"])).unwrap(), [2]);
        let e = nested_shape("x", &json!([[1, 2], [3]])).unwrap_err();
        assert!(
            e.contains("input x: inputs[1]") && e.contains("ragged"),
            "{e}"
        );
        let e = nested_shape("x", &json!([[1], 2])).unwrap_err();
        assert!(
            e.contains("inputs[1]") && e.contains("siblings are arrays"),
            "{e}"
        );
        let e = nested_shape("x", &json!([1, [2]])).unwrap_err();
        assert!(
            e.contains("inputs[1]") && e.contains("siblings hold values"),
            "{e}"
        );
    }

    #[test]
    fn tensors_from_json_of_every_kind_of_number() {
        let t = tensor_from_json("x", &json!([[1, 2], [3, 4]]), &[2, 2], Dtype::Int32).unwrap();
        assert_eq!(t.size(), [2, 2]);
        assert_eq!(t.kind(), tch::Kind::Int);
        let t = tensor_from_json("x", &json!([0.5, 1.5]), &[1, 2], Dtype::Float64).unwrap();
        assert_eq!(Vec::<f64>::try_from(t.reshape([-1])).unwrap(), [0.5, 1.5]);
        let e = tensor_from_json("x", &json!([300]), &[1], Dtype::UInt8).unwrap_err();
        assert!(e.contains("input x: element 0 (300)"), "{e}");
        let e = tensor_from_json("x", &json!([1, 2, 3]), &[2], Dtype::Float32).unwrap_err();
        assert!(e.contains("has 3 elements; shape [2] takes 2"), "{e}");
        let e = tensor_from_json("x", &json!([]), &[-1, 2], Dtype::Float32).unwrap_err();
        assert!(e.contains("negative size -1"), "{e}");
        let e =
            tensor_from_json("x", &json!([]), &[1 << 32, 1 << 32, 16], Dtype::Float32).unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }

    #[test]
    fn strings_from_json_and_from_length_prefixed_bytes_agree() {
        let docs = ["first document", "naïve café ✓", ""];
        let a = strings(strings_from_json("docs", &json!(docs), &[3]).unwrap());
        let mut raw = Vec::new();
        for d in docs {
            raw.extend_from_slice(&(d.len() as u32).to_le_bytes());
            raw.extend_from_slice(d.as_bytes());
        }
        let b = strings(strings_from_bytes("docs", &raw, 3, false).unwrap());
        assert_eq!(a, docs);
        assert_eq!(a, b);
        // Nested data is read row-major.
        let n = strings(strings_from_json("d", &json!([["a", "b"], ["c", "d"]]), &[2, 2]).unwrap());
        assert_eq!(n, ["a", "b", "c", "d"]);
    }

    #[test]
    fn malformed_strings_name_the_input_and_element() {
        let e = strings_from_json("docs", &json!(["a", 5]), &[2]).unwrap_err();
        assert!(
            e.contains("input docs is BYTES: element 1 (5) is not a string"),
            "{e}"
        );
        let e = strings_from_json("docs", &json!(["a\u{0}b"]), &[1]).unwrap_err();
        assert!(e.contains("element 0 contains a NUL"), "{e}");
        let e = strings_from_bytes("docs", &[2, 0, 0, 0, 0xff, 0xfe], 1, false).unwrap_err();
        assert!(e.contains("element 0 is not valid UTF-8"), "{e}");
        // A document input keeps its elements as bytes (an image is not UTF-8).
        match strings_from_bytes("img", &[2, 0, 0, 0, 0xff, 0xfe, 0, 0, 0, 0], 2, true) {
            Ok(Arg::Blobs(b)) => assert_eq!(b, [vec![0xff, 0xfe], vec![]]),
            other => panic!("{other:?}"),
        }
        let e = strings_from_bytes("docs", &[9, 0, 0, 0, b'a'], 1, false).unwrap_err();
        assert!(e.contains("says it has 9 bytes, but only 1 remain"), "{e}");
        let e = strings_from_bytes("docs", &[1, 0, 0, 0, b'a', 0], 1, false).unwrap_err();
        assert!(e.contains("1 bytes are left"), "{e}");
        let e = strings_from_bytes("docs", &[1, 0, 0, 0, b'a'], 2, false).unwrap_err();
        assert!(e.contains("ends before element 1 of 2"), "{e}");
        let e = strings_from_bytes("docs", &[0xff, 0xff, 0xff, 0xff], 1, false).unwrap_err();
        assert!(e.contains("says it has 4294967295 bytes"), "{e}");
    }
}
