//! A v2 inference request (`POST /v2/models/{name}[/versions/{v}]/infer`): its JSON header,
//! optionally followed by binary tensor data (Triton's binary tensor data extension:
//! `Inference-Header-Content-Length` says where the JSON ends, each input's
//! `parameters.binary_data_size` how many raw little-endian bytes it takes), turned into the
//! model's input tensor and what the answer should hold. Every way it can be wrong is a 400
//! that names the input.

use serde::Deserialize;
use serde_json::{Map, Value};
use tch::Tensor;
use vramfork::metadata::{Dtype, InputSpec};

use crate::input::InputArray;
use crate::runner::kind_of;
use crate::runner::v2out::Wanted;

/// The one input a single-input model takes (Triton's PyTorch-backend naming).
pub const INPUT: &str = "input__0";

#[derive(Deserialize)]
struct Header {
    id: Option<Value>,
    #[serde(default)]
    parameters: Map<String, Value>,
    inputs: Vec<InputHeader>,
    outputs: Option<Vec<OutputHeader>>,
}

#[derive(Deserialize)]
struct InputHeader {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputHeader {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// A parsed request.
pub struct Infer {
    pub id: Option<String>,
    pub input: InputArray,
    pub wanted: Wanted,
    /// `parameters.hwFetch: true`.
    pub hw_fetch: bool,
}

/// The v2 datatype name of a dtype.
pub fn datatype_of(d: Dtype) -> &'static str {
    match d {
        Dtype::Float32 => "FP32",
        Dtype::Float64 => "FP64",
        Dtype::Float16 => "FP16",
        Dtype::BFloat16 => "BF16",
        Dtype::Int64 => "INT64",
        Dtype::Int32 => "INT32",
        Dtype::Int16 => "INT16",
        Dtype::Int8 => "INT8",
        Dtype::UInt8 => "UINT8",
        Dtype::Bool => "BOOL",
    }
}

fn dtype_named(name: &str) -> Option<Dtype> {
    Some(match name {
        "FP32" => Dtype::Float32,
        "FP64" => Dtype::Float64,
        "FP16" => Dtype::Float16,
        "BF16" => Dtype::BFloat16,
        "INT64" => Dtype::Int64,
        "INT32" => Dtype::Int32,
        "INT16" => Dtype::Int16,
        "INT8" => Dtype::Int8,
        "UINT8" => Dtype::UInt8,
        "BOOL" => Dtype::Bool,
        _ => return None,
    })
}

fn flag(params: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "parameter {key} must be true or false, not {other}"
        )),
    }
}

/// Parses a request body; `header_len` is `Inference-Header-Content-Length` when sent.
pub fn parse(
    body: &[u8],
    header_len: Option<usize>,
    spec: Option<&InputSpec>,
) -> Result<Infer, String> {
    let (head, mut tail) = match header_len {
        None => (body, &[][..]),
        Some(n) if n <= body.len() => body.split_at(n),
        Some(n) => {
            return Err(format!(
                "Inference-Header-Content-Length is {n}, but the body has only {} bytes",
                body.len()
            ))
        }
    };
    let h: Header = serde_json::from_slice(head)
        .map_err(|e| format!("the inference request is not a valid v2 request: {e}"))?;
    let id = match h.id {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => return Err(format!("`id` must be a string, not {other}")),
    };
    let hw_fetch = flag(&h.parameters, "hwFetch")?;
    let binary_default = flag(&h.parameters, "binary_data_output")?;
    let [input] = <[InputHeader; 1]>::try_from(h.inputs).map_err(|inputs| {
        format!(
            "the request has {} inputs; this model takes one, {INPUT}",
            inputs.len()
        )
    })?;
    if input.name != INPUT {
        return Err(format!(
            "unknown input '{}'; this model takes one input, {INPUT}",
            input.name
        ));
    }
    let name = &input.name;
    let dtype = match dtype_named(&input.datatype) {
        Some(d) => d,
        None if input.datatype == "BYTES" => {
            return Err(format!("input {name}: BYTES is not supported by this model"))
        }
        None => {
            return Err(format!(
                "input {name}: unknown datatype '{}' (BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64)",
                input.datatype
            ))
        }
    };
    if let Some(spec) = spec {
        if spec.dtype != dtype {
            return Err(format!(
                "input {name} has datatype {}; the model takes {}",
                input.datatype,
                datatype_of(spec.dtype)
            ));
        }
        spec.check_shape(&input.shape)
            .map_err(|e| format!("input {name}: {e}"))?;
    }
    if let Some(d) = input.shape.iter().find(|d| **d < 0) {
        return Err(format!(
            "input {name}: shape {:?} has a negative size {d}",
            input.shape
        ));
    }
    let count = input
        .shape
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d as usize))
        .filter(|n| n.checked_mul(8).is_some())
        .ok_or_else(|| format!("input {name}: shape {:?} is too large", input.shape))?;
    let kind = kind_of(dtype);
    let binary_size = match input.parameters.get("binary_data_size") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            format!("input {name}: binary_data_size must be a non-negative integer, not {v}")
        })? as usize),
    };
    let tensor = match (binary_size, &input.data) {
        (Some(_), Some(_)) => {
            return Err(format!("input {name} has both `data` and binary_data_size"))
        }
        (None, None) => return Err(format!("input {name} has no `data` and no binary data")),
        (Some(size), None) => {
            let want = count * kind.elt_size_in_bytes();
            if size != want {
                return Err(format!(
                    "input {name}: binary_data_size is {size} bytes; shape {:?} of {} takes {want}",
                    input.shape, input.datatype
                ));
            }
            if size > tail.len() {
                return Err(format!(
                    "input {name}: binary_data_size is {size} bytes, but only {} follow the header",
                    tail.len()
                ));
            }
            let (bytes, rest) = tail.split_at(size);
            tail = rest;
            Tensor::f_from_data_size(bytes, &input.shape, kind)
                .map_err(|e| format!("input {name}: {e}"))?
        }
        (None, Some(data)) => from_json(name, data, &input.shape, count, dtype)?,
    };
    if !tail.is_empty() {
        return Err(format!(
            "{} bytes of binary data follow the header that no input claims",
            tail.len()
        ));
    }
    let wanted = Wanted {
        outputs: match h.outputs {
            None => None,
            Some(outs) => Some(
                outs.into_iter()
                    .map(|o| {
                        Ok((
                            o.name,
                            flag(&o.parameters, "binary_data")? || binary_default,
                        ))
                    })
                    .collect::<Result<_, String>>()?,
            ),
        },
        binary_default,
    };
    Ok(Infer {
        id,
        input: InputArray { tensor },
        wanted,
        hw_fetch,
    })
}

