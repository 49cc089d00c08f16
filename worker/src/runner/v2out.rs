//! The model's outputs as Open Inference Protocol (KServe v2) output tensors, written on the
//! model thread. Each output is named as the metadata's `outputs` declare (in the order the
//! model returns them), else `output__N` (Triton's PyTorch-backend naming: the N-th item of a
//! tuple or list, or `output__0` for a single one). A tensor (or an int, float or bool) is a
//! numeric output; a `List[str]` (or a `str`) is a `BYTES` output of shape `[n]`. Data go as
//! a flat row-major JSON array or, when asked, as raw bytes appended to the binary tail
//! (Triton's binary tensor data extension: little-endian elements; for `BYTES`, each string
//! as a 4-byte little-endian length and its UTF-8 bytes).

use tch::{Device, IValue, Kind, Tensor};
use vramfork::metadata::{Datatype, TensorSpec};

use super::tensors::{type_name, write_int, write_tensor_as};
use super::RunError;

/// Which outputs the request wants, and how.
#[derive(Debug, Clone, Default)]
pub struct Wanted {
    /// Outputs asked for by name, each with whether its data goes binary; `None`: all.
    pub outputs: Option<Vec<(String, bool)>>,
    /// Binary data for the outputs not asked for by name (`binary_data_output`).
    pub binary_default: bool,
    /// The metadata's declared `outputs` (names and datatypes), if any.
    pub declared: Option<Vec<TensorSpec>>,
}

/// One output of the model.
enum Out {
    Tensor(Tensor),
    Strings(Vec<String>),
}

impl Out {
    fn datatype(&self) -> Option<&'static str> {
        match self {
            Out::Tensor(t) => datatype(t.kind()),
            Out::Strings(_) => Some("BYTES"),
        }
    }
}

/// The v2 datatype of a tensor kind.
pub fn datatype(k: Kind) -> Option<&'static str> {
    Some(match k {
        Kind::Bool => "BOOL",
        Kind::Uint8 => "UINT8",
        Kind::Int8 => "INT8",
        Kind::Int16 => "INT16",
        Kind::Int => "INT32",
        Kind::Int64 => "INT64",
        Kind::Half => "FP16",
        Kind::BFloat16 => "BF16",
        Kind::Float => "FP32",
        Kind::Double => "FP64",
        _ => return None,
    })
}

