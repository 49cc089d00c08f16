//! Tensors in and out of the model: a parsed argument ([`Arg`]) moves to the model's device; what
//! the model returns is written as JSON text straight from the tensors' memory (no tree of
//! JSON values in between).
//!
//! Output rules: a tensor becomes a nested array of its shape (a 0-d tensor a bare number),
//! floats as numbers in their shortest exact form (float32 and narrower as float32) with NaN
//! and ±Inf as `null` (JSON has no such numbers), integers as integers, bools as bools; a
//! tuple or list becomes an array of its outputs; a dict with string keys (torchvision's
//! segmentation models return `{"out": …, "aux": …}`) becomes an object of its named
//! outputs, in the dict's order; int, float and bool scalars become numbers and bools;
//! strings (a text model's `str` or `List[str]`) become JSON strings. Anything else
//! (a dict with other keys, objects, None) is "unsupported output type".

use tch::{Device, IValue, Kind, Tensor};

use crate::args::Arg;

/// A model argument as the model takes it: a tensor on `device` (already of the declared
/// dtype and the request's shape; on the CPU this is the same tensor), or a `List[str]`.
pub fn to_ivalue(arg: &Arg, device: Device) -> Result<IValue, tch::TchError> {
    Ok(match arg {
        Arg::Tensor(t) | Arg::Padded { tensor: t, .. } if device == Device::Cpu => {
            IValue::Tensor(t.shallow_clone())
        }
        Arg::Tensor(t) | Arg::Padded { tensor: t, .. } => IValue::Tensor(t.f_to_device(device)?),
        Arg::Strings(s) => IValue::StringList(s.clone()),
        // Pre-processing turns every blob into a tensor before a request is queued.
        Arg::Blobs(_) => {
            return Err(tch::TchError::Convert(
                "raw document bytes reached the model without pre-processing".into(),
            ))
        }
    })
}

/// Writes the model's output as JSON to `out` (see the module doc for the rules).
pub fn write_json(v: &IValue, out: &mut Vec<u8>) -> Result<(), String> {
    match v {
        IValue::Tensor(t) => write_tensor(t, out)?,
        IValue::Double(f) => write_f64(*f, out),
        IValue::Int(i) => write_int(*i, out),
        IValue::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        IValue::String(s) => {
            serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail")
        }
        IValue::StringList(v) => {
            serde_json::to_writer(&mut *out, v).expect("writing to a Vec cannot fail")
        }
        IValue::Tuple(items) | IValue::GenericList(items) => {
            write_list(items, out, write_json)?;
        }
        IValue::TensorList(ts) => write_list(ts, out, write_tensor)?,
        IValue::GenericDict(pairs) => write_dict(pairs, out)?,
        IValue::IntList(v) => write_list(v, out, |i, o| {
            write_int(*i, o);
            Ok(())
        })?,
        IValue::DoubleList(v) => write_list(v, out, |f, o| {
            write_f64(*f, o);
            Ok(())
        })?,
        IValue::BoolList(v) => write_list(v, out, |b, o| {
            o.extend_from_slice(if *b { b"true" } else { b"false" });
            Ok(())
        })?,
        other => {
            return Err(format!(
                "model returned unsupported output type {}; supported: tensors, tuples, lists and dicts (with str keys) of them, int, float, bool, str",
                type_name(other)
            ))
        }
    }
    Ok(())
}

/// A dict of named outputs as a JSON object, in the dict's order.
fn write_dict(pairs: &[(IValue, IValue)], out: &mut Vec<u8>) -> Result<(), String> {
    out.push(b'{');
    for (i, (key, value)) in pairs.iter().enumerate() {
        let IValue::String(name) = key else {
            return Err(format!(
                "model returned a dict with {} keys; a dict output needs str keys (its outputs' names)",
                type_name(key)
            ));
        };
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, name).expect("writing to a Vec cannot fail");
        out.push(b':');
        write_json(value, out)?;
    }
    out.push(b'}');
    Ok(())
}

fn write_list<T>(
    items: &[T],
    out: &mut Vec<u8>,
    each: impl Fn(&T, &mut Vec<u8>) -> Result<(), String>,
) -> Result<(), String> {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        each(item, out)?;
    }
    out.push(b']');
    Ok(())
}

pub(super) fn type_name(v: &IValue) -> &'static str {
    match v {
        IValue::None => "None",
        IValue::String(_) => "str",
        IValue::StringList(_) => "List[str]",
        IValue::GenericDict(_) => "Dict",
        IValue::Object(_) => "Object",
        IValue::Device(_) => "Device",
        IValue::Tensor(_) => "Tensor",
        IValue::Int(_) => "int",
        IValue::Double(_) => "float",
        IValue::Bool(_) => "bool",
        IValue::Tuple(_) => "Tuple",
        _ => "unknown",
    }
}

pub(super) fn write_int(i: i64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
}

fn write_f64(f: f64, out: &mut Vec<u8>) {
    if f.is_finite() {
        out.extend_from_slice(ryu::Buffer::new().format_finite(f).as_bytes());
    } else {
        out.extend_from_slice(b"null");
    }
}

