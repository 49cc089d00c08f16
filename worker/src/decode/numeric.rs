//! A request body `{"inputs": <nested array>}` turned into the tensor the model gets, in one
//! pass over the bytes: numbers are written straight into the tensor's buffer as they are
//! parsed, with no tree of JSON values in between, so a request costs about its body plus
//! its tensor in memory. Every way a request can be wrong (not JSON, ragged, non-numeric, a
//! fraction for an integer type, out of range for the dtype, wrong shape) becomes a message
//! that names where the problem is.
//!
//! The buffer is allocated once, for as many elements as the body could possibly hold (each
//! number takes at least two bytes with its separator); pages past the elements written are
//! never touched, so they cost address space, not memory. The tensor handed on is a view of
//! the elements written.
//!
//! Used for `POST /` bodies with one numeric input (`post.rs` chooses).

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tch::{Device, Kind, Tensor};
use vramfork::metadata::{Dtype, InputSpec};

use super::nesting::Nesting;
use super::{BodyError, NOT_AN_OBJECT};
use crate::args::{int_range, kind_of, Arg, Inputs};

/// A validated request input: a contiguous CPU tensor of the metadata's dtype and the
/// request's shape.
#[derive(Debug)]
pub struct InputArray {
    pub tensor: Tensor,
}

impl From<InputArray> for Inputs {
    fn from(a: InputArray) -> Inputs {
        Inputs {
            args: vec![Arg::Tensor(a.tensor)],
        }
    }
}

/// Parses a request body for the model. `spec` is the metadata's `input` (dtype float32 and
/// any shape when absent).
pub fn parse_body(body: &[u8], spec: Option<&InputSpec>) -> Result<InputArray, BodyError> {
    let dtype = spec.map_or(Dtype::Float32, |s| s.dtype);
    let mut p = Parser::new(dtype, body.len() / 2 + 1);
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = DocSeed { p: &mut p }
        .deserialize(&mut de)
        .and_then(|()| de.end());
    if let Some(m) = p.err.take() {
        return Err(BodyError::Invalid(m));
    }
    if let Err(e) = parsed {
        return Err(BodyError::NotJson(e.to_string()));
    }
    if !p.found {
        return Err(BodyError::Invalid(
            "request body has no `inputs` field; send {\"inputs\": <nested array of numbers>}"
                .into(),
        ));
    }
    let shape = p.nest.shape();
    if let Some(spec) = spec {
        spec.check_shape(&shape).map_err(BodyError::Invalid)?;
    }
    let tensor = p
        .sink
        .finish(&shape, dtype)
        .map_err(|e| BodyError::Invalid(format!("cannot make the input tensor: {e}")))?;
    Ok(InputArray { tensor })
}

/// A JSON number as the parser saw it.
#[derive(Debug, Clone, Copy)]
enum Num {
    U(u64),
    I(i64),
    F(f64),
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::U(v) => write!(f, "{v}"),
            Num::I(v) => write!(f, "{v}"),
            Num::F(v) if *v != 0.0 && (v.abs() >= 1e16 || v.abs() < 1e-6) => write!(f, "{v:e}"),
            Num::F(v) => write!(f, "{v}"),
        }
    }
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            Num::U(v) => v as f64,
            Num::I(v) => v as f64,
            Num::F(v) => v,
        }
    }

    /// The number as an i64 when it is whole (`3` or `3.0`).
    fn whole(self) -> Option<i64> {
        match self {
            Num::U(v) => i64::try_from(v).ok(),
            Num::I(v) => Some(v),
            Num::F(f) if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 => {
                Some(f as i64)
            }
            Num::F(_) => None,
        }
    }
}

/// The tensor being filled: its storage type follows the dtype (16-bit floats are kept as
/// float32 and converted once at the end). Also filled by `elements.rs`.
pub(super) struct Sink {
    tensor: Tensor,
    /// The tensor's first element (asked of libtorch once: an FFI call per element cost
    /// about a tenth of a 63 kB body's parse).
    data: *mut u8,
    kind: Kind,
    cap: usize,
    len: usize,
}

impl Sink {
    pub(super) fn new(dtype: Dtype, cap: usize) -> Sink {
        let kind = storage_kind(dtype);
        let tensor = Tensor::empty([cap as i64], (kind, Device::Cpu));
        let data = tensor.data_ptr().cast();
        Sink {
            tensor,
            data,
            kind,
            cap,
            len: 0,
        }
    }

