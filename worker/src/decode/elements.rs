//! A named input's elements, from the JSON text of its value or from raw bytes, as the model
//! argument its declared datatype calls for: a tensor (numbers or booleans) or a TorchScript
//! `List[str]` (`BYTES`). Used by v2 requests (shape given by the request) and by `POST /`
//! bodies with named inputs or text (shape read from the nesting). JSON is read in one
//! streaming pass, never as a tree of values. Every error names the input.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;
use vramfork::metadata::{Datatype, Dtype};

use super::nesting::{Nesting, Ragged};
use super::quick;
use super::sink::Sink;
use super::BodyError;
use crate::args::{int_range, Arg};

/// The number of elements of `shape`, refusing negative sizes and products a buffer of
/// 8-byte elements could not hold.
pub fn element_count(name: &str, shape: &[i64]) -> Result<usize, String> {
    if let Some(d) = shape.iter().find(|d| **d < 0) {
        return Err(format!(
            "input {name}: shape {shape:?} has a negative size {d}"
        ));
    }
    shape
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d as usize))
        .filter(|n| n.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(|| format!("input {name}: shape {shape:?} is too large"))
}

/// How a JSON input's elements are laid out.
#[derive(Debug, Clone, Copy)]
pub enum Layout<'a> {
    /// `POST /`: the nesting is the shape, which must be regular (`[[1, 2], [3, 4]]` is
    /// `[2, 2]`; every array at a depth as long as the first, values at one depth).
    Nested,
    /// v2: the request's `shape`; `data` flat or nested in any way, read row-major.
    Shape(&'a [i64]),
}

/// A JSON input (`raw`, the text of its value) as the argument its datatype calls for: a
/// tensor (numbers or booleans) or a TorchScript `List[str]` (`BYTES`), with its shape (read
/// from the nesting, or the given one). One streaming pass over the text: elements go
/// straight into the tensor's buffer or the string list, with no tree of JSON values in
/// between (a tree costs about 80 bytes an element), so an input costs about its text plus
/// what the model gets. Every error names the input and the element. A document input
/// (`max_documents` given) keeps no more strings than it takes: the rest are read and
/// counted only, and the request is refused with [`BodyError::TooLarge`] (10 million
/// one-letter documents in a 48 MB body raised a worker's peak by 582 MB when they were all
/// kept until the pre-processing counted them). Float tensors are first offered to the quick
/// reader (`quick.rs`: the same numbers, 2–2.5× faster); whatever it leaves, errors
/// included, is read here.
pub fn arg_from_json(
    name: &str,
    raw: &RawValue,
    datatype: Datatype,
    layout: Layout<'_>,
    max_documents: Option<usize>,
) -> Result<(Vec<i64>, Arg), BodyError> {
    let text = raw.get();
    let (given, cap) = sizes(name, text, layout)?;
    let cap = match (datatype, max_documents) {
        (Datatype::Bytes, Some(max)) => cap.min(max),
        _ => cap,
    };
    let out = match datatype {
        Datatype::Bytes => Out::Strings(Vec::new()),
        Datatype::Tensor(dtype) => {
            // Float numbers as clients send them, read without serde when they can be
            // (`quick.rs`); anything else, every error included, is the walk's.
            let mut sink = Sink::new(dtype, cap);
            let regular = matches!(layout, Layout::Nested);
            let fits = |f: f64| f.abs() <= float_max(dtype);
            match quick::read_input(text.as_bytes(), dtype, regular, fits, &mut sink) {
                Some((nested, n)) if regular || given == Some(n) => {
                    let shape = match layout {
                        Layout::Shape(shape) => shape.to_vec(),
                        Layout::Nested => nested,
                    };
                    let t = sink
                        .finish(&shape, dtype)
                        .map_err(|e| format!("input {name}: {e}"))?;
                    return Ok((shape, Arg::Tensor(t)));
                }
                _ => sink.clear(),
            }
            Out::Tensor(dtype, sink)
        }
    };
    walk(name, text, out, cap, layout, given, max_documents)
}

