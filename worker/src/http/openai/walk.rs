//! One streaming pass of serde_json over the body of `POST /v1/embeddings`, with no tree of
//! values: `input` is read element by element into `String`s and `Vec<u32>` rows, counted,
//! and kept only while the request can still be served (at most [`MAX_INPUTS`] inputs, at
//! most `Rules::max_ids` ids in a row, no ids when the model takes text only, nothing
//! after the first fault). The rest of the body is still walked — without keeping it — so
//! that the verdict (`request.rs`) is the one a whole reading would give: a syntax error or
//! JSON nested deeper than serde_json's 128 levels anywhere is `invalid_json`, the inputs
//! are counted in full, and of several faults the same one is named.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

mod input;

use input::InputSeed;

/// Inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// What the server lets a request keep while it is read.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// The model takes token ids (its `embeddings.token_ids`): without, ids are not kept.
    pub token_ids: bool,
    /// Ids one input may hold.
    pub max_ids: usize,
}

/// A fault of `input`, in the words `request.rs` gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// `input[i]` (or `input` itself: `None`) is an empty string.
    EmptyText(Option<usize>),
    /// `input[i]` is not a string in an array of strings.
    NotText(usize),
    /// `input[i]` is not an array in an array of arrays of ids.
    NotRow(usize),
    /// `input[i]` (or `input`) is an empty array of ids.
    EmptyRow(Option<usize>),
    /// Element `j` of `input[i]` (or of `input`) is `shown`, not a token id.
    NotId(Option<usize>, usize, String),
    /// `input[i]` (or `input`) holds more than `Rules::max_ids` ids.
    LongRow(Option<usize>),
}

/// The first element of an array `input`, which says what the array holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Token ids: the array is one input.
    Ids,
    Texts,
    Rows,
    /// Anything else: not one of the shapes.
    Other,
}

/// What the walk found of `input`.
#[derive(Debug, Default)]
pub enum Seen {
    /// Absent or `null`.
    #[default]
    Missing,
    Text(String),
    /// A number, a boolean or an object.
    Other,
    Array(Items),
}

/// An array `input` as walked.
#[derive(Debug, Default)]
pub struct Items {
    /// Elements seen, all counted.
    pub n: usize,
    pub kind: Option<Kind>,
    /// Kept while nothing is wrong, up to the limits.
    pub texts: Vec<String>,
    pub rows: Vec<Vec<u32>>,
    /// The first fault, in the order of the body.
    pub fault: Option<Fault>,
}

/// Any other field's value, as `request.rs` judges it.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    Null,
    Text(String),
    Unsigned(u64),
    /// Anything else, as JSON shows it (cut when long).
    Shown(String),
}

impl Field {
    /// The value as a message shows it.
    pub fn shown(&self) -> String {
        match self {
            Field::Null => "null".into(),
            Field::Text(s) => input::text_shown(s),
            Field::Unsigned(n) => n.to_string(),
            Field::Shown(s) => s.clone(),
        }
    }
}

/// The body as walked.
#[derive(Debug, Default)]
pub struct Walked {
    /// The body was a JSON object.
    pub object: bool,
    pub input: Seen,
    pub model: Option<Field>,
    pub encoding_format: Option<Field>,
    pub dimensions: Option<Field>,
    /// vLLM's `priority`.
    pub priority: Option<Field>,
}

/// Walks `body`: `Err` is serde_json's own refusal (syntax, nesting, trailing bytes).
pub fn walk(body: &[u8], rules: Rules) -> Result<Walked, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let walked = Top(rules).deserialize(&mut de)?;
    de.end()?;
    Ok(walked)
}

/// The value of one key of the body's object.
enum Key {
    Input,
    Model,
    Format,
    Dimensions,
    Priority,
    Other,
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, k: &str) -> Result<Key, E> {
        Ok(match k {
            "input" => Key::Input,
            "model" => Key::Model,
            "encoding_format" => Key::Format,
            "dimensions" => Key::Dimensions,
            "priority" => Key::Priority,
            _ => Key::Other,
        })
    }
}

struct Top(Rules);

