//! The model's signature as the metadata declares it: [`TensorSpec`] for each entry of
//! `inputs` and `outputs` (their [`Datatype`] and shape), or the older single `input`
//! ([`InputSpec`], the input `input__0`), and the shape check a request meets.

use std::fmt;

use serde_json::{Map, Value};

use super::{kind, Dtype};
use crate::near_miss;

/// A tensor's element type as the Open Inference Protocol names it: a numeric or boolean
/// dtype, or `BYTES` (strings: a TorchScript `List[str]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datatype {
    Tensor(Dtype),
    Bytes,
}

impl Datatype {
    /// Every v2 name, for error messages.
    pub const V2_NAMES: &'static str =
        "BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES";

    pub fn from_v2(name: &str) -> Option<Datatype> {
        Some(Datatype::Tensor(match name {
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
            "BYTES" => return Some(Datatype::Bytes),
            _ => return None,
        }))
    }

    pub fn v2_name(self) -> &'static str {
        match self {
            Datatype::Tensor(d) => d.v2_name(),
            Datatype::Bytes => "BYTES",
        }
    }
}

impl fmt::Display for Datatype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.v2_name())
    }
}

/// One named input or output of the model's signature (`inputs` / `outputs` in the
/// metadata; the older single `input` is the input `input__0`).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: Datatype,
    /// `-1` accepts any size in that dimension. `None` (only from the older `input` without
    /// a shape): any shape.
    pub shape: Option<Vec<i64>>,
    /// A `BYTES` input's declared pre-processing (`tokenizer` or `image`): what the worker
    /// turns its documents into before `forward` (`crate::documents`).
    pub document: Option<crate::documents::Document>,
}

impl TensorSpec {
    /// The dtype and shape check `POST /` uses for a numeric input.
    pub fn input_spec(&self) -> Option<InputSpec> {
        match self.datatype {
            Datatype::Tensor(dtype) => Some(InputSpec {
                shape: self.shape.clone(),
                dtype,
            }),
            Datatype::Bytes => None,
        }
    }

    /// Checks a request's shape against this spec.
    pub fn check_shape(&self, got: &[i64]) -> Result<(), String> {
        check_shape(self.shape.as_deref(), got)
    }
}

/// The name the single input of a model without declared `inputs` has (Triton's
/// PyTorch-backend naming, as are `output__0…` for undeclared outputs).
pub const SINGLE_INPUT: &str = "input__0";

/// The optional `input` field: what a request's `inputs` must look like.
#[derive(Debug, Clone, PartialEq)]
pub struct InputSpec {
    /// Expected shape; `-1` accepts any size in that dimension. `None`: any shape.
    pub shape: Option<Vec<i64>>,
    pub dtype: Dtype,
}

impl InputSpec {
    /// Checks a request's shape; the error says what was expected.
    pub fn check_shape(&self, got: &[i64]) -> Result<(), String> {
        check_shape(self.shape.as_deref(), got)
    }
}

/// Checks a request's shape against the expected one; the error says what was expected.
fn check_shape(want: Option<&[i64]>, got: &[i64]) -> Result<(), String> {
    let Some(want) = want else {
        return Ok(());
    };
    let fits = want.len() == got.len() && want.iter().zip(got).all(|(w, g)| *w == -1 || w == g);
    if fits {
        Ok(())
    } else {
        Err(format!(
            "inputs have shape {got:?}, the model expects {want:?} (-1 = any size)"
        ))
    }
}

/// The declared inputs: `inputs`, or the older `input` as one input named
/// [`SINGLE_INPUT`]; not both.
pub(super) fn inputs(raw: &Map<String, Value>) -> Result<Option<Vec<TensorSpec>>, String> {
    let input = match raw.get("input") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_input(v)?),
    };
    Ok(match (input, declared(raw, "inputs")?) {
        (Some(_), Some(_)) => {
            return Err(
                "declare either `input` (one input) or `inputs` (named inputs), not both".into(),
            )
        }
        (Some(spec), None) => Some(vec![TensorSpec {
            name: SINGLE_INPUT.into(),
            datatype: Datatype::Tensor(spec.dtype),
            shape: spec.shape,
            document: None,
        }]),
        (None, inputs) => inputs,
    })
}

/// The declared `inputs` or `outputs` (`key`), when given.
pub(super) fn declared(
    raw: &Map<String, Value>,
    key: &str,
) -> Result<Option<Vec<TensorSpec>>, String> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => parse_signature(key, v).map(Some),
    }
}