/// A list of strings (TorchScript returns `List[str]` as a list of `str` values).
fn strings(v: &IValue) -> Option<Vec<String>> {
    match v {
        IValue::StringList(s) => Some(s.clone()),
        IValue::GenericList(items) => items
            .iter()
            .map(|i| match i {
                IValue::String(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn one(v: &IValue) -> Result<Out, String> {
    Ok(match v {
        IValue::Tensor(t) => Out::Tensor(t.shallow_clone()),
        IValue::Double(f) => Out::Tensor(Tensor::from(*f)),
        IValue::Int(i) => Out::Tensor(Tensor::from(*i)),
        IValue::Bool(b) => Out::Tensor(Tensor::from(*b)),
        IValue::String(s) => Out::Strings(vec![s.clone()]),
        other => match strings(other) {
            Some(s) => Out::Strings(s),
            None => {
                return Err(format!(
                    "model returned an output of type {}; the v2 protocol serves tensors, strings and lists of strings (and tuples or lists of them)",
                    type_name(other)
                ))
            }
        },
    })
}

/// The model's answer as outputs, in order. A list of strings is one output (not one per
/// string); so is any list when the metadata declares a single `BYTES` output.
fn outputs(v: &IValue, declared: Option<&[TensorSpec]>) -> Result<Vec<Out>, String> {
    let one_bytes = matches!(declared, Some([d]) if d.datatype == Datatype::Bytes);
    match v {
        IValue::GenericList(items) if items.is_empty() && one_bytes => {
            Ok(vec![Out::Strings(Vec::new())])
        }
        IValue::GenericList(items) if !items.is_empty() && strings(v).is_some() => {
            Ok(vec![one(v)?])
        }
        IValue::Tuple(items) | IValue::GenericList(items) => items.iter().map(one).collect(),
        IValue::TensorList(ts) => Ok(ts.iter().map(|t| Out::Tensor(t.shallow_clone())).collect()),
        other => Ok(vec![one(other)?]),
    }
}

/// Writes the JSON array of output objects to `json` and the binary data to `binary`;
/// returns whether any output went binary (the answer then carries a binary tail, even an
/// empty one). An output the request names that the model does not have is the request's
/// error; outputs that differ from the declared ones in number or datatype are the model's.
pub fn write(
    v: &IValue,
    wanted: &Wanted,
    json: &mut Vec<u8>,
    binary: &mut Vec<u8>,
) -> Result<bool, RunError> {
    let declared = wanted.declared.as_deref();
    let all = outputs(v, declared).map_err(RunError::Unsupported)?;
    let names: Vec<String> = match declared {
        Some(specs) => {
            let listed = || {
                specs
                    .iter()
                    .map(|s| format!("{} ({})", s.name, s.datatype))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if specs.len() != all.len() {
                return Err(RunError::Unsupported(format!(
                    "the model returned {} outputs; the metadata declares {}: {}",
                    all.len(),
                    specs.len(),
                    listed()
                )));
            }
            for (spec, out) in specs.iter().zip(&all) {
                let got = out.datatype().unwrap_or("a dtype v2 cannot carry");
                if got != spec.datatype.v2_name() {
                    return Err(RunError::Unsupported(format!(
                        "the model returned {got} for output {}; the metadata declares {}",
                        spec.name, spec.datatype
                    )));
                }
            }
            specs.iter().map(|s| s.name.clone()).collect()
        }
        None => (0..all.len()).map(|i| format!("output__{i}")).collect(),
    };
    let picked: Vec<(usize, bool)> = match &wanted.outputs {
        None => (0..all.len()).map(|i| (i, wanted.binary_default)).collect(),
        Some(asked) => asked
            .iter()
            .map(|(name, bin)| {
                names
                    .iter()
                    .position(|n| n == name)
                    .map(|i| (i, *bin))
                    .ok_or_else(|| {
                        RunError::Request(format!(
                            "the request asks for output '{name}'; the model's outputs are {}",
                            names.join(", ")
                        ))
                    })
            })
            .collect::<Result<_, _>>()?,
    };
    let any_binary = picked.iter().any(|(_, bin)| *bin);
    json.push(b'[');
    for (n, (i, bin)) in picked.into_iter().enumerate() {
        if n > 0 {
            json.push(b',');
        }
        let written = match &all[i] {
            Out::Tensor(t) => write_one(&names[i], t, bin, json, binary),
            Out::Strings(s) => {
                write_strings(&names[i], s, bin, json, binary);
                Ok(())
            }
        };
        written.map_err(RunError::Unsupported)?;
    }
    json.push(b']');
    Ok(any_binary)
}

/// `{"name":…,"datatype":…,"shape":[…]` (the object left open for its data).
fn write_head(name: &str, datatype: &str, shape: &[i64], json: &mut Vec<u8>) {
    json.extend_from_slice(b"{\"name\":");
    serde_json::to_writer(&mut *json, name).expect("writing to a Vec cannot fail");
    json.extend_from_slice(b",\"datatype\":\"");
    json.extend_from_slice(datatype.as_bytes());
    json.extend_from_slice(b"\",\"shape\":[");
    for (i, d) in shape.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        write_int(*d, json);
    }
    json.push(b']');
}

/// `,"parameters":{"binary_data_size":n}}`, closing the output object.
fn write_binary_size(bytes: usize, json: &mut Vec<u8>) {
    json.extend_from_slice(b",\"parameters\":{\"binary_data_size\":");
    write_int(bytes as i64, json);
    json.extend_from_slice(b"}}");
}

fn write_strings(name: &str, s: &[String], bin: bool, json: &mut Vec<u8>, binary: &mut Vec<u8>) {
    write_head(name, "BYTES", &[s.len() as i64], json);
    if bin {
        let start = binary.len();
        for one in s {
            binary.extend_from_slice(&(one.len() as u32).to_le_bytes());
            binary.extend_from_slice(one.as_bytes());
        }
        write_binary_size(binary.len() - start, json);
        return;
    }
    json.extend_from_slice(b",\"data\":");
    serde_json::to_writer(&mut *json, s).expect("writing to a Vec cannot fail");
    json.push(b'}');
}

fn write_one(
    name: &str,
    t: &Tensor,
    bin: bool,
    json: &mut Vec<u8>,
    binary: &mut Vec<u8>,
) -> Result<(), String> {
    let err = |e: tch::TchError| format!("cannot read output {name}: {e}");
    let dt = datatype(t.kind()).ok_or_else(|| {
        format!(
            "output {name} has dtype {:?}, which v2 cannot carry",
            t.kind()
        )
    })?;
    let shape = t.size();
    let cpu = t
        .f_to_device(Device::Cpu)
        .and_then(|c| c.f_contiguous())
        .map_err(err)?;
    write_head(name, dt, &shape, json);
    let n = cpu.numel();
    if bin {
        let bytes = n * cpu.kind().elt_size_in_bytes();
        if n > 0 {
            // SAFETY: `cpu` is a contiguous CPU tensor of `n` elements, `bytes` bytes in all;
            // the slice lives only while `cpu` does.
            let raw = unsafe { std::slice::from_raw_parts(cpu.data_ptr() as *const u8, bytes) };
            binary.extend_from_slice(raw);
        }
        write_binary_size(bytes, json);
        return Ok(());
    }
    // The data as a flat row-major array, written as `POST /` writes a tensor.
    json.extend_from_slice(b",\"data\":");
    write_tensor_as(&cpu, &[n as i64], json)?;
    json.push(b'}');
    Ok(())
}
