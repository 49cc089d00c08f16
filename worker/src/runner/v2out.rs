//! The model's outputs as typed tensors ([`OutTensor`]: name, datatype, shape and bytes),
//! made on the model thread for every door but `POST /` (v2 REST, gRPC, OpenAI's
//! embeddings), each of which writes its own wire format from them. Each output is named as
//! the metadata's `outputs` declare (in the order the model returns them), else `output__N`
//! (Triton's PyTorch-backend naming: the N-th item of a tuple or list, or `output__0` for a
//! single one). A model that returns a dict with string keys (torchvision's segmentation
//! models: `{"out": …, "aux": …}`) names its outputs itself: each key is an output's name
//! (declared outputs are then found by name, in the metadata's order). A tensor (or an int, float or bool) is a numeric output; a `List[str]` (or a
//! `str`) is a `BYTES` output of shape `[n]`. Its data are row-major little-endian elements;
//! for `BYTES`, each string as a 4-byte little-endian length and its UTF-8 bytes (the raw
//! form of Triton's binary tensor data extension and of gRPC's `raw_output_contents`).

use tch::{Device, IValue, Kind, Tensor};
use vramfork::metadata::{Datatype, Dtype, TensorSpec};

use super::tensors::type_name;
use super::RunError;

/// Which outputs the request wants.
#[derive(Debug, Clone, Default)]
pub struct Wanted {
    /// Outputs asked for by name, in the request's order; `None`: all, in the model's.
    pub outputs: Option<Vec<String>>,
    /// The metadata's declared `outputs` (names and datatypes), if any.
    pub declared: Option<Vec<TensorSpec>>,
}

/// One output of the model, as every door but `POST /` reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutTensor {
    pub name: String,
    pub datatype: Datatype,
    pub shape: Vec<i64>,
    /// Row-major little-endian elements; for `BYTES`, each element as a 4-byte
    /// little-endian length and its bytes.
    pub data: Vec<u8>,
}

impl OutTensor {
    /// The elements of an FP32 or FP64 output, widened to `f64`; `Err` the datatype it is.
    pub fn floats(&self) -> Result<Vec<f64>, Datatype> {
        self.decode(false)
    }

    /// As [`OutTensor::floats`], FP16 too.
    pub fn floats_or_half(&self) -> Result<Vec<f64>, Datatype> {
        self.decode(true)
    }

    fn decode(&self, with_half: bool) -> Result<Vec<f64>, Datatype> {
        let d = &self.data;
        Ok(match self.datatype {
            Datatype::Tensor(Dtype::Float32) => d
                .chunks_exact(4)
                .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
            Datatype::Tensor(Dtype::Float64) => d
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect(),
            Datatype::Tensor(Dtype::Float16) if with_half => d
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64())
                .collect(),
            other => return Err(other),
        })
    }
}

/// One output of the model.
enum Out {
    Tensor(Tensor),
    Strings(Vec<String>),
}

impl Out {
    fn datatype(&self) -> Option<Datatype> {
        match self {
            Out::Tensor(t) => dtype(t.kind()).map(Datatype::Tensor),
            Out::Strings(_) => Some(Datatype::Bytes),
        }
    }
}