    /// Appends one element (already converted to the storage type's value).
    pub(super) fn push<T: tch::kind::Element>(&mut self, v: T) {
        debug_assert_eq!(T::KIND, self.kind);
        // Each element needs at least two bytes of body, so `cap` always suffices; the
        // check keeps a bug from writing out of bounds.
        assert!(self.len < self.cap, "input buffer too small");
        // SAFETY: `data` is the first element of the tensor, a contiguous CPU tensor of `cap`
        // elements of type T (its kind is T::KIND, checked above), owned by `self` and
        // alive for this write (its storage never moves); `len < cap` keeps the write
        // inside it.
        unsafe { self.data.cast::<T>().add(self.len).write(v) };
        self.len += 1;
    }

    /// The elements written, as a tensor of `shape` and `dtype` (a view: no copy, unless a
    /// 16-bit float dtype needs the conversion).
    pub(super) fn finish(self, shape: &[i64], dtype: Dtype) -> Result<Tensor, tch::TchError> {
        let t = self
            .tensor
            .f_narrow(0, 0, self.len as i64)?
            .f_reshape(shape)?;
        let want = kind_of(dtype);
        if want == self.kind {
            Ok(t)
        } else {
            t.f_to_kind(want)
        }
    }
}

fn storage_kind(d: Dtype) -> Kind {
    match d {
        Dtype::Float32 | Dtype::Float16 | Dtype::BFloat16 => Kind::Float,
        other => kind_of(other),
    }
}

/// Magnitudes from which a float dtype rounds to infinity (its largest finite value plus
/// half a step); JSON has no infinities, so a number this large is refused rather than
/// silently becoming one.
fn float_overflow(d: Dtype) -> f64 {
    match d {
        // 65504 + 16
        Dtype::Float16 => 65520.0,
        // (2 - 2^-8) × 2^127
        Dtype::BFloat16 => 3.396_177_529_430_4e38,
        // (2 - 2^-24) × 2^127
        Dtype::Float32 => 3.402_823_567_797_336_6e38,
        _ => f64::INFINITY,
    }
}

struct Parser {
    dtype: Dtype,
    sink: Sink,
    /// The shape so far, and where the parse is.
    nest: Nesting,
    /// `inputs` was there.
    found: bool,
    /// The first problem (a request error, not a JSON syntax error).
    err: Option<String>,
}

impl Parser {
    fn new(dtype: Dtype, cap: usize) -> Parser {
        Parser {
            dtype,
            sink: Sink::new(dtype, cap),
            nest: Nesting::default(),
            found: false,
            err: None,
        }
    }

    fn here(&self) -> String {
        self.nest.here()
    }

    /// Records a request error and returns the error that stops the parse.
    fn fail<E: de::Error>(&mut self, msg: String) -> E {
        if self.err.is_none() {
            self.err = Some(msg);
        }
        E::custom("invalid request")
    }

    /// A leaf (number or boolean) at `depth`: its place must be a leaf's.
    fn leaf<E: de::Error>(&mut self, depth: usize, what: &str) -> Result<(), E> {
        if depth == 0 {
            return Err(self.fail(format!(
                "`inputs` must be a (nested) array of numbers, found {what}"
            )));
        }
        if let Err(r) = self.nest.value(depth) {
            let m = r.message(&self.here(), what);
            return Err(self.fail(m));
        }
        Ok(())
    }

    fn number<E: de::Error>(&mut self, depth: usize, n: Num) -> Result<(), E> {
        self.leaf(depth, "a number")?;
        let dtype = self.dtype;
        match dtype {
            Dtype::Bool => Err(self.fail(format!(
                "{} is a number, expected true or false for dtype bool",
                self.here()
            ))),
            Dtype::Float64 => {
                self.sink.push(n.as_f64());
                Ok(())
            }
            Dtype::Float32 | Dtype::Float16 | Dtype::BFloat16 => {
                let f = n.as_f64();
                if f.abs() >= float_overflow(dtype) {
                    return Err(self.fail(format!(
                        "{} is {n}, out of range for dtype {dtype} (it would become infinity)",
                        self.here(),
                    )));
                }
                self.sink.push(f as f32);
                Ok(())
            }
            _ => {
                let Some(i) = n.whole() else {
                    return Err(self.fail(format!(
                        "{} is {n}, but dtype {dtype} takes whole numbers only",
                        self.here()
                    )));
                };
                let (lo, hi) = int_range(dtype);
                if i < lo || i > hi {
                    return Err(self.fail(format!(
                        "{} is {i}, out of range for dtype {dtype} ({lo}..={hi})",
                        self.here()
                    )));
                }
                match dtype {
                    Dtype::Int64 => self.sink.push(i),
                    Dtype::Int32 => self.sink.push(i as i32),
                    Dtype::Int16 => self.sink.push(i as i16),
                    Dtype::Int8 => self.sink.push(i as i8),
                    _ => self.sink.push(i as u8),
                }
                Ok(())
            }
        }
    }