fn write_f32(f: f32, out: &mut Vec<u8>) {
    if f.is_finite() {
        out.extend_from_slice(ryu::Buffer::new().format_finite(f).as_bytes());
    } else {
        out.extend_from_slice(b"null");
    }
}

fn write_tensor(t: &Tensor, out: &mut Vec<u8>) -> Result<(), String> {
    write_tensor_as(t, &t.size(), out)
}

/// Writes `t`'s elements as the nested array of `shape` (its own shape, or `[numel]` for a
/// flat row-major array).
pub(super) fn write_tensor_as(t: &Tensor, shape: &[i64], out: &mut Vec<u8>) -> Result<(), String> {
    let err = |e: tch::TchError| format!("cannot read the model's output tensor: {e}");
    // A CPU tensor as it is: `to` and `contiguous` would return it unchanged, each through
    // the dispatcher (about a microsecond apiece, which small models pay per request).
    let cpu = if t.device() == Device::Cpu {
        t.shallow_clone()
    } else {
        t.f_to_device(Device::Cpu).map_err(err)?
    };
    // Narrow floats are written as float32, small integers as int64.
    let cpu = match t.kind() {
        Kind::Half | Kind::BFloat16 => cpu.f_to_kind(Kind::Float).map_err(err)?,
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int => {
            cpu.f_to_kind(Kind::Int64).map_err(err)?
        }
        Kind::Bool | Kind::Float | Kind::Double | Kind::Int64 => cpu,
        k => {
            return Err(format!(
                "model returned a tensor of unsupported dtype {k:?}"
            ))
        }
    };
    let flat = if cpu.is_contiguous() {
        cpu
    } else {
        cpu.f_contiguous().map_err(err)?
    };
    let n = flat.numel();
    out.reserve(n * 8);
    match flat.kind() {
        Kind::Float => write_nested(shape, elements::<f32>(&flat, n), out, |v, o| {
            write_f32(*v, o)
        }),
        Kind::Double => write_nested(shape, elements::<f64>(&flat, n), out, |v, o| {
            write_f64(*v, o)
        }),
        Kind::Int64 => write_nested(shape, elements::<i64>(&flat, n), out, |v, o| {
            write_int(*v, o)
        }),
        _ => write_nested(shape, elements::<bool>(&flat, n), out, |v, o| {
            o.extend_from_slice(if *v { b"true" } else { b"false" })
        }),
    }
    Ok(())
}

/// The elements of a contiguous CPU tensor of kind `T::KIND`, borrowed from its memory.
pub(super) fn elements<T: tch::kind::Element>(t: &Tensor, n: usize) -> &[T] {
    assert_eq!(t.kind(), T::KIND);
    assert!(t.is_contiguous() && t.device() == Device::Cpu);
    if n == 0 {
        return &[];
    }
    // SAFETY: `t` is a contiguous CPU tensor of `n` elements of type T (checked above);
    // the slice borrows `t`, which keeps the storage alive and unchanged meanwhile.
    unsafe { std::slice::from_raw_parts(t.data_ptr() as *const T, n) }
}

/// Writes row-major `leaves` as the nested array of `shape` (a 0-d shape: a bare leaf).
fn write_nested<T>(
    shape: &[i64],
    leaves: &[T],
    out: &mut Vec<u8>,
    leaf: impl Fn(&T, &mut Vec<u8>),
) {
    fn go<T>(
        shape: &[i64],
        leaves: &[T],
        at: &mut usize,
        out: &mut Vec<u8>,
        leaf: &impl Fn(&T, &mut Vec<u8>),
    ) {
        match shape.split_first() {
            None => {
                match leaves.get(*at) {
                    Some(v) => leaf(v, out),
                    None => out.extend_from_slice(b"null"),
                }
                *at += 1;
            }
            Some((&n, rest)) => {
                out.push(b'[');
                for i in 0..n.max(0) {
                    if i > 0 {
                        out.push(b',');
                    }
                    go(rest, leaves, at, out, leaf);
                }
                out.push(b']');
            }
        }
    }
    let mut at = 0;
    go(shape, leaves, &mut at, out, &leaf);
}