impl<'de> DeserializeSeed<'de> for Top {
    type Value = Walked;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Walked, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top {
    type Value = Walked;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Walked, A::Error> {
        let mut w = Walked {
            object: true,
            ..Walked::default()
        };
        // A key given twice takes its last value, as a JSON object read whole does.
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match key {
                Key::Input => w.input = map.next_value_seed(InputSeed(self.0))?,
                Key::Model => w.model = Some(map.next_value_seed(FieldSeed)?),
                Key::Format => w.encoding_format = Some(map.next_value_seed(FieldSeed)?),
                Key::Dimensions => w.dimensions = Some(map.next_value_seed(FieldSeed)?),
                Key::Priority => w.priority = Some(map.next_value_seed(FieldSeed)?),
                Key::Other => map.next_value_seed(Skip)?,
            }
        }
        Ok(w)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Walked, A::Error> {
        Skip.visit_seq(seq)?;
        Ok(Walked::default())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Walked, E> {
        Ok(Walked::default())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Walked, E> {
        Ok(Walked::default())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Walked, E> {
        Ok(Walked::default())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Walked, E> {
        Ok(Walked::default())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Walked, E> {
        Ok(Walked::default())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Walked, E> {
        Ok(Walked::default())
    }
}

/// Any value, read and dropped: checked as any JSON is (strings as UTF-8, nesting against
/// the 128 levels, which `IgnoredAny` would not count), kept nowhere.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry_seed(Skip, Skip)?.is_some() {}
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Values of an array or object shown in a message at most (the rest is walked, not kept).
const SHOWN_VALUES: usize = 16;
/// Characters of a string shown in a message at most.
const SHOWN_CHARS: usize = 40;

/// A value read into a `Value` while `budget` lasts; `true` when some of it was left out.
struct Partial<'b>(&'b mut usize);

impl<'de> DeserializeSeed<'de> for Partial<'_> {
    type Value = (Value, bool);
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(Value, bool), D::Error> {
        d.deserialize_any(self)
    }
}

fn scalar(v: Value) -> (Value, bool) {
    (v, false)
}

impl<'de> Visitor<'de> for Partial<'_> {
    type Value = (Value, bool);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(Value, bool), A::Error> {
        let mut items = Vec::new();
        let mut cut = false;
        loop {
            if *self.0 == 0 {
                cut |= seq.next_element_seed(Skip)?.is_some();
                if !cut {
                    break;
                }
                continue;
            }
            *self.0 -= 1;
            match seq.next_element_seed(Partial(&mut *self.0))? {
                Some((v, c)) => {
                    items.push(v);
                    cut |= c;
                }
                None => break,
            }
        }
        Ok((Value::Array(items), cut))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(Value, bool), A::Error> {
        let mut o = Map::new();
        let mut cut = false;
        loop {
            if *self.0 == 0 {
                let more = map.next_entry_seed(Skip, Skip)?.is_some();
                cut |= more;
                if !more {
                    break;
                }
                continue;
            }
            *self.0 -= 1;
            let Some(k) = map.next_key::<String>()? else {
                break;
            };
            let (v, c) = map.next_value_seed(Partial(&mut *self.0))?;
            o.insert(k, v);
            cut |= c;
        }
        Ok((Value::Object(o), cut))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(Value, bool), E> {
        if s.chars().nth(SHOWN_CHARS).is_some() {
            return Ok((Value::String(s.chars().take(SHOWN_CHARS).collect()), true));
        }
        Ok(scalar(Value::String(s.into())))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(Value, bool), E> {
        Ok(scalar(v.into()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(Value, bool), E> {
        Ok(scalar(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(Value, bool), E> {
        Ok(scalar(
            Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(Value, bool), E> {
        Ok(scalar(v.into()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(Value, bool), E> {
        Ok(scalar(Value::Null))
    }
}

/// `model`, `encoding_format`, `dimensions` and `priority`: what `request.rs` needs to judge
/// them.
struct FieldSeed;

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = Field;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Field, D::Error> {
        d.deserialize_any(self)
    }
}

/// A container as a message shows it.
fn shown((v, cut): (Value, bool)) -> String {
    if cut {
        format!("{v}…")
    } else {
        v.to_string()
    }
}

impl<'de> Visitor<'de> for FieldSeed {
    type Value = Field;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Field, E> {
        Ok(Field::Text(s.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Field, E> {
        Ok(Field::Unsigned(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Field, E> {
        Ok(Field::Null)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Field, E> {
        Ok(Field::Shown(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Field, E> {
        Ok(Field::Shown(float(v)))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Field, E> {
        Ok(Field::Shown(v.to_string()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Field, A::Error> {
        let mut budget = SHOWN_VALUES;
        Ok(Field::Shown(shown(Partial(&mut budget).visit_seq(seq)?)))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Field, A::Error> {
        let mut budget = SHOWN_VALUES;
        Ok(Field::Shown(shown(Partial(&mut budget).visit_map(map)?)))
    }
}

/// A JSON number read as a float, as serde_json writes it.
fn float(v: f64) -> String {
    Number::from_f64(v).map_or_else(|| "null".into(), |n| n.to_string())
}

#[cfg(test)]
pub(super) mod oracle;