fn parse_input(v: &Value) -> Result<InputSpec, String> {
    let Value::Object(o) = v else {
        // CLAMS app metadata has an `input` list (the MMIF document types the app reads).
        let clams = match v {
            Value::Array(_) => "; a list here is CLAMS's `input` (the MMIF types an app reads), which vramfork does not read: rename it (`clams_input`, for example: kept and returned by GET /) or drop it, and declare the model's tensors as `inputs` (docs/migrating.md)",
            _ => "",
        };
        return Err(format!(
            "field `input` must be an object with `shape` and `dtype`, found {}{clams}",
            kind(v)
        ));
    };
    // Both keys are optional, so a misspelt one would silently mean "any shape, float32";
    // other keys (a description…) are kept as written.
    near_miss::check("input", o, &["shape", "dtype"], &[])?;
    let shape = match o.get("shape") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_shape("input.shape", v)?),
    };
    let dtype = match o.get("dtype") {
        None | Some(Value::Null) => Dtype::Float32,
        Some(Value::String(s)) => Dtype::parse(s).ok_or_else(|| {
            format!(
                "field `input.dtype` is \"{s}\"; accepted: {}",
                Dtype::NAMES.join(", ")
            )
        })?,
        Some(other) => {
            return Err(format!(
                "field `input.dtype` must be a string, found {}",
                kind(other)
            ))
        }
    };
    Ok(InputSpec { shape, dtype })
}

/// The fields vramfork reads in an entry of `inputs` or `outputs` (`key`).
fn entry_fields(key: &str) -> &'static [&'static str] {
    match key {
        "inputs" => &["name", "datatype", "shape", "tokenizer", "image"],
        _ => &["name", "datatype", "shape", "labels"],
    }
}

/// `inputs` or `outputs`: a non-empty array of `{name, datatype, shape}` with unique names.
fn parse_signature(key: &str, v: &Value) -> Result<Vec<TensorSpec>, String> {
    let items = match v {
        Value::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(format!(
                "field `{key}` must be a non-empty array of {{\"name\", \"datatype\", \"shape\"}} objects, found {}",
                if v.is_array() { "an empty array" } else { kind(v) }
            ))
        }
    };
    let mut specs: Vec<TensorSpec> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{key}[{i}]");
        let Value::Object(o) = item else {
            return Err(format!(
                "field `{at}` must be an object with `name`, `datatype` and `shape`, found {}",
                kind(item)
            ));
        };
        near_miss::check(&at, o, entry_fields(key), &[])?;
        let name = match o.get("name") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(v) => {
                return Err(format!(
                    "field `{at}.name` must be a non-empty string, found {}",
                    kind(v)
                ))
            }
            None => return Err(format!("field `{at}.name` is missing")),
        };
        if specs.iter().any(|s| s.name == name) {
            return Err(format!("field `{at}.name`: '{name}' is declared twice"));
        }
        let datatype = match o.get("datatype") {
            Some(Value::String(s)) => Datatype::from_v2(s).ok_or_else(|| {
                format!(
                    "field `{at}.datatype` is \"{s}\"; accepted: {}",
                    Datatype::V2_NAMES
                )
            })?,
            Some(v) => {
                return Err(format!(
                    "field `{at}.datatype` must be a string, found {}",
                    kind(v)
                ))
            }
            None => {
                return Err(format!(
                    "field `{at}.datatype` is missing ({})",
                    Datatype::V2_NAMES
                ))
            }
        };
        let shape = match o.get("shape") {
            Some(v) => parse_shape(&format!("{at}.shape"), v)?,
            None => {
                return Err(format!(
                    "field `{at}.shape` is missing (an array of sizes, -1 = any)"
                ))
            }
        };
        specs.push(TensorSpec {
            name,
            datatype,
            shape: Some(shape),
            document: None,
        });
    }
    Ok(specs)
}

/// A shape field (`field` names it in errors): an array of sizes ≥ 0, or -1 for any size.
fn parse_shape(field: &str, v: &Value) -> Result<Vec<i64>, String> {
    let Value::Array(dims) = v else {
        return Err(format!(
            "field `{field}` must be an array of sizes (-1 = any), found {}",
            kind(v)
        ));
    };
    dims.iter()
        .enumerate()
        .map(|(i, d)| match d.as_i64() {
            Some(n) if n == -1 || n >= 0 => Ok(n),
            _ => Err(format!(
                "field `{field}[{i}]` must be a size ≥ 0 or -1 (any size), found {d}"
            )),
        })
        .collect()
}