/// The output as a JSON value (tests).
#[cfg(test)]
pub fn to_json(v: &IValue) -> Result<serde_json::Value, String> {
    let mut out = Vec::new();
    write_json(v, &mut out)?;
    Ok(serde_json::from_slice(&out).expect("the writer writes JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::numeric::parse_body;
    use serde_json::{json, Value};
    use vramfork::metadata::Dtype;
    use vramfork::metadata::InputSpec;

    fn tensor_for(v: Value, dtype: Dtype) -> Tensor {
        let spec = InputSpec { shape: None, dtype };
        let body = json!({ "inputs": v }).to_string();
        parse_body(body.as_bytes(), Some(&spec)).unwrap().tensor
    }

    #[test]
    fn inputs_become_tensors_of_the_asked_dtype_and_shape() {
        let cases = [
            (Dtype::Float32, Kind::Float),
            (Dtype::Float64, Kind::Double),
            (Dtype::Float16, Kind::Half),
            (Dtype::BFloat16, Kind::BFloat16),
            (Dtype::Int64, Kind::Int64),
            (Dtype::Int32, Kind::Int),
            (Dtype::Int16, Kind::Int16),
            (Dtype::Int8, Kind::Int8),
            (Dtype::UInt8, Kind::Uint8),
        ];
        for (d, k) in cases {
            let t = tensor_for(json!([[1, 2, 3], [4, 5, 6]]), d);
            assert_eq!(t.kind(), k, "{d}");
            assert_eq!(t.size(), vec![2, 3]);
            let want = if d.is_integer() {
                json!([[1, 2, 3], [4, 5, 6]])
            } else {
                json!([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
            };
            assert_eq!(to_json(&IValue::Tensor(t)).unwrap(), want, "{d}");
        }
        let t = tensor_for(json!([true, false]), Dtype::Bool);
        assert_eq!(t.kind(), Kind::Bool);
        assert_eq!(to_json(&IValue::Tensor(t)).unwrap(), json!([true, false]));
    }

    #[test]
    fn empty_and_zero_d_tensors() {
        let t = tensor_for(json!([[], []]), Dtype::Float32);
        assert_eq!(t.size(), vec![2, 0]);
        assert_eq!(to_json(&IValue::Tensor(t)).unwrap(), json!([[], []]));
        let scalar = Tensor::from(2.5f64);
        assert_eq!(scalar.size(), Vec::<i64>::new());
        assert_eq!(to_json(&IValue::Tensor(scalar)).unwrap(), json!(2.5));
        let iscalar = Tensor::from(7i64);
        assert_eq!(to_json(&IValue::Tensor(iscalar)).unwrap(), json!(7));
    }

    #[test]
    fn nan_and_inf_become_null() {
        let t = Tensor::from_slice(&[1.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        assert_eq!(
            to_json(&IValue::Tensor(t)).unwrap(),
            json!([1.0, null, null, null])
        );
        assert_eq!(to_json(&IValue::Double(f64::NAN)).unwrap(), Value::Null);
    }

    #[test]
    fn floats_are_written_in_their_shortest_exact_form() {
        let t = Tensor::from_slice(&[0.1f32, 1e-7, 3.0]);
        let mut out = Vec::new();
        write_json(&IValue::Tensor(t), &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "[0.1,1e-7,3.0]");
        let t = Tensor::from_slice(&[0.1f64]);
        let mut out = Vec::new();
        write_json(&IValue::Tensor(t), &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "[0.1]");
        // A non-contiguous view is written in its own order.
        let t = Tensor::from_slice(&[1i64, 2, 3, 4])
            .reshape([2, 2])
            .transpose(0, 1);
        assert_eq!(
            to_json(&IValue::Tensor(t)).unwrap(),
            json!([[1, 3], [2, 4]])
        );
    }

    #[test]
    fn tuples_lists_and_scalars() {
        let v = IValue::Tuple(vec![
            IValue::Tensor(Tensor::from_slice(&[1i64, 2])),
            IValue::GenericList(vec![
                IValue::Int(3),
                IValue::Double(0.5),
                IValue::Bool(true),
            ]),
            IValue::TensorList(vec![Tensor::from_slice(&[0.25f64])]),
            IValue::DoubleList(vec![1.5]),
        ]);
        assert_eq!(
            to_json(&v).unwrap(),
            json!([[1, 2], [3, 0.5, true], [[0.25]], [1.5]])
        );
    }

    #[test]
    fn strings_are_json_strings() {
        let v = IValue::Tuple(vec![
            IValue::GenericList(vec![
                IValue::String("naïve \"quoted\"".into()),
                IValue::String("".into()),
            ]),
            IValue::String("one".into()),
            IValue::StringList(vec!["a\nb".into()]),
        ]);
        assert_eq!(
            to_json(&v).unwrap(),
            json!([["naïve \"quoted\"", ""], "one", ["a\nb"]])
        );
    }

    #[test]
    fn a_dict_with_str_keys_is_an_object_of_named_outputs() {
        let v = IValue::GenericDict(vec![
            (
                IValue::String("out".into()),
                IValue::Tensor(Tensor::from_slice(&[1i64, 2])),
            ),
            (IValue::String("aux".into()), IValue::Double(0.5)),
        ]);
        let mut text = Vec::new();
        write_json(&v, &mut text).unwrap();
        // In the dict's order.
        assert_eq!(
            String::from_utf8(text).unwrap(),
            r#"{"out":[1,2],"aux":0.5}"#
        );
        assert_eq!(to_json(&IValue::GenericDict(vec![])).unwrap(), json!({}));
    }

    #[test]
    fn unsupported_outputs_are_named() {
        let e = to_json(&IValue::GenericDict(vec![(IValue::Int(1), IValue::Int(2))])).unwrap_err();
        assert!(e.contains("a dict with int keys"), "{e}");
        let e = to_json(&IValue::Tuple(vec![IValue::None])).unwrap_err();
        assert!(e.contains("unsupported output type None"), "{e}");
    }
}
