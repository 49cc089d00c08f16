//! A request's `inputs` (a nested JSON array) turned into a flat buffer and a shape, with
//! the element type the metadata asks for. Pure and torch-free: every way a request can be
//! wrong (ragged, non-numeric, a fraction for an integer type, out of range, wrong shape)
//! becomes a message that names where the problem is.

use serde_json::Value;
use vramfork::metadata::{kind, Dtype, InputSpec};

/// The flat elements, already checked against the target dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum Elements {
    /// For float dtypes (converted to the exact float type when the tensor is made).
    Float(Vec<f64>),
    /// For integer dtypes (range already checked).
    Int(Vec<i64>),
    Bool(Vec<bool>),
}

/// A validated request input: row-major elements, shape, and the dtype to make.
#[derive(Debug, Clone, PartialEq)]
pub struct InputArray {
    pub shape: Vec<i64>,
    pub dtype: Dtype,
    pub elements: Elements,
}

impl InputArray {
    #[cfg(test)]
    pub fn numel(&self) -> usize {
        match &self.elements {
            Elements::Float(v) => v.len(),
            Elements::Int(v) => v.len(),
            Elements::Bool(v) => v.len(),
        }
    }
}

/// Parses `inputs` for the model. `spec` is the metadata's `input` (dtype float32 and any
/// shape when absent).
pub fn parse_inputs(inputs: &Value, spec: Option<&InputSpec>) -> Result<InputArray, String> {
    let dtype = spec.map_or(Dtype::Float32, |s| s.dtype);
    if !inputs.is_array() {
        return Err(format!(
            "`inputs` must be a (nested) array of numbers, found {}",
            kind(inputs)
        ));
    }
    let shape = shape_of(inputs);
    let mut walker = Walker {
        shape: &shape,
        dtype,
        elements: match dtype {
            Dtype::Bool => Elements::Bool(Vec::new()),
            d if d.is_integer() => Elements::Int(Vec::new()),
            _ => Elements::Float(Vec::new()),
        },
        path: String::from("inputs"),
    };
    walker.walk(inputs, 0)?;
    let elements = walker.elements;
    if let Some(spec) = spec {
        spec.check_shape(&shape)?;
    }
    Ok(InputArray {
        shape,
        dtype,
        elements,
    })
}

/// The shape implied by the first element at every depth.
fn shape_of(v: &Value) -> Vec<i64> {
    let mut shape = Vec::new();
    let mut cur = v;
    while let Value::Array(items) = cur {
        shape.push(items.len() as i64);
        match items.first() {
            Some(first) => cur = first,
            None => break,
        }
    }
    shape
}

struct Walker<'a> {
    shape: &'a [i64],
    dtype: Dtype,
    elements: Elements,
    /// Where we are, e.g. `inputs[1][0]`, for messages.
    path: String,
}

impl Walker<'_> {
    fn walk(&mut self, v: &Value, depth: usize) -> Result<(), String> {
        if depth < self.shape.len() {
            let Value::Array(items) = v else {
                return Err(format!(
                    "ragged array: {} is {}, but its siblings are arrays of {} elements",
                    self.path,
                    kind(v),
                    self.shape[depth]
                ));
            };
            let want = self.shape[depth] as usize;
            if items.len() != want {
                return Err(format!(
                    "ragged array: {} has {} elements, expected {} like the first one at that depth",
                    self.path,
                    items.len(),
                    want
                ));
            }
            let len = self.path.len();
            for (i, item) in items.iter().enumerate() {
                self.path.truncate(len);
                self.path.push_str(&format!("[{i}]"));
                self.walk(item, depth + 1)?;
            }
            self.path.truncate(len);
            Ok(())
        } else {
            self.push(v)
        }
    }

    fn push(&mut self, v: &Value) -> Result<(), String> {
        let dtype = self.dtype;
        let bad = |what: &str| {
            format!(
                "{} is {what}, expected {} for dtype {dtype}",
                self.path,
                if dtype == Dtype::Bool {
                    "true or false"
                } else {
                    "a number"
                }
            )
        };
        match (&mut self.elements, v) {
            (Elements::Bool(out), Value::Bool(b)) => out.push(*b),
            (Elements::Float(out), Value::Number(n)) => {
                // serde_json numbers always have an f64 view.
                out.push(n.as_f64().unwrap_or(f64::NAN));
            }
            (Elements::Int(out), Value::Number(n)) => {
                let i = whole_number(n).ok_or_else(|| {
                    format!(
                        "{} is {n}, but dtype {dtype} takes whole numbers only",
                        self.path
                    )
                })?;
                let (lo, hi) = int_range(dtype);
                if i < lo || i > hi {
                    return Err(format!(
                        "{} is {i}, out of range for dtype {dtype} ({lo}..={hi})",
                        self.path
                    ));
                }
                out.push(i);
            }
            (_, Value::Array(_)) => {
                return Err(format!(
                    "ragged array: {} is an array, but its siblings are numbers",
                    self.path
                ))
            }
            (_, other) => return Err(bad(kind(other))),
        }
        Ok(())
    }
}

/// A JSON number as an i64 when it is whole (`3` or `3.0`).
fn whole_number(n: &serde_json::Number) -> Option<i64> {
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    let f = n.as_f64()?;
    if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 {
        Some(f as i64)
    } else {
        None
    }
}

