//! Tensors in and out of the model: a validated [`InputArray`] becomes a tensor of the
//! metadata's dtype on the model's device; what the model returns becomes JSON.
//!
//! Output rules: a tensor becomes a nested array of its shape (a 0-d tensor a bare number),
//! floats as numbers with NaN and ±Inf as `null` (JSON has no such numbers), integers as
//! integers, bools as bools; a tuple or list becomes an array of its outputs; int, float and
//! bool scalars become numbers and bools. Anything else (strings, dicts, objects, None) is
//! "unsupported output type".

use serde_json::{Number, Value};
use tch::{Device, IValue, Kind, Tensor};
use vramfork::metadata::Dtype;

use crate::input::{Elements, InputArray};

pub fn kind_of(d: Dtype) -> Kind {
    match d {
        Dtype::Float32 => Kind::Float,
        Dtype::Float64 => Kind::Double,
        Dtype::Float16 => Kind::Half,
        Dtype::BFloat16 => Kind::BFloat16,
        Dtype::Int64 => Kind::Int64,
        Dtype::Int32 => Kind::Int,
        Dtype::Int16 => Kind::Int16,
        Dtype::Int8 => Kind::Int8,
        Dtype::UInt8 => Kind::Uint8,
        Dtype::Bool => Kind::Bool,
    }
}

/// The request's input as a tensor on `device`.
pub fn to_tensor(input: &InputArray, device: Device) -> Result<Tensor, tch::TchError> {
    let flat = match &input.elements {
        Elements::Float(v) => Tensor::f_from_slice(v)?,
        Elements::Int(v) => Tensor::f_from_slice(v)?,
        Elements::Bool(v) => Tensor::f_from_slice(v)?,
    };
    flat.f_reshape(input.shape.as_slice())?
        .f_to_kind(kind_of(input.dtype))?
        .f_to_device(device)
}

/// The model's output as JSON (see the module doc for the rules).
pub fn to_json(v: &IValue) -> Result<Value, String> {
    Ok(match v {
        IValue::Tensor(t) => tensor_to_json(t)?,
        IValue::Double(f) => float(*f),
        IValue::Int(i) => Value::from(*i),
        IValue::Bool(b) => Value::Bool(*b),
        IValue::Tuple(items) | IValue::GenericList(items) => {
            Value::Array(items.iter().map(to_json).collect::<Result<_, _>>()?)
        }
        IValue::TensorList(ts) => {
            Value::Array(ts.iter().map(tensor_to_json).collect::<Result<_, _>>()?)
        }
        IValue::IntList(v) => Value::from(v.clone()),
        IValue::DoubleList(v) => Value::Array(v.iter().map(|f| float(*f)).collect()),
        IValue::BoolList(v) => Value::from(v.clone()),
        other => {
            return Err(format!(
                "model returned unsupported output type {}; supported: tensors, tuples and lists of them, int, float, bool",
                type_name(other)
            ))
        }
    })
}

fn type_name(v: &IValue) -> &'static str {
    match v {
        IValue::None => "None",
        IValue::String(_) => "str",
        IValue::StringList(_) => "List[str]",
        IValue::GenericDict(_) => "Dict",
        IValue::Object(_) => "Object",
        IValue::Device(_) => "Device",
        _ => "unknown",
    }
}

fn float(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn tensor_to_json(t: &Tensor) -> Result<Value, String> {
    let err = |e: tch::TchError| format!("cannot read the model's output tensor: {e}");
    let shape = t.size();
    let cpu = t.f_to_device(Device::Cpu).map_err(err)?;
    let flat = cpu
        .f_contiguous()
        .map_err(err)?
        .f_reshape([-1])
        .map_err(err)?;
    let leaves: Vec<Value> = match t.kind() {
        Kind::Bool => Vec::<bool>::try_from(&flat)
            .map_err(err)?
            .into_iter()
            .map(Value::Bool)
            .collect(),
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64 => {
            let v = flat.f_to_kind(Kind::Int64).map_err(err)?;
            Vec::<i64>::try_from(&v)
                .map_err(err)?
                .into_iter()
                .map(Value::from)
                .collect()
        }
        Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double => {
            let v = flat.f_to_kind(Kind::Double).map_err(err)?;
            Vec::<f64>::try_from(&v)
                .map_err(err)?
                .into_iter()
                .map(float)
                .collect()
        }
        k => {
            return Err(format!(
                "model returned a tensor of unsupported dtype {k:?}"
            ))
        }
    };
    Ok(nest(&shape, &mut leaves.into_iter()))
}

/// Builds the nested array of `shape` from row-major leaves; a 0-d shape is a bare leaf.
fn nest(shape: &[i64], leaves: &mut impl Iterator<Item = Value>) -> Value {
    match shape.split_first() {
        None => leaves.next().unwrap_or(Value::Null),
        Some((&n, rest)) => Value::Array((0..n.max(0)).map(|_| nest(rest, leaves)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::parse_inputs;
    use serde_json::json;
    use vramfork::metadata::InputSpec;

    fn tensor_for(v: Value, dtype: Dtype) -> Tensor {
        let spec = InputSpec { shape: None, dtype };
        to_tensor(&parse_inputs(&v, Some(&spec)).unwrap(), Device::Cpu).unwrap()
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
    fn unsupported_outputs_are_named() {
        let e = to_json(&IValue::String("hi".into())).unwrap_err();
        assert!(e.contains("unsupported output type str"), "{e}");
        let e = to_json(&IValue::Tuple(vec![IValue::None])).unwrap_err();
        assert!(e.contains("unsupported output type None"), "{e}");
    }
}
