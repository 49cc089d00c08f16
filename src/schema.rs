//! The metadata's vocabulary, shared by the metadata's parser and its parts (`crate::documents`):
//! the element types a tensor may have, and the kinds of JSON value messages name. A leaf.

use std::fmt;

use serde_json::Value;

/// Element types a request's `inputs` may be converted to before the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Float32,
    Float64,
    Float16,
    BFloat16,
    Int64,
    Int32,
    Int16,
    Int8,
    UInt8,
    Bool,
}

impl Dtype {
    /// Every accepted spelling, for error messages and docs.
    pub const NAMES: &'static [&'static str] = &[
        "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
        "bool",
    ];

    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "float32" | "float" => Dtype::Float32,
            "float64" | "double" => Dtype::Float64,
            "float16" | "half" => Dtype::Float16,
            "bfloat16" => Dtype::BFloat16,
            "int64" | "long" => Dtype::Int64,
            "int32" | "int" => Dtype::Int32,
            "int16" => Dtype::Int16,
            "int8" => Dtype::Int8,
            "uint8" => Dtype::UInt8,
            "bool" => Dtype::Bool,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Float16 => "float16",
            Dtype::BFloat16 => "bfloat16",
            Dtype::Int64 => "int64",
            Dtype::Int32 => "int32",
            Dtype::Int16 => "int16",
            Dtype::Int8 => "int8",
            Dtype::UInt8 => "uint8",
            Dtype::Bool => "bool",
        }
    }

    /// The Open Inference Protocol (KServe v2) name: `FP32`, `INT64`, `BOOL`…
    pub fn v2_name(self) -> &'static str {
        match self {
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

    pub fn is_integer(self) -> bool {
        matches!(
            self,
            Dtype::Int64 | Dtype::Int32 | Dtype::Int16 | Dtype::Int8 | Dtype::UInt8
        )
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A JSON value's kind, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