    fn boolean<E: de::Error>(&mut self, depth: usize, b: bool) -> Result<(), E> {
        if self.dtype != Dtype::Bool {
            return self.wrong(depth, "a boolean");
        }
        self.leaf(depth, "a boolean")?;
        self.sink.push(b);
        Ok(())
    }

    /// A value that is neither an array nor an element of the dtype.
    fn wrong<E: de::Error>(&mut self, depth: usize, what: &str) -> Result<(), E> {
        if depth == 0 {
            return Err(self.fail(format!(
                "`inputs` must be a (nested) array of numbers, found {what}"
            )));
        }
        let expected = if self.dtype == Dtype::Bool {
            "true or false"
        } else {
            "a number"
        };
        Err(self.fail(format!(
            "{} is {what}, expected {expected} for dtype {}",
            self.here(),
            self.dtype
        )))
    }
}

/// The whole body: an object whose `inputs` is parsed, the other fields skipped.
struct DocSeed<'a> {
    p: &'a mut Parser,
}

impl<'de> DeserializeSeed<'de> for DocSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "inputs" {
                if self.p.found {
                    return Err(self.p.fail("request body has `inputs` twice".into()));
                }
                self.p.found = true;
                map.next_value_seed(Node {
                    p: self.p,
                    depth: 0,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(self.p.fail(NOT_AN_OBJECT.into()))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(self.p.fail(NOT_AN_OBJECT.into()))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(self.p.fail(NOT_AN_OBJECT.into()))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(self.p.fail(NOT_AN_OBJECT.into()))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(self.p.fail(NOT_AN_OBJECT.into()))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(self.p.fail(NOT_AN_OBJECT.into()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(self.p.fail(NOT_AN_OBJECT.into()))
    }
}

/// One value inside `inputs`, at `depth` (0 = `inputs` itself).
struct Node<'a> {
    p: &'a mut Parser,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a nested array of numbers")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (p, depth) = (self.p, self.depth);
        if let Err(r) = p.nest.array_opens(depth) {
            let m = r.message(&p.here(), "an array");
            return Err(p.fail(m));
        }
        let mut n = 0usize;
        loop {
            p.nest.enter(n);
            let more = seq.next_element_seed(Node {
                p: &mut *p,
                depth: depth + 1,
            })?;
            p.nest.leave();
            if more.is_none() {
                break;
            }
            n += 1;
        }
        p.nest.array_closes(depth, n).map_err(|r| {
            let m = r.message(&p.here(), "an array");
            p.fail(m)
        })
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.p.number(self.depth, Num::U(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.p.number(self.depth, Num::I(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.p.number(self.depth, Num::F(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.p.boolean(self.depth, v)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.p.wrong(self.depth, "a string")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.p.wrong(self.depth, "null")
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        self.p.wrong(self.depth, "an object")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn spec(shape: Option<Vec<i64>>, dtype: Dtype) -> InputSpec {
        InputSpec { shape, dtype }
    }

    /// `inputs` = `v`, parsed for `spec`; errors as their message.
    fn parse(v: Value, spec: Option<&InputSpec>) -> Result<InputArray, String> {
        let body = json!({ "inputs": v }).to_string();
        parse_body(body.as_bytes(), spec).map_err(|e| e.to_string())
    }

    fn values(a: &InputArray) -> Vec<f64> {
        let flat = a.tensor.reshape([-1]).to_kind(Kind::Double);
        Vec::<f64>::try_from(&flat).unwrap()
    }

    #[test]
    fn nested_arrays_fill_the_tensor_row_major_with_their_shape() {
        let a = parse(json!([[1, 2.5, 3], [4, 5, 6]]), None).unwrap();
        assert_eq!(a.tensor.size(), vec![2, 3]);
        assert_eq!(a.tensor.size(), vec![2, 3]);
        assert_eq!(a.tensor.kind(), Kind::Float);
        assert_eq!(values(&a), vec![1.0, 2.5, 3.0, 4.0, 5.0, 6.0]);
        let a = parse(json!([[[1], [2]]]), None).unwrap();
        assert_eq!(a.tensor.size(), vec![1, 2, 1]);
    }

    #[test]
    fn other_fields_are_skipped_and_the_body_must_be_an_object_with_inputs() {
        let body = br#"{"id": "x", "parameters": {"a": [1, 2]}, "inputs": [[1]], "z": null}"#;
        assert_eq!(parse_body(body, None).unwrap().tensor.size(), vec![1, 1]);
        let e = parse_body(b"[[1, 2]]", None).unwrap_err();
        assert!(e.to_string().contains("must be a JSON object"), "{e}");
        let e = parse_body(br#"{"input": [1]}"#, None).unwrap_err();
        assert!(e.to_string().contains("no `inputs` field"), "{e}");
        for bad in [
            &b""[..],
            b"{\"inputs\": [[1, 2",
            b"{\"inputs\": [1]} x",
            b"{]",
        ] {
            let e = parse_body(bad, None).unwrap_err();
            assert!(matches!(e, BodyError::NotJson(_)), "{e:?}");
            assert!(e.to_string().contains("not valid JSON"), "{e}");
        }
        let e = parse_body(br#"{"inputs": [1], "inputs": [2]}"#, None).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }

    #[test]
    fn empty_arrays_are_fine_when_the_shape_allows() {
        let a = parse(json!([]), None).unwrap();
        assert_eq!((a.tensor.size(), a.tensor.numel()), (vec![0], 0));
        let a = parse(json!([[], []]), None).unwrap();
        assert_eq!(a.tensor.size(), vec![2, 0]);
        let s = spec(Some(vec![-1, 4]), Dtype::Float32);
        let e = parse(json!([]), Some(&s)).unwrap_err();
        assert!(e.contains("[0]") && e.contains("[-1, 4]"), "{e}");
    }

    #[test]
    fn ragged_arrays_name_where() {
        let e = parse(json!([[1, 2], [3]]), None).unwrap_err();
        assert!(
            e.contains("ragged") && e.contains("inputs[1] has 1 elements, expected 2"),
            "{e}"
        );
        let e = parse(json!([[1, 2], 3]), None).unwrap_err();
        assert!(
            e.contains("ragged") && e.contains("inputs[1] is a number"),
            "{e}"
        );
        let e = parse(json!([1, [2]]), None).unwrap_err();
        assert!(
            e.contains("ragged") && e.contains("inputs[1] is an array"),
            "{e}"
        );
        let e = parse(json!([[[1], [2]], [[3], [4, 5]]]), None).unwrap_err();
        assert!(e.contains("inputs[1][1] has 2 elements"), "{e}");
        let e = parse(json!([[], 3]), None).unwrap_err();
        assert!(
            e.contains("ragged") && e.contains("inputs[1] is a number"),
            "{e}"
        );
        let e = parse(json!([[1], [[2]]]), None).unwrap_err();
        assert!(e.contains("inputs[1][0] is an array"), "{e}");
    }

    #[test]
    fn non_numbers_and_non_arrays_are_refused() {
        let e = parse(json!([[1, "2"]]), None).unwrap_err();
        assert!(
            e.contains("inputs[0][1] is a string") && e.contains("a number"),
            "{e}"
        );
        let e = parse(json!([null]), None).unwrap_err();
        assert!(e.contains("inputs[0] is null"), "{e}");
        let e = parse(json!([true]), None).unwrap_err();
        assert!(e.contains("a boolean"), "{e}");
        let e = parse(json!(5), None).unwrap_err();
        assert!(
            e.contains("must be a (nested) array") && e.contains("a number"),
            "{e}"
        );
        let e = parse(json!({"a": 1}), None).unwrap_err();
        assert!(e.contains("an object"), "{e}");
        let e = parse(json!([[{"a": 1}]]), None).unwrap_err();
        assert!(e.contains("inputs[0][0] is an object"), "{e}");
    }

    #[test]
    fn integer_dtypes_take_whole_numbers_in_range() {
        let s = spec(None, Dtype::Int64);
        let a = parse(json!([1, -2, 3.0]), Some(&s)).unwrap();
        assert_eq!(a.tensor.kind(), Kind::Int64);
        assert_eq!(Vec::<i64>::try_from(&a.tensor).unwrap(), vec![1, -2, 3]);
        let e = parse(json!([1, 2.5]), Some(&s)).unwrap_err();
        assert!(
            e.contains("inputs[1] is 2.5") && e.contains("whole numbers"),
            "{e}"
        );
        let u8s = spec(None, Dtype::UInt8);
        let e = parse(json!([255, 256]), Some(&u8s)).unwrap_err();
        assert!(e.contains("out of range for dtype uint8"), "{e}");
        assert!(parse(json!([-1]), Some(&u8s)).is_err());
        let i8s = spec(None, Dtype::Int8);
        let a = parse(json!([-128, 127]), Some(&i8s)).unwrap();
        assert_eq!(a.tensor.kind(), Kind::Int8);
        assert_eq!(values(&a), vec![-128.0, 127.0]);
        let big = spec(None, Dtype::Int64);
        assert!(parse(json!([18446744073709551615u64]), Some(&big)).is_err());
    }

    #[test]
    fn float_dtypes_refuse_numbers_they_cannot_hold() {
        // JSON has no infinities: a float32 overflow would silently become one.
        let e = parse(json!([1.0, 1e39]), None).unwrap_err();
        assert!(
            e.contains("inputs[1] is 1e39") && e.contains("out of range for dtype float32"),
            "{e}"
        );
        let f16 = spec(None, Dtype::Float16);
        assert!(parse(json!([70000]), Some(&f16)).is_err());
        let a = parse(json!([65504, -1.5]), Some(&f16)).unwrap();
        assert_eq!(a.tensor.kind(), Kind::Half);
        assert_eq!(values(&a), vec![65504.0, -1.5]);
        let f64s = spec(None, Dtype::Float64);
        let a = parse(json!([1e300]), Some(&f64s)).unwrap();
        assert_eq!(values(&a), vec![1e300]);
        // The largest float32 itself is fine, and so is what rounds to it.
        let a = parse(json!([f32::MAX as f64, -3.4028235e38]), None).unwrap();
        assert_eq!(values(&a), vec![f32::MAX as f64, f32::MIN as f64]);
        assert!(parse(json!([3.41e38]), None).is_err());
        let bf16 = spec(None, Dtype::BFloat16);
        assert!(parse(json!([3.38e38]), Some(&bf16)).is_ok());
        assert!(parse(json!([3.4e38]), Some(&bf16)).is_err());
    }

    #[test]
    fn bool_dtype_takes_booleans_only() {
        let s = spec(Some(vec![2]), Dtype::Bool);
        let a = parse(json!([true, false]), Some(&s)).unwrap();
        assert_eq!(a.tensor.kind(), Kind::Bool);
        assert_eq!(Vec::<bool>::try_from(&a.tensor).unwrap(), vec![true, false]);
        let e = parse(json!([1, 0]), Some(&s)).unwrap_err();
        assert!(e.contains("true or false"), "{e}");
    }

    #[test]
    fn shape_is_checked_against_the_metadata() {
        let s = spec(Some(vec![-1, 4]), Dtype::Float64);
        let a = parse(json!([[1, 2, 3, 4]]), Some(&s)).unwrap();
        assert_eq!(a.tensor.kind(), Kind::Double);
        let e = parse(json!([[1, 2, 3]]), Some(&s)).unwrap_err();
        assert!(e.contains("[1, 3]") && e.contains("[-1, 4]"), "{e}");
    }

    #[test]
    fn the_densest_body_fits_its_buffer() {
        // "0," per element: the fewest bytes a number can take.
        let n = 100_000;
        let body = format!("{{\"inputs\":[{}0]}}", "0,".repeat(n - 1));
        let a = parse_body(body.as_bytes(), None).unwrap();
        assert_eq!(a.tensor.size(), vec![n as i64]);
        let body = format!("{{\"inputs\":[{}]}}", vec!["[0]"; 1000].join(","));
        assert_eq!(
            parse_body(body.as_bytes(), None).unwrap().tensor.size(),
            vec![1000, 1]
        );
    }
}