/// The element count `layout` gives (v2's shape), and how many elements `text` can hold:
/// each takes at least two bytes with its separator (one for a lone scalar), so this many
/// always suffice (pages past those written are never touched).
fn sizes(name: &str, text: &str, layout: Layout<'_>) -> Result<(Option<usize>, usize), String> {
    let room = text.len() / 2 + 1;
    let given = match layout {
        Layout::Shape(shape) => Some(element_count(name, shape)?),
        Layout::Nested => None,
    };
    Ok((given, given.map_or(room, |n| n.min(room))))
}

/// The input's text read by serde_json, one streaming pass into `out`, which keeps `cap`
/// elements; `given`, the element count of the layout's shape.
fn walk(
    name: &str,
    text: &str,
    out: Out,
    cap: usize,
    layout: Layout<'_>,
    given: Option<usize>,
    max_documents: Option<usize>,
) -> Result<(Vec<i64>, Arg), BodyError> {
    let mut w = Walk {
        name,
        regular: matches!(layout, Layout::Nested),
        nest: Nesting::default(),
        n: 0,
        cap,
        out,
        documents: max_documents.is_some(),
        err: None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let walked = Node {
        w: &mut w,
        depth: 0,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    if let Some(e) = w.err.take() {
        return Err(e.into());
    }
    // `raw` is JSON already: only the nesting limit (128) can stop serde_json here.
    walked.map_err(|e| format!("input {name}: {e}"))?;
    let shape = match layout {
        Layout::Shape(shape) => {
            let count = given.unwrap_or_default();
            if w.n != count {
                return Err(format!(
                    "input {name}: `data` has {} elements; shape {shape:?} takes {count}",
                    w.n
                )
                .into());
            }
            shape.to_vec()
        }
        Layout::Nested => w.nest.shape(),
    };
    if let Some(max) = max_documents.filter(|max| w.n > *max) {
        return Err(BodyError::TooLarge(vramfork::documents::too_many(
            name, w.n, max,
        )));
    }
    let arg = match w.out {
        Out::Strings(s) => Arg::Strings(s),
        Out::Tensor(dtype, sink) => Arg::Tensor(
            sink.finish(&shape, dtype)
                .map_err(|e| format!("input {name}: {e}"))?,
        ),
    };
    Ok((shape, arg))
}

enum Out {
    Tensor(Dtype, Sink),
    Strings(Vec<String>),
}

/// The state of one pass over an input's JSON.
struct Walk<'n> {
    name: &'n str,
    /// The nesting must be regular (it is the shape).
    regular: bool,
    /// The shape so far (when `regular`), and where the walk is.
    nest: Nesting,
    /// Elements seen (counted on past `cap`, kept up to it).
    n: usize,
    cap: usize,
    out: Out,
    /// Strings for the worker's own pre-processing (a document input): a NUL is then an
    /// ordinary character (the tokenizer takes it, as it does in a `text/plain` body);
    /// strings for the model are TorchScript strings, which end at a NUL.
    documents: bool,
    /// The first problem.
    err: Option<String>,
}

/// A leaf as its message shows it: JSON, long strings cut.
fn shown(v: impl Into<Value>) -> String {
    match v.into() {
        Value::String(s) if s.chars().count() > 40 => {
            let cut: String = s.chars().take(40).collect();
            format!("{:?}…", cut)
        }
        other => other.to_string(),
    }
}

impl Walk<'_> {
    /// A ragged nesting's message, naming the input.
    fn ragged(&self, r: Ragged, what: &str) -> String {
        format!(
            "input {}: {}",
            self.name,
            r.message(&self.nest.here(), what)
        )
    }

    /// Records the first problem and returns the error that stops the walk.
    fn fail<E: de::Error>(&mut self, msg: String) -> E {
        if self.err.is_none() {
            self.err = Some(msg);
        }
        E::custom("invalid request")
    }

    /// A value (not an array) at `depth`: in a regular nesting its place must be a value's.
    /// `Some(i)`, its element index, when it is to be kept.
    fn leaf<E: de::Error>(&mut self, depth: usize, what: &str) -> Result<Option<usize>, E> {
        if self.regular {
            if let Err(r) = self.nest.value(depth) {
                let m = self.ragged(r, what);
                return Err(self.fail(m));
            }
        }
        let i = self.n;
        self.n += 1;
        Ok((i < self.cap).then_some(i))
    }

    fn bad<E: de::Error>(&mut self, i: usize, v: String, what: &str) -> E {
        let name = self.name;
        let bytes = if matches!(self.out, Out::Strings(_)) {
            " is BYTES:"
        } else {
            ":"
        };
        self.fail(format!(
            "input {name}{bytes} element {i} ({v}) is not {what}"
        ))
    }

    /// What a tensor of this dtype takes, for messages.
    fn wanted(dtype: Dtype) -> String {
        match dtype {
            Dtype::Bool => "true or false".into(),
            Dtype::Float32 | Dtype::Float64 | Dtype::Float16 | Dtype::BFloat16 => {
                format!("a number the type holds (|x| ≤ {:e})", float_max(dtype))
            }
            other => {
                let (lo, hi) = int_range(other);
                format!("an integer in {lo}..={hi}")
            }
        }
    }

    fn number<E: de::Error>(&mut self, depth: usize, v: Value) -> Result<(), E> {
        let Some(i) = self.leaf(depth, "a number")? else {
            return Ok(());
        };
        let Out::Tensor(dtype, sink) = &mut self.out else {
            return Err(self.bad(i, shown(v), "a string"));
        };
        let dtype = *dtype;
        match dtype {
            Dtype::Bool => {}
            Dtype::Float64 => {
                if let Some(f) = v.as_f64() {
                    sink.push(f);
                    return Ok(());
                }
            }
            Dtype::Float32 | Dtype::Float16 | Dtype::BFloat16 => {
                if let Some(f) = v.as_f64().filter(|f| f.abs() <= float_max(dtype)) {
                    sink.push(f as f32);
                    return Ok(());
                }
            }
            _ => {
                let (lo, hi) = int_range(dtype);
                if let Some(n) = v.as_i64().filter(|n| (lo..=hi).contains(n)) {
                    match dtype {
                        Dtype::Int64 => sink.push(n),
                        Dtype::Int32 => sink.push(n as i32),
                        Dtype::Int16 => sink.push(n as i16),
                        Dtype::Int8 => sink.push(n as i8),
                        _ => sink.push(n as u8),
                    }
                    return Ok(());
                }
            }
        }
        Err(self.bad(i, shown(v), &Self::wanted(dtype)))
    }

    fn boolean<E: de::Error>(&mut self, depth: usize, b: bool) -> Result<(), E> {
        let Some(i) = self.leaf(depth, "a boolean")? else {
            return Ok(());
        };
        match &mut self.out {
            Out::Tensor(Dtype::Bool, sink) => {
                sink.push(b);
                Ok(())
            }
            Out::Tensor(dtype, _) => {
                let what = Self::wanted(*dtype);
                Err(self.bad(i, b.to_string(), &what))
            }
            Out::Strings(_) => Err(self.bad(i, b.to_string(), "a string")),
        }
    }

    fn string<E: de::Error>(&mut self, depth: usize, s: &str) -> Result<(), E> {
        let Some(i) = self.leaf(depth, "a string")? else {
            return Ok(());
        };
        match &mut self.out {
            Out::Strings(list) => {
                if !self.documents && s.contains('\0') {
                    let name = self.name;
                    return Err(self.fail(format!(
                        "input {name}: element {i} contains a NUL character, which a TorchScript string cannot hold"
                    )));
                }
                list.push(s.to_owned());
                Ok(())
            }
            Out::Tensor(dtype, _) => {
                let what = Self::wanted(*dtype);
                Err(self.bad(i, shown(s), &what))
            }
        }
    }

    /// `null` or an object where an element belongs.
    fn other<E: de::Error>(&mut self, depth: usize, what: &str) -> Result<(), E> {
        let Some(i) = self.leaf(depth, what)? else {
            return Ok(());
        };
        let wanted = match &self.out {
            Out::Tensor(dtype, _) => Self::wanted(*dtype),
            Out::Strings(_) => "a string".into(),
        };
        Err(self.bad(i, what.into(), &wanted))
    }
}