fn int_range(d: Dtype) -> (i64, i64) {
    match d {
        Dtype::Int8 => (i8::MIN.into(), i8::MAX.into()),
        Dtype::UInt8 => (0, u8::MAX.into()),
        Dtype::Int16 => (i16::MIN.into(), i16::MAX.into()),
        Dtype::Int32 => (i32::MIN.into(), i32::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(shape: Option<Vec<i64>>, dtype: Dtype) -> InputSpec {
        InputSpec { shape, dtype }
    }

    #[test]
    fn nested_arrays_flatten_row_major_with_their_shape() {
        let a = parse_inputs(&json!([[1, 2.5, 3], [4, 5, 6]]), None).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.dtype, Dtype::Float32);
        assert_eq!(
            a.elements,
            Elements::Float(vec![1.0, 2.5, 3.0, 4.0, 5.0, 6.0])
        );
        let a = parse_inputs(&json!([[[1], [2]]]), None).unwrap();
        assert_eq!(a.shape, vec![1, 2, 1]);
    }

    #[test]
    fn empty_arrays_are_fine_when_the_shape_allows() {
        let a = parse_inputs(&json!([]), None).unwrap();
        assert_eq!((a.shape.clone(), a.numel()), (vec![0], 0));
        let a = parse_inputs(&json!([[], []]), None).unwrap();
        assert_eq!(a.shape, vec![2, 0]);
        let s = spec(Some(vec![-1, 4]), Dtype::Float32);
        let e = parse_inputs(&json!([]), Some(&s)).unwrap_err();
        assert!(e.contains("[0]") && e.contains("[-1, 4]"), "{e}");
    }

    #[test]
    fn ragged_arrays_name_where() {
        let e = parse_inputs(&json!([[1, 2], [3]]), None).unwrap_err();
        assert!(
            e.contains("ragged") && e.contains("inputs[1] has 1 elements, expected 2"),
            "{e}"
        );
        let e = parse_inputs(&json!([[1, 2], 3]), None).unwrap_err();
        assert!(
            e.contains("ragged") && e.contains("inputs[1] is a number"),
            "{e}"
        );
        let e = parse_inputs(&json!([1, [2]]), None).unwrap_err();
        assert!(
            e.contains("ragged") && e.contains("inputs[1] is an array"),
            "{e}"
        );
        let e = parse_inputs(&json!([[[1], [2]], [[3], [4, 5]]]), None).unwrap_err();
        assert!(e.contains("inputs[1][1] has 2 elements"), "{e}");
    }

    #[test]
    fn non_numbers_and_non_arrays_are_refused() {
        let e = parse_inputs(&json!([[1, "2"]]), None).unwrap_err();
        assert!(
            e.contains("inputs[0][1] is a string") && e.contains("a number"),
            "{e}"
        );
        let e = parse_inputs(&json!([null]), None).unwrap_err();
        assert!(e.contains("inputs[0] is null"), "{e}");
        let e = parse_inputs(&json!([true]), None).unwrap_err();
        assert!(e.contains("a boolean"), "{e}");
        let e = parse_inputs(&json!(5), None).unwrap_err();
        assert!(
            e.contains("must be a (nested) array") && e.contains("a number"),
            "{e}"
        );
        let e = parse_inputs(&json!({"a": 1}), None).unwrap_err();
        assert!(e.contains("an object"), "{e}");
    }

    #[test]
    fn integer_dtypes_take_whole_numbers_in_range() {
        let s = spec(None, Dtype::Int64);
        let a = parse_inputs(&json!([1, -2, 3.0]), Some(&s)).unwrap();
        assert_eq!(a.elements, Elements::Int(vec![1, -2, 3]));
        let e = parse_inputs(&json!([1, 2.5]), Some(&s)).unwrap_err();
        assert!(
            e.contains("inputs[1] is 2.5") && e.contains("whole numbers"),
            "{e}"
        );
        let u8s = spec(None, Dtype::UInt8);
        let e = parse_inputs(&json!([255, 256]), Some(&u8s)).unwrap_err();
        assert!(e.contains("out of range for dtype uint8"), "{e}");
        assert!(parse_inputs(&json!([-1]), Some(&u8s)).is_err());
        let i8s = spec(None, Dtype::Int8);
        assert!(parse_inputs(&json!([-128, 127]), Some(&i8s)).is_ok());
    }

    #[test]
    fn bool_dtype_takes_booleans_only() {
        let s = spec(Some(vec![2]), Dtype::Bool);
        let a = parse_inputs(&json!([true, false]), Some(&s)).unwrap();
        assert_eq!(a.elements, Elements::Bool(vec![true, false]));
        let e = parse_inputs(&json!([1, 0]), Some(&s)).unwrap_err();
        assert!(e.contains("true or false"), "{e}");
    }

    #[test]
    fn shape_is_checked_against_the_metadata() {
        let s = spec(Some(vec![-1, 4]), Dtype::Float64);
        let a = parse_inputs(&json!([[1, 2, 3, 4]]), Some(&s)).unwrap();
        assert_eq!(a.dtype, Dtype::Float64);
        let e = parse_inputs(&json!([[1, 2, 3]]), Some(&s)).unwrap_err();
        assert!(e.contains("[1, 3]") && e.contains("[-1, 4]"), "{e}");
    }
}
