//! The model's outputs as Open Inference Protocol (KServe v2) output tensors, written on the
//! model thread: each output named `output__N` (Triton's PyTorch-backend naming: the N-th
//! tensor of a tuple or list, or `output__0` for a single tensor), with its v2 datatype and
//! shape, and its data either as a flat row-major JSON array or, when asked, as raw
//! little-endian bytes appended to the binary tail (Triton's binary tensor data extension).

use tch::{Device, IValue, Kind, Tensor};

use super::tensors::{type_name, write_int, write_tensor_as};
use super::RunError;

/// Which outputs the request wants, and how.
#[derive(Debug, Clone, Default)]
pub struct Wanted {
    /// Outputs asked for by name, each with whether its data goes binary; `None`: all.
    pub outputs: Option<Vec<(String, bool)>>,
    /// Binary data for the outputs not asked for by name (`binary_data_output`).
    pub binary_default: bool,
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

/// The model's answer as tensors, in output order.
fn tensors(v: &IValue) -> Result<Vec<Tensor>, String> {
    let one = |v: &IValue| -> Result<Tensor, String> {
        match v {
            IValue::Tensor(t) => Ok(t.shallow_clone()),
            IValue::Double(f) => Ok(Tensor::from(*f)),
            IValue::Int(i) => Ok(Tensor::from(*i)),
            IValue::Bool(b) => Ok(Tensor::from(*b)),
            other => Err(format!(
                "model returned an output of type {}; the v2 protocol serves tensors (and tuples or lists of them)",
                type_name(other)
            )),
        }
    };
    match v {
        IValue::Tuple(items) | IValue::GenericList(items) => items.iter().map(one).collect(),
        IValue::TensorList(ts) => Ok(ts.iter().map(Tensor::shallow_clone).collect()),
        other => Ok(vec![one(other)?]),
    }
}

/// Writes the JSON array of output objects to `json` and the binary data to `binary`;
/// returns whether any output went binary (the answer then carries a binary tail, even an
/// empty one). An output the request names that the model did not return is the request's
/// error.
pub fn write(
    v: &IValue,
    wanted: &Wanted,
    json: &mut Vec<u8>,
    binary: &mut Vec<u8>,
) -> Result<bool, RunError> {
    let all = tensors(v).map_err(RunError::Unsupported)?;
    let names: Vec<String> = (0..all.len()).map(|i| format!("output__{i}")).collect();
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
        write_one(&names[i], &all[i], bin, json, binary).map_err(RunError::Unsupported)?;
    }
    json.push(b']');
    Ok(any_binary)
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
    json.extend_from_slice(b"{\"name\":\"");
    json.extend_from_slice(name.as_bytes());
    json.extend_from_slice(b"\",\"datatype\":\"");
    json.extend_from_slice(dt.as_bytes());
    json.extend_from_slice(b"\",\"shape\":[");
    for (i, d) in shape.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        write_int(*d, json);
    }
    json.push(b']');
    let n = cpu.numel();
    if bin {
        let bytes = n * cpu.kind().elt_size_in_bytes();
        if n > 0 {
            // SAFETY: `cpu` is a contiguous CPU tensor of `n` elements, `bytes` bytes in all;
            // the slice lives only while `cpu` does.
            let raw = unsafe { std::slice::from_raw_parts(cpu.data_ptr() as *const u8, bytes) };
            binary.extend_from_slice(raw);
        }
        json.extend_from_slice(b",\"parameters\":{\"binary_data_size\":");
        write_int(bytes as i64, json);
        json.extend_from_slice(b"}}");
        return Ok(());
    }
    // The data as a flat row-major array, written as `POST /` writes a tensor.
    json.extend_from_slice(b",\"data\":");
    write_tensor_as(&cpu, &[n as i64], json)?;
    json.push(b'}');
    Ok(())
}