/// The largest magnitude a float dtype takes from JSON.
fn float_max(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Float64 => f64::MAX,
        Dtype::Float16 => 65504.0,
        _ => f32::MAX as f64,
    }
}

/// One value of the input, at `depth` (0 = the input itself).
struct Node<'a, 'n> {
    w: &'a mut Walk<'n>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an input's elements")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (w, depth) = (self.w, self.depth);
        if w.regular {
            if let Err(r) = w.nest.array_opens(depth) {
                let m = w.ragged(r, "an array");
                return Err(w.fail(m));
            }
        }
        let mut n = 0usize;
        loop {
            w.nest.enter(n);
            let more = seq.next_element_seed(Node {
                w: &mut *w,
                depth: depth + 1,
            })?;
            w.nest.leave();
            if more.is_none() {
                break;
            }
            n += 1;
        }
        if !w.regular {
            return Ok(());
        }
        w.nest.array_closes(depth, n).map_err(|r| {
            let m = w.ragged(r, "an array");
            w.fail(m)
        })
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.w.number(self.depth, Value::from(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.w.number(self.depth, Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.w.number(self.depth, Value::from(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.w.boolean(self.depth, v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.w.string(self.depth, v)
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.w.other(self.depth, "null")
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        self.w.other(self.depth, "an object")
    }
}

/// Raw `BYTES` data (Triton's binary form: each element a 4-byte little-endian length, then
/// that many bytes), exactly `count` elements filling `raw`; each must be UTF-8, unless the
/// input is a document (`blobs`: its elements kept as bytes for pre-processing).
pub fn strings_from_bytes(
    name: &str,
    mut raw: &[u8],
    count: usize,
    blobs: bool,
) -> Result<Arg, String> {
    let mut strings = Vec::with_capacity(count.min(raw.len() / 4));
    let mut kept = Vec::new();
    for i in 0..count {
        let Some((len, rest)) = raw.split_first_chunk::<4>() else {
            return Err(format!(
                "input {name}: the binary data ends before element {i} of {count} (each element is a 4-byte little-endian length, then its bytes)"
            ));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return Err(format!(
                "input {name}: element {i} says it has {len} bytes, but only {} remain",
                rest.len()
            ));
        }
        let (bytes, rest) = rest.split_at(len);
        if blobs {
            kept.push(bytes.to_vec());
            raw = rest;
            continue;
        }
        let s = String::from_utf8(bytes.to_vec())
            .map_err(|e| format!("input {name}: element {i} is not valid UTF-8 ({e})"))?;
        strings.push(checked(name, i, s)?);
        raw = rest;
    }
    if !raw.is_empty() {
        return Err(format!(
            "input {name}: {} bytes are left after its {count} elements",
            raw.len()
        ));
    }
    if blobs {
        return Ok(Arg::Blobs(kept));
    }
    Ok(Arg::Strings(strings))
}

/// TorchScript strings end at a NUL character: refused rather than cut short.
fn checked(name: &str, i: usize, s: String) -> Result<String, String> {
    if s.contains('\0') {
        Err(format!(
            "input {name}: element {i} contains a NUL character, which a TorchScript string cannot hold"
        ))
    } else {
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::same_outcome;
    use serde_json::json;

    fn strings(a: Arg) -> Vec<String> {
        match a {
            Arg::Strings(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn raw(v: Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string()).unwrap()
    }

    /// The shape a `POST /` input's nesting gives (float32).
    fn nested_shape(v: Value) -> Result<Vec<i64>, String> {
        let t = Datatype::Tensor(Dtype::Float32);
        arg_from_json("x", &raw(v), t, Layout::Nested, None)
            .map(|(shape, _)| shape)
            .map_err(|e| e.to_string())
    }

    fn tensor_from_json(v: Value, shape: &[i64], dtype: Dtype) -> Result<tch::Tensor, String> {
        let t = Datatype::Tensor(dtype);
        match arg_from_json("x", &raw(v), t, Layout::Shape(shape), None)
            .map_err(|e| e.to_string())?
        {
            (_, Arg::Tensor(t)) => Ok(t),
            (_, other) => panic!("{other:?}"),
        }
    }

    /// A tensor input's outcome with its shape dropped (the tensor has it).
    fn tensor(r: Result<(Vec<i64>, Arg), BodyError>) -> Result<tch::Tensor, BodyError> {
        r.map(|(shape, arg)| match arg {
            Arg::Tensor(t) => {
                assert_eq!(t.size(), shape);
                t
            }
            other => panic!("{other:?}"),
        })
    }

    /// `text` read by the serde walk alone, as `arg_from_json` would if the quick reader
    /// left it.
    fn walked(text: &str, dtype: Dtype, layout: Layout<'_>) -> Result<(Vec<i64>, Arg), BodyError> {
        let (given, cap) = sizes("x", text, layout)?;
        let out = Out::Tensor(dtype, Sink::new(dtype, cap));
        walk("x", text, out, cap, layout, given, None)
    }

    #[test]
    fn float_inputs_read_quickly_are_what_the_walk_reads() {
        let cases: [(&str, Dtype, Layout<'_>); 10] = [
            // Read by the quick reader.
            (
                "[[1, -2.5e-3], [0.30372199416160583, -0]]",
                Dtype::Float32,
                Layout::Nested,
            ),
            ("[1, 2, 3, 4, 5, 6]", Dtype::Float32, Layout::Shape(&[2, 3])),
            (
                "[[1, 2], [3, [4, 5, 6]]]",
                Dtype::Float64,
                Layout::Shape(&[6]),
            ),
            ("[65504, -1.5]", Dtype::Float16, Layout::Shape(&[2])),
            // Left to the walk: its errors, or its reading.
            ("[1, 2, 3]", Dtype::Float32, Layout::Shape(&[2])),
            ("[1, 2]", Dtype::Float32, Layout::Shape(&[3])),
            ("[[1, 2], [3]]", Dtype::Float32, Layout::Nested),
            ("[65505]", Dtype::Float16, Layout::Shape(&[1])),
            ("[[], 1, 2]", Dtype::Float32, Layout::Shape(&[2])),
            ("[1, \"2\"]", Dtype::Float32, Layout::Shape(&[2])),
        ];
        for (i, (text, dtype, layout)) in cases.into_iter().enumerate() {
            let mut sink = Sink::new(dtype, text.len());
            let regular = matches!(layout, Layout::Nested);
            let fits = |f: f64| f.abs() <= float_max(dtype);
            let quick = quick::read_input(text.as_bytes(), dtype, regular, fits, &mut sink);
            // The first six are read (the fifth and sixth then refused for their count).
            assert_eq!(quick.is_some(), i < 6, "{text}");
            let raw = RawValue::from_string(text.to_string()).unwrap();
            let got = arg_from_json("x", &raw, Datatype::Tensor(dtype), layout, None);
            same_outcome(tensor(got), tensor(walked(text, dtype, layout)), text);
        }
    }

    #[test]
    fn random_v2_data_reads_alike_by_either_reader() {
        let mut x = 0x5DEE_CE66_D1CE_F00Du64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut quick_read, mut ok, mut refused) = (0, 0, 0);
        for i in 0..2_000 {
            let count = 1 + next(12) as usize;
            let mut items: Vec<String> = (0..count)
                .map(|_| match next(10) {
                    0 => format!("{}", next(70_000)),
                    1 => format!("-{}.{}e{}", next(10), next(1_000_000), next(80) as i64 - 40),
                    2 if next(5) == 0 => {
                        ["null", "\"x\"", "1e400", "01", "true"][next(5) as usize].into()
                    }
                    _ => format!(
                        "{:?}",
                        f64::from(f32::from_bits(next(1 << 30) as u32 + 0x3000_0000))
                    ),
                })
                .collect();
            // Nested in any way now and then: v2 reads `data` row-major whatever its nesting.
            if count > 2 && next(3) == 0 {
                let inner = items.drain(1..3).collect::<Vec<_>>().join(", ");
                items.insert(1, format!("[{inner}]"));
            }
            let text = format!("[{}]", items.join(if next(2) == 0 { "," } else { " , " }));
            let n = if next(10) == 0 {
                count as i64 + 1
            } else {
                count as i64
            };
            let shape = [n];
            let dtype = [
                Dtype::Float32,
                Dtype::Float64,
                Dtype::Float16,
                Dtype::BFloat16,
            ][i % 4];
            let mut sink = Sink::new(dtype, text.len());
            let fits = |f: f64| f.abs() <= float_max(dtype);
            if quick::read_input(text.as_bytes(), dtype, false, fits, &mut sink).is_some() {
                quick_read += 1;
            }
            // A request's `data` is JSON already (its body was parsed): text serde refuses
            // never gets here.
            let Ok(raw) = RawValue::from_string(text.clone()) else {
                continue;
            };
            let layout = Layout::Shape(&shape);
            let got = arg_from_json("x", &raw, Datatype::Tensor(dtype), layout, None);
            if same_outcome(tensor(got), tensor(walked(&text, dtype, layout)), &text) {
                ok += 1;
            } else {
                refused += 1;
            }
        }
        assert!(
            quick_read > 800 && ok > 800 && refused > 200,
            "{quick_read} {ok} {refused}"
        );
    }

    fn strings_from_json(name: &str, v: Value, shape: &[i64]) -> Result<Arg, String> {
        arg_from_json(name, &raw(v), Datatype::Bytes, Layout::Shape(shape), None)
            .map(|(_, a)| a)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn nested_shapes_are_read_and_must_be_regular() {
        assert_eq!(
            nested_shape(json!([[1, 2], [3, 4], [5, 6]])).unwrap(),
            [3, 2]
        );
        assert_eq!(nested_shape(json!([])).unwrap(), [0]);
        assert_eq!(nested_shape(json!([[], []])).unwrap(), [2, 0]);
        assert_eq!(nested_shape(json!(7)).unwrap(), Vec::<i64>::new());
        let (shape, a) = arg_from_json(
            "x",
            &raw(json!(["a", "b"])),
            Datatype::Bytes,
            Layout::Nested,
            None,
        )
        .unwrap();
        assert_eq!(
            (shape, strings(a)),
            (vec![2], vec!["a".to_string(), "b".into()])
        );
        let e = nested_shape(json!([[1, 2], [3]])).unwrap_err();
        assert!(
            e.contains("input x: ragged array: inputs[1] has 1 elements, expected 2"),
            "{e}"
        );
        let e = nested_shape(json!([[1], 2])).unwrap_err();
        assert!(
            e.contains("inputs[1] is a number, but its siblings are arrays of 1 elements"),
            "{e}"
        );
        let e = nested_shape(json!([1, [2]])).unwrap_err();
        assert!(
            e.contains("inputs[1] is an array, but its siblings are values"),
            "{e}"
        );
        let e = nested_shape(json!([[], 3])).unwrap_err();
        assert!(e.contains("inputs[1] is a number"), "{e}");
        let e = nested_shape(json!([[1], [[2]]])).unwrap_err();
        assert!(e.contains("inputs[1][0] is an array"), "{e}");
        let e = nested_shape(json!([[[1], [2]], [[3], [4, 5]]])).unwrap_err();
        assert!(e.contains("inputs[1][1] has 2 elements"), "{e}");
        // The values are kept row-major in the tensor.
        let (_, a) = arg_from_json(
            "x",
            &raw(json!([[1, 2], [3, 4]])),
            Datatype::Tensor(Dtype::Int16),
            Layout::Nested,
            None,
        )
        .unwrap();
        let Arg::Tensor(t) = a else { panic!() };
        assert_eq!((t.size(), t.kind()), (vec![2, 2], tch::Kind::Int16));
        assert_eq!(Vec::<i16>::try_from(t.reshape([-1])).unwrap(), [1, 2, 3, 4]);
    }

    #[test]
    fn tensors_from_json_of_every_kind_of_number() {
        let t = tensor_from_json(json!([[1, 2], [3, 4]]), &[2, 2], Dtype::Int32).unwrap();
        assert_eq!(t.size(), [2, 2]);
        assert_eq!(t.kind(), tch::Kind::Int);
        // Flat data for a shape, or nested any way: read row-major.
        let t = tensor_from_json(json!([0.5, [1.5, [2.5]]]), &[1, 3], Dtype::Float64).unwrap();
        assert_eq!(
            Vec::<f64>::try_from(t.reshape([-1])).unwrap(),
            [0.5, 1.5, 2.5]
        );
        let t = tensor_from_json(json!([65504, -1.5]), &[2], Dtype::Float16).unwrap();
        assert_eq!(t.kind(), tch::Kind::Half);
        let t = tensor_from_json(json!([true, false]), &[2], Dtype::Bool).unwrap();
        assert_eq!(Vec::<bool>::try_from(t).unwrap(), [true, false]);
        let e = tensor_from_json(json!([300]), &[1], Dtype::UInt8).unwrap_err();
        assert!(
            e.contains("input x: element 0 (300) is not an integer in 0..=255"),
            "{e}"
        );
        let e = tensor_from_json(json!([1, 2.5]), &[2], Dtype::Int64).unwrap_err();
        assert!(e.contains("element 1 (2.5) is not an integer"), "{e}");
        let e = tensor_from_json(json!([1, 1e39]), &[2], Dtype::Float32).unwrap_err();
        assert!(
            e.contains("element 1 (1e+39) is not a number the type holds"),
            "{e}"
        );
        let e = tensor_from_json(json!([1, "x", 3]), &[3], Dtype::Float32).unwrap_err();
        assert!(e.contains("element 1 (\"x\") is not a number"), "{e}");
        let e = tensor_from_json(json!([null]), &[1], Dtype::Float32).unwrap_err();
        assert!(e.contains("element 0 (null)"), "{e}");
        let e = tensor_from_json(json!([{"a": 1}]), &[1], Dtype::Float32).unwrap_err();
        assert!(e.contains("element 0 (an object)"), "{e}");
        let e = tensor_from_json(json!([1]), &[1], Dtype::Bool).unwrap_err();
        assert!(e.contains("element 0 (1) is not true or false"), "{e}");
        let e = tensor_from_json(json!([1, 2, 3]), &[2], Dtype::Float32).unwrap_err();
        assert!(e.contains("has 3 elements; shape [2] takes 2"), "{e}");
        let e = tensor_from_json(json!([1]), &[2], Dtype::Float32).unwrap_err();
        assert!(e.contains("has 1 elements; shape [2] takes 2"), "{e}");
        let e = tensor_from_json(json!([]), &[-1, 2], Dtype::Float32).unwrap_err();
        assert!(e.contains("negative size -1"), "{e}");
        let e = tensor_from_json(json!([]), &[1 << 32, 1 << 32, 16], Dtype::Float32).unwrap_err();
        assert!(e.contains("too large"), "{e}");
        // A shape far larger than the data costs nothing before it is refused.
        let e = tensor_from_json(json!([1, 2]), &[1 << 40], Dtype::Float64).unwrap_err();
        assert!(e.contains("has 2 elements; shape [1099511627776]"), "{e}");
    }

    #[test]
    fn the_densest_text_fits_its_buffer() {
        // "0," per element: the fewest bytes an element can take.
        let n = 100_000;
        let text = format!("[{}0]", "0,".repeat(n - 1));
        let v = RawValue::from_string(text).unwrap();
        let t = Datatype::Tensor(Dtype::Int8);
        let (shape, _) = arg_from_json("x", &v, t, Layout::Nested, None).unwrap();
        assert_eq!(shape, [n as i64]);
        let (_, a) = arg_from_json("x", &v, t, Layout::Shape(&[n as i64]), None).unwrap();
        assert!(matches!(a, Arg::Tensor(t) if t.size() == [n as i64]));
        let one = RawValue::from_string("5".into()).unwrap();
        assert!(arg_from_json("x", &one, t, Layout::Shape(&[1]), None).is_ok());
    }

    #[test]
    fn strings_from_json_and_from_length_prefixed_bytes_agree() {
        let docs = ["first document", "naïve café ✓", ""];
        let a = strings(strings_from_json("docs", json!(docs), &[3]).unwrap());
        let mut raw = Vec::new();
        for d in docs {
            raw.extend_from_slice(&(d.len() as u32).to_le_bytes());
            raw.extend_from_slice(d.as_bytes());
        }
        let b = strings(strings_from_bytes("docs", &raw, 3, false).unwrap());
        assert_eq!(a, docs);
        assert_eq!(a, b);
        // Nested data is read row-major.
        let n = strings(strings_from_json("d", json!([["a", "b"], ["c", "d"]]), &[2, 2]).unwrap());
        assert_eq!(n, ["a", "b", "c", "d"]);
    }

    #[test]
    fn malformed_strings_name_the_input_and_element() {
        let e = strings_from_json("docs", json!(["a", 5]), &[2]).unwrap_err();
        assert!(
            e.contains("input docs is BYTES: element 1 (5) is not a string"),
            "{e}"
        );
        let e = strings_from_json("docs", json!(["a\u{0}b"]), &[1]).unwrap_err();
        assert!(e.contains("element 0 contains a NUL"), "{e}");
        // A document input's strings go to the worker's tokenizer, not to TorchScript: a
        // NUL is an ordinary character there, as in a text/plain body.
        let docs = arg_from_json(
            "docs",
            &raw(json!(["a\u{0}b"])),
            Datatype::Bytes,
            Layout::Shape(&[1]),
            Some(4),
        )
        .unwrap()
        .1;
        assert_eq!(strings(docs), ["a\u{0}b"]);
        let e = strings_from_bytes("docs", &[2, 0, 0, 0, 0xff, 0xfe], 1, false).unwrap_err();
        assert!(e.contains("element 0 is not valid UTF-8"), "{e}");
        // A document input keeps its elements as bytes (an image is not UTF-8).
        match strings_from_bytes("img", &[2, 0, 0, 0, 0xff, 0xfe, 0, 0, 0, 0], 2, true) {
            Ok(Arg::Blobs(b)) => assert_eq!(b, [vec![0xff, 0xfe], vec![]]),
            other => panic!("{other:?}"),
        }
        let e = strings_from_bytes("docs", &[9, 0, 0, 0, b'a'], 1, false).unwrap_err();
        assert!(e.contains("says it has 9 bytes, but only 1 remain"), "{e}");
        let e = strings_from_bytes("docs", &[1, 0, 0, 0, b'a', 0], 1, false).unwrap_err();
        assert!(e.contains("1 bytes are left"), "{e}");
        let e = strings_from_bytes("docs", &[1, 0, 0, 0, b'a'], 2, false).unwrap_err();
        assert!(e.contains("ends before element 1 of 2"), "{e}");
        let e = strings_from_bytes("docs", &[0xff, 0xff, 0xff, 0xff], 1, false).unwrap_err();
        assert!(e.contains("says it has 4294967295 bytes"), "{e}");
    }

    #[test]
    fn a_document_input_keeps_at_most_its_limit_and_counts_the_rest() {
        let docs = raw(json!(["a", "b", "c"]));
        let kept = |max| arg_from_json("text", &docs, Datatype::Bytes, Layout::Nested, Some(max));
        let (shape, a) = kept(3).unwrap();
        assert_eq!((shape, strings(a).len()), (vec![3], 3));
        match kept(2) {
            Err(BodyError::TooLarge(m)) => {
                assert_eq!(m, vramfork::documents::too_many("text", 3, 2))
            }
            other => panic!("{other:?}"),
        }
        // With v2's declared shape, the same (v2 itself refuses from the shape before
        // reading the data: `http/v2/request.rs`).
        let r = arg_from_json("text", &docs, Datatype::Bytes, Layout::Shape(&[3]), Some(2));
        assert!(
            matches!(r, Err(BodyError::TooLarge(ref m)) if m.contains("3 documents")),
            "{r:?}"
        );
        // A bad element among those kept is a 400 naming it; past the limit elements are
        // only counted, and the request is refused for their number.
        let bad = raw(json!(["a", 7, "c"]));
        let r = arg_from_json("text", &bad, Datatype::Bytes, Layout::Nested, Some(2));
        assert!(
            matches!(r, Err(BodyError::Invalid(ref m)) if m.contains("element 1")),
            "{r:?}"
        );
        let r = arg_from_json("text", &bad, Datatype::Bytes, Layout::Nested, Some(1));
        assert!(matches!(r, Err(BodyError::TooLarge(_))), "{r:?}");
    }
}
