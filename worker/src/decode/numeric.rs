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
use tch::Tensor;
use vramfork::metadata::{Dtype, InputSpec};

use super::nesting::Nesting;
use super::quick;
use super::sink::Sink;
use super::{BodyError, NOT_AN_OBJECT};
use crate::args::{int_range, Arg, Inputs};

/// The refusal of `{"inputs": {…}}` for a model that declares no named input: `post.rs`
/// reads that form by name when the metadata names the one input.
pub const INPUTS_IS_AN_OBJECT: &str = "`inputs` must be a (nested) array of numbers, found an object (inputs given by name need the metadata to declare `inputs` with their names)";

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
    // The common body, read without serde when it can be (`quick.rs`); otherwise the
    // elements it wrote are dropped and the full parser reads the body from the start.
    let limit = float_overflow(dtype);
    match quick::read_body(body, dtype, |f| f.abs() < limit, &mut p.sink) {
        Some(shape) => finish(p.sink, shape, spec, dtype),
        None => {
            p.sink.clear();
            parse_full(body, spec, p)
        }
    }
}

/// The body read by serde_json (every body the quick reader leaves, and every error).
fn parse_full(
    body: &[u8],
    spec: Option<&InputSpec>,
    mut p: Parser,
) -> Result<InputArray, BodyError> {
    let dtype = p.dtype;
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
    finish(p.sink, p.nest.shape(), spec, dtype)
}