/// `data` (flat row-major or nested) as a tensor of `shape` and `dtype`.
fn from_json(
    name: &str,
    data: &Value,
    shape: &[i64],
    count: usize,
    dtype: Dtype,
) -> Result<Tensor, String> {
    let mut leaves = Vec::with_capacity(count.min(1 << 20));
    flatten(data, &mut leaves);
    if leaves.len() != count {
        return Err(format!(
            "input {name}: `data` has {} elements; shape {shape:?} takes {count}",
            leaves.len()
        ));
    }
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
            let (lo, hi) = match dtype {
                Dtype::Int32 => (i32::MIN as i64, i32::MAX as i64),
                Dtype::Int16 => (i16::MIN as i64, i16::MAX as i64),
                Dtype::Int8 => (i8::MIN as i64, i8::MAX as i64),
                Dtype::UInt8 => (0, 255),
                _ => (i64::MIN, i64::MAX),
            };
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

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|x| flatten(x, out)),
        other => out.push(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> InputSpec {
        InputSpec {
            shape: Some(vec![-1, 4]),
            dtype: Dtype::Float32,
        }
    }

    #[test]
    fn json_and_binary_requests_give_the_same_tensor() {
        let json = br#"{"id":"a","inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[[1,2,3,4]]}]}"#;
        let a = parse(json, None, Some(&spec())).unwrap();
        assert_eq!(a.id.as_deref(), Some("a"));
        let head = br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}],"outputs":[{"name":"output__0","parameters":{"binary_data":true}}]}"#;
        let mut body = head.to_vec();
        for f in [1f32, 2.0, 3.0, 4.0] {
            body.extend_from_slice(&f.to_le_bytes());
        }
        let b = parse(&body, Some(head.len()), Some(&spec())).unwrap();
        assert!(a.input.tensor.equal(&b.input.tensor));
        assert_eq!(b.wanted.outputs, Some(vec![("output__0".into(), true)]));
    }

    #[test]
    fn every_malformed_request_names_its_problem() {
        let s = Some(spec());
        let cases: &[(&[u8], Option<usize>, &str)] = &[
            (b"{", None, "not a valid v2 request"),
            (br#"{"inputs":[]}"#, None, "has 0 inputs"),
            (br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#, None, "unknown input 'x'"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"INT64","data":[1,2,3,4]}]}"#, None, "the model takes FP32"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP33","data":[1,2,3,4]}]}"#, None, "unknown datatype"),
            (br#"{"inputs":[{"name":"input__0","shape":[2,4],"datatype":"FP32","data":[1,2,3,4]}]}"#, None, "has 4 elements"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}"#, None, "the model expects"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,"x",4]}]}"#, None, "element 2"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,1e39,4]}]}"#, None, "element 2"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32"}]}"#, None, "no `data`"),
            (br#"{"id":7,"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#, None, "`id` must be a string"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":12}}]}"#, Some(usize::MAX), "takes 16"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}"#, Some(usize::MAX), "only"),
        ];
        for (body, hl, want) in cases {
            let hl = hl.map(|n| n.min(body.len()));
            let e = parse(body, hl, s.as_ref())
                .err()
                .unwrap_or_else(|| panic!("accepted {}", String::from_utf8_lossy(body)));
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
        // Without a declared input: shapes whose product overflows, negative sizes.
        let huge = br#"{"inputs":[{"name":"input__0","shape":[4294967296,4294967296,16],"datatype":"FP32","data":[]}]}"#;
        assert!(parse(huge, None, None).err().unwrap().contains("too large"));
        let neg = br#"{"inputs":[{"name":"input__0","shape":[-1,4],"datatype":"FP32","data":[]}]}"#;
        assert!(parse(neg, None, None).err().unwrap().contains("negative"));
        // Binary data beyond what the inputs claim.
        let head = br#"{"inputs":[{"name":"input__0","shape":[1],"datatype":"INT8","parameters":{"binary_data_size":1}}]}"#;
        let mut body = head.to_vec();
        body.extend_from_slice(&[1, 2]);
        assert!(parse(&body, Some(head.len()), None)
            .err()
            .unwrap()
            .contains("no input claims"));
    }
}