/// The element type of a tensor kind, if the protocol carries it.
fn dtype(k: Kind) -> Option<Dtype> {
    Some(match k {
        Kind::Bool => Dtype::Bool,
        Kind::Uint8 => Dtype::UInt8,
        Kind::Int8 => Dtype::Int8,
        Kind::Int16 => Dtype::Int16,
        Kind::Int => Dtype::Int32,
        Kind::Int64 => Dtype::Int64,
        Kind::Half => Dtype::Float16,
        Kind::BFloat16 => Dtype::BFloat16,
        Kind::Float => Dtype::Float32,
        Kind::Double => Dtype::Float64,
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

/// The model's answer as outputs, in order, each with the name the model gives it (a
/// dict's key), if any. A list of strings is one output (not one per string); so is any
/// list when the metadata declares a single `BYTES` output.
fn outputs(
    v: &IValue,
    declared: Option<&[TensorSpec]>,
) -> Result<Vec<(Option<String>, Out)>, String> {
    let one_bytes = matches!(declared, Some([d]) if d.datatype == Datatype::Bytes);
    let unnamed = |all: Vec<Out>| all.into_iter().map(|o| (None, o)).collect();
    match v {
        IValue::GenericList(items) if items.is_empty() && one_bytes => {
            Ok(unnamed(vec![Out::Strings(Vec::new())]))
        }
        IValue::GenericList(items) if !items.is_empty() && strings(v).is_some() => {
            Ok(unnamed(vec![one(v)?]))
        }
        IValue::Tuple(items) | IValue::GenericList(items) => {
            Ok(unnamed(items.iter().map(one).collect::<Result<_, _>>()?))
        }
        IValue::TensorList(ts) => Ok(unnamed(
            ts.iter().map(|t| Out::Tensor(t.shallow_clone())).collect(),
        )),
        IValue::GenericDict(pairs) => pairs
            .iter()
            .map(|(key, value)| match key {
                IValue::String(name) => Ok((Some(name.clone()), one(value)?)),
                other => Err(format!(
                    "model returned a dict with {} keys; a dict output needs str keys (its outputs' names)",
                    type_name(other)
                )),
            })
            .collect(),
        other => Ok(unnamed(vec![one(other)?])),
    }
}

/// The outputs the request wants, in its order (all, in the model's, when it names none). An
/// output the request names that the model does not have is the request's error; outputs
/// that differ from the declared ones in number or datatype are the model's.
pub fn tensors(v: &IValue, wanted: &Wanted) -> Result<Vec<OutTensor>, RunError> {
    let declared = wanted.declared.as_deref();
    let all = outputs(v, declared).map_err(RunError::Unsupported)?;
    let (names, all): (Vec<String>, Vec<Out>) = match declared {
        Some(specs) => {
            let all = in_declared_order(specs, all)?;
            check_declared(specs, &all)?;
            (specs.iter().map(|s| s.name.clone()).collect(), all)
        }
        None => all
            .into_iter()
            .enumerate()
            .map(|(i, (name, out))| (name.unwrap_or_else(|| format!("output__{i}")), out))
            .unzip(),
    };
    let picked: Vec<usize> = match &wanted.outputs {
        None => (0..all.len()).collect(),
        Some(asked) => asked
            .iter()
            .map(|name| {
                names.iter().position(|n| n == name).ok_or_else(|| {
                    RunError::Request(format!(
                        "the request asks for output '{name}'; the model's outputs are {}",
                        names.join(", ")
                    ))
                })
            })
            .collect::<Result<_, _>>()?,
    };
    picked
        .into_iter()
        .map(|i| match &all[i] {
            Out::Tensor(t) => tensor_out(&names[i], t),
            Out::Strings(s) => Ok(strings_out(&names[i], s)),
        })
        .collect::<Result<_, _>>()
        .map_err(RunError::Unsupported)
}

/// The model's outputs in the declared order: outputs the model names (a dict's) are found
/// by the declared names; unnamed ones are taken in the model's order.
fn in_declared_order(
    specs: &[TensorSpec],
    all: Vec<(Option<String>, Out)>,
) -> Result<Vec<Out>, RunError> {
    if all.iter().any(|(name, _)| name.is_none()) {
        return Ok(all.into_iter().map(|(_, o)| o).collect());
    }
    let given = all
        .iter()
        .filter_map(|(n, _)| n.as_deref())
        .collect::<Vec<_>>()
        .join(", ");
    let mut named = all;
    let mut ordered = Vec::with_capacity(specs.len());
    for spec in specs {
        let Some(at) = named
            .iter()
            .position(|(n, _)| n.as_deref() == Some(&spec.name))
        else {
            return Err(RunError::Unsupported(format!(
                "the model returned outputs named {}; the metadata declares output {}, which is not among them",
                given, spec.name
            )));
        };
        ordered.push(named.remove(at).1);
    }
    // Outputs the metadata does not declare: counted, so that the check names them.
    ordered.extend(named.into_iter().map(|(_, o)| o));
    Ok(ordered)
}

/// The model's outputs against the metadata's declared ones: as many, of the same datatypes.
fn check_declared(specs: &[TensorSpec], all: &[Out]) -> Result<(), RunError> {
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
    for (spec, out) in specs.iter().zip(all) {
        let got = out.datatype();
        if got != Some(spec.datatype) {
            let got = got.map_or("a dtype v2 cannot carry", Datatype::v2_name);
            return Err(RunError::Unsupported(format!(
                "the model returned {got} for output {}; the metadata declares {}",
                spec.name, spec.datatype
            )));
        }
    }
    Ok(())
}

fn strings_out(name: &str, s: &[String]) -> OutTensor {
    let mut data = Vec::with_capacity(s.iter().map(|one| 4 + one.len()).sum());
    for one in s {
        data.extend_from_slice(&(one.len() as u32).to_le_bytes());
        data.extend_from_slice(one.as_bytes());
    }
    OutTensor {
        name: name.to_string(),
        datatype: Datatype::Bytes,
        shape: vec![s.len() as i64],
        data,
    }
}

fn tensor_out(name: &str, t: &Tensor) -> Result<OutTensor, String> {
    let err = |e: tch::TchError| format!("cannot read output {name}: {e}");
    let d = dtype(t.kind()).ok_or_else(|| {
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
    let n = cpu.numel();
    let data = if n == 0 {
        Vec::new()
    } else {
        let bytes = n * cpu.kind().elt_size_in_bytes();
        // SAFETY: `cpu` is a contiguous CPU tensor of `n` elements, `bytes` bytes in all;
        // the slice lives only while `cpu` does.
        unsafe { std::slice::from_raw_parts(cpu.data_ptr() as *const u8, bytes) }.to_vec()
    };
    Ok(OutTensor {
        name: name.to_string(),
        datatype: Datatype::Tensor(d),
        shape,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(outputs: Option<&[&str]>) -> Wanted {
        Wanted {
            outputs: outputs.map(|o| o.iter().map(|s| s.to_string()).collect()),
            declared: None,
        }
    }

    #[test]
    fn outputs_come_typed_with_their_little_endian_bytes() {
        let t = Tensor::from_slice(&[1.5f32, -2.0, 0.25, 4.0]).reshape([2, 2]);
        let v = IValue::Tuple(vec![
            IValue::Tensor(t),
            IValue::StringList(vec!["ab".into(), "".into()]),
        ]);
        let all = tensors(&v, &wanted(None)).unwrap();
        let f32s: Vec<u8> = [1.5f32, -2.0, 0.25, 4.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        assert_eq!(
            all,
            vec![
                OutTensor {
                    name: "output__0".into(),
                    datatype: Datatype::Tensor(Dtype::Float32),
                    shape: vec![2, 2],
                    data: f32s,
                },
                OutTensor {
                    name: "output__1".into(),
                    datatype: Datatype::Bytes,
                    shape: vec![2],
                    data: vec![2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0],
                },
            ]
        );
        // Asked by name: in the request's order; an unknown name is the request's error.
        let picked = tensors(&v, &wanted(Some(&["output__1", "output__0"]))).unwrap();
        assert_eq!(picked[0].name, "output__1");
        assert_eq!(picked[1].name, "output__0");
        let e = tensors(&v, &wanted(Some(&["nope"]))).unwrap_err();
        assert!(
            matches!(&e, RunError::Request(m) if m.contains("output__0, output__1")),
            "{e:?}"
        );
    }

    #[test]
    fn a_dicts_keys_name_its_outputs() {
        let v = IValue::GenericDict(vec![
            (
                IValue::String("out".into()),
                IValue::Tensor(Tensor::from_slice(&[1.0f32, 2.0])),
            ),
            (
                IValue::String("aux".into()),
                IValue::Tensor(Tensor::from_slice(&[3i64])),
            ),
        ]);
        let all = tensors(&v, &wanted(None)).unwrap();
        let names: Vec<&str> = all.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["out", "aux"]);
        let picked = tensors(&v, &wanted(Some(&["aux"]))).unwrap();
        assert_eq!((picked.len(), picked[0].shape.as_slice()), (1, &[1i64][..]));
        // Declared outputs are found by name, in the metadata's order.
        let spec = |name: &str, d: Dtype| TensorSpec {
            name: name.into(),
            datatype: Datatype::Tensor(d),
            shape: None,
            document: None,
        };
        let declared = Wanted {
            outputs: None,
            declared: Some(vec![spec("aux", Dtype::Int64), spec("out", Dtype::Float32)]),
        };
        let all = tensors(&v, &declared).unwrap();
        assert_eq!(
            (all[0].name.as_str(), all[1].shape.as_slice()),
            ("aux", &[2i64][..])
        );
        let missing = Wanted {
            outputs: None,
            declared: Some(vec![spec("logits", Dtype::Float32)]),
        };
        let e = tensors(&v, &missing).unwrap_err();
        assert!(
            matches!(&e, RunError::Unsupported(m) if m.contains("named out, aux") && m.contains("declares output logits")),
            "{e:?}"
        );
    }

    #[test]
    fn a_transposed_tensor_is_made_contiguous_first() {
        let t = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6])
            .reshape([2, 3])
            .transpose(0, 1);
        let out = tensors(&IValue::Tensor(t), &wanted(None)).unwrap();
        assert_eq!(out[0].shape, vec![3, 2]);
        let back: Vec<i64> = out[0]
            .data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(back, vec![1, 4, 2, 5, 3, 6]);
    }
}