/// The elements read, as the input of `shape` (checked against the metadata's).
fn finish(
    sink: Sink,
    shape: Vec<i64>,
    spec: Option<&InputSpec>,
    dtype: Dtype,
) -> Result<InputArray, BodyError> {
    if let Some(spec) = spec {
        spec.check_shape(&shape).map_err(BodyError::Invalid)?;
    }
    let tensor = sink
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
        if self.depth == 0 {
            return Err(self.p.fail(INPUTS_IS_AN_OBJECT.into()));
        }
        self.p.wrong(self.depth, "an object")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::same_outcome;
    use serde_json::{json, Value};
    use tch::Kind;

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

    /// The body read by the full parser alone.
    fn full(body: &[u8], spec: Option<&InputSpec>) -> Result<InputArray, BodyError> {
        let dtype = spec.map_or(Dtype::Float32, |s| s.dtype);
        parse_full(body, spec, Parser::new(dtype, body.len() / 2 + 1))
    }

    #[test]
    fn the_quick_reader_gives_what_the_full_parser_gives_or_leaves_the_body_to_it() {
        let f32s = |d: Dtype| spec(None, d);
        let read = [
            (
                &br#"{"inputs": [[1, 2.5, -3e-2], [4, -0, 1.2345678901234567e-05]]}"#[..],
                Dtype::Float32,
            ),
            (
                b" {\n\t\"inputs\" :[ [[-1.5255959033966064 ,0.30372199416160583]] ] } \r\n",
                Dtype::Float32,
            ),
            (
                br#"{"inputs": [0.1, 0.2, 0.30000000000000004, 1e308]}"#,
                Dtype::Float64,
            ),
            (br#"{"inputs": [65519, -1.5]}"#, Dtype::Float16),
            (br#"{"inputs": [[1, 2], [3, 4], [5, 6]]}"#, Dtype::BFloat16),
        ];
        for (body, dtype) in read {
            let mut sink = Sink::new(dtype, body.len());
            let shape = quick::read_body(body, dtype, |_| true, &mut sink);
            assert!(shape.is_some(), "{}", String::from_utf8_lossy(body));
            let (a, b) = (
                parse_body(body, Some(&f32s(dtype))),
                full(body, Some(&f32s(dtype))),
            );
            let (a, b) = (a.unwrap().tensor, b.unwrap().tensor);
            assert_eq!((a.size(), a.kind()), (b.size(), b.kind()));
            assert!(a.equal(&b), "{}", String::from_utf8_lossy(body));
        }
        // Left to the full parser, with its result (a tensor, or the same error).
        let left = [
            &br#"{"id": 1, "inputs": [1]}"#[..],
            br#"{"inputs": [1], "id": 1}"#,
            br#"{"inp\u0075ts": [1]}"#,
            br#"{"inputs": [[1, 2], [3]]}"#,
            br#"{"inputs": [[1], 2]}"#,
            br#"{"inputs": [1, [2]]}"#,
            br#"{"inputs": [[], []]}"#,
            br#"{"inputs": []}"#,
            br#"{"inputs": 5}"#,
            br#"{"inputs": [1e39]}"#,
            br#"{"inputs": [1, true]}"#,
            br#"{"inputs": [1, "2"]}"#,
            br#"{"inputs": [01]}"#,
            br#"{"inputs": [1,]}"#,
            br#"{"inputs": [1] x"#,
            br#"{"inputs": [1]"#,
            br#"{"inputs": [1, 2"#,
            br#"{"inputs": [0.12345678901234567890123]}"#,
        ];
        for body in left {
            let mut sink = Sink::new(Dtype::Float32, body.len());
            let limit = float_overflow(Dtype::Float32);
            assert_eq!(
                quick::read_body(body, Dtype::Float32, |f| f.abs() < limit, &mut sink),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
            let tensor = |r: Result<InputArray, BodyError>| r.map(|a| a.tensor);
            let what = String::from_utf8_lossy(body);
            same_outcome(
                tensor(parse_body(body, None)),
                tensor(full(body, None)),
                &what,
            );
        }
        // Integer dtypes are the full parser's.
        let body = br#"{"inputs": [1, 2]}"#;
        let mut sink = Sink::new(Dtype::Int64, body.len());
        assert_eq!(
            quick::read_body(body, Dtype::Int64, |_| true, &mut sink),
            None
        );
        // A shape the metadata does not take is refused whichever reader read the body.
        let want = spec(Some(vec![3]), Dtype::Float32);
        let e = parse_body(br#"{"inputs": [1, 2]}"#, Some(&want)).unwrap_err();
        assert_eq!(e, full(br#"{"inputs": [1, 2]}"#, Some(&want)).unwrap_err());
    }

    /// A fixed-seed generator of bodies: regular and ragged nestings, empty arrays, numbers
    /// in every form (and some that are not numbers), random whitespace, other fields,
    /// truncations and trailing text.
    struct Bodies(u64);

    impl Bodies {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn ws(&mut self) -> &'static str {
            ["", "", "", " ", "\n ", "\t", " \r\n "][self.pick(7) as usize]
        }
        fn number(&mut self) -> String {
            let f = f32::from_bits(self.next() as u32);
            match self.pick(16) {
                0 => format!("{}", self.pick(1000)),
                1 => format!("-{}", self.pick(1000)),
                2 => format!("{}.{}", self.pick(100), self.pick(1_000_000_000)),
                3 => format!("-0.00{}", self.next() % 10_000_000_000_000_000_000),
                4 => format!("{}e{}", self.pick(1000), self.pick(90) as i64 - 45),
                5 => format!("{}E+{}", self.pick(10), self.pick(40)),
                6 if f.is_finite() => format!("{:?}", f64::from(f)),
                7 => format!("{}", self.next()),
                8 if self.pick(4) == 0 => [
                    "-0", "0", "0.0", "1e39", "-1e39", "65520", "1e400", "1e-400",
                ][self.pick(8) as usize]
                    .into(),
                9 if self.pick(10) == 0 => [
                    "01", "1.", ".5", "-", "1e", "+1", "NaN", "\"1\"", "true", "null",
                ][self.pick(10) as usize]
                    .into(),
                _ => format!("{:?}", f64::from(self.next() as u16) / 1000.0 - 30.0),
            }
        }
        /// An array of `shape` (row-major), made ragged now and then.
        fn array(&mut self, shape: &[usize]) -> String {
            let Some((&n, rest)) = shape.split_first() else {
                return self.number();
            };
            let n = if self.pick(40) == 0 { n + 1 } else { n };
            let items: Vec<String> = (0..n).map(|_| self.array(rest)).collect();
            let sep = format!("{},{}", self.ws(), self.ws());
            format!("[{}{}{}]", self.ws(), items.join(&sep), self.ws())
        }
        fn body(&mut self) -> String {
            let depth = 1 + self.pick(4) as usize;
            let shape: Vec<usize> = (0..depth)
                .map(|_| {
                    if self.pick(30) == 0 {
                        0
                    } else {
                        1 + self.pick(4) as usize
                    }
                })
                .collect();
            let inputs = self.array(&shape);
            let (w1, w2, w3, w4) = (self.ws(), self.ws(), self.ws(), self.ws());
            let mut b = match self.pick(12) {
                0 => format!("{{\"id\": \"r\",{w1}\"inputs\":{w2}{inputs}}}"),
                1 => format!("{{\"inputs\":{w2}{inputs},{w3}\"id\": 1}}"),
                _ => format!("{w1}{{{w2}\"inputs\"{w3}:{w4}{inputs}{w1}}}{w2}"),
            };
            match self.pick(20) {
                0 => b.truncate(self.pick(b.len() as u64) as usize),
                1 => b.push_str(" x"),
                2 => b = b.replacen("]", ",]", 1),
                _ => {}
            }
            b
        }
    }

    #[test]
    fn random_bodies_read_alike_by_either_reader() {
        let mut g = Bodies(0x0DDB_1A5E_5BAD_5EED);
        let (mut quick_read, mut both_ok, mut both_err) = (0, 0, 0);
        for n in 0..3_000 {
            let body = g.body();
            let dtype = [
                Dtype::Float32,
                Dtype::Float64,
                Dtype::Float16,
                Dtype::BFloat16,
                Dtype::Int64,
            ][n % 5];
            let spec = spec(None, dtype);
            let mut sink = Sink::new(dtype, body.len() / 2 + 1);
            let limit = float_overflow(dtype);
            if quick::read_body(body.as_bytes(), dtype, |f| f.abs() < limit, &mut sink).is_some() {
                quick_read += 1;
            }
            let tensor = |r: Result<InputArray, BodyError>| r.map(|a| a.tensor);
            let (a, b) = (
                tensor(parse_body(body.as_bytes(), Some(&spec))),
                tensor(full(body.as_bytes(), Some(&spec))),
            );
            if same_outcome(a, b, &body) {
                both_ok += 1;
            } else {
                both_err += 1;
            }
        }
        // The mix exercised both readers and both outcomes.
        assert!(quick_read > 600, "{quick_read} read quickly");
        assert!(
            both_ok > quick_read && both_err > 600,
            "{both_ok} read, {both_err} refused"
        );
    }

    #[test]
    fn an_image_as_clients_send_it_is_read_by_the_quick_reader() {
        // 3x32x32 float32 values as Python's json.dumps writes them (the shortest repr of
        // each as a double: up to 17 significant digits, some with an exponent).
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut values = Vec::new();
        for _ in 0..3 * 32 * 32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Roughly normal: a sum of uniforms, scaled into a wide range of magnitudes.
            let u = (x % 1_000_000) as f32 / 1e6 - 0.5;
            let v = u * 10f32.powi((x >> 40) as i32 % 12 - 8);
            values.push(format!("{:?}", f64::from(v)));
        }
        let rows: Vec<String> = values
            .chunks(32)
            .map(|r| format!("[{}]", r.join(", ")))
            .collect();
        let planes: Vec<String> = rows
            .chunks(32)
            .map(|p| format!("[{}]", p.join(", ")))
            .collect();
        let body = format!("{{\"inputs\": [[{}]]}}", planes.join(", "));
        let mut sink = Sink::new(Dtype::Float32, body.len());
        let shape = quick::read_body(body.as_bytes(), Dtype::Float32, |_| true, &mut sink);
        assert_eq!(shape, Some(vec![1, 3, 32, 32]));
        let (a, b) = (
            parse_body(body.as_bytes(), None),
            full(body.as_bytes(), None),
        );
        assert!(a.unwrap().tensor.equal(&b.unwrap().tensor));
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
