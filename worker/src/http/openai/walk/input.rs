//! `input` walked element by element: its first element says what the array holds (ids,
//! strings, rows of ids), every element is counted and checked against that, and kept only
//! while the request can still be served — no input past [`MAX_INPUTS`], no id past
//! `Rules::max_ids` in a row, no id at all for a model that takes text only, nothing after
//! the first fault. So what one request holds in memory is bounded by the limits, not by
//! its body: 15 million one-id rows keep 2,048 rows of one id.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::{
    float, shown, Fault, Items, Kind, Partial, Rules, Seen, Skip, MAX_INPUTS, SHOWN_CHARS,
    SHOWN_VALUES,
};

pub(super) struct InputSeed(pub Rules);

impl<'de> DeserializeSeed<'de> for InputSeed {
    type Value = Seen;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Seen, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for InputSeed {
    type Value = Seen;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("`input`")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Seen, E> {
        Ok(Seen::Missing)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Seen, E> {
        Ok(Seen::Text(s.into()))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Seen, E> {
        Ok(Seen::Other)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Seen, E> {
        Ok(Seen::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Seen, E> {
        Ok(Seen::Other)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Seen, E> {
        Ok(Seen::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Seen, A::Error> {
        Skip.visit_map(map)?;
        Ok(Seen::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Seen, A::Error> {
        let mut items = Items::default();
        loop {
            let element = Element {
                items: &mut items,
                rules: self.0,
            };
            if seq.next_element_seed(element)?.is_none() {
                break;
            }
            items.n += 1;
        }
        Ok(Seen::Array(items))
    }
}

/// One element of an array `input` (element `items.n`).
struct Element<'a> {
    items: &'a mut Items,
    rules: Rules,
}

/// An element that is not a token id, as its fault shows it (only for the first fault).
enum Leaf<'s> {
    Id(u64),
    Shown(&'s dyn Fn() -> String),
}

impl Items {
    /// Notes a fault; the first is the one named.
    fn fault(&mut self, f: impl FnOnce() -> Fault) {
        if self.fault.is_none() {
            self.fault = Some(f());
        }
    }

    /// Whether the current element still counts for what is kept.
    fn keeps(&self) -> bool {
        self.fault.is_none() && self.n < MAX_INPUTS
    }

    /// The kind the first element set, or `first` for the first.
    fn kind(&mut self, first: Kind) -> Kind {
        *self.kind.get_or_insert(first)
    }
}

impl Element<'_> {
    /// A value other than a string or an array: an id, or shown by `what`.
    fn leaf(self, leaf: Leaf<'_>, first: Kind) {
        let (it, rules) = (self.items, self.rules);
        let i = it.n;
        match it.kind(first) {
            Kind::Ids => {
                if it.rows.is_empty() {
                    it.rows.push(Vec::new());
                }
                let keep = rules.token_ids && it.fault.is_none();
                match leaf {
                    Leaf::Id(v) => match u32::try_from(v) {
                        Ok(id) if i < rules.max_ids => {
                            if keep {
                                it.rows[0].push(id);
                            }
                        }
                        Ok(_) if rules.token_ids => it.fault(|| Fault::LongRow(None)),
                        Ok(_) => {}
                        Err(_) => it.fault(|| Fault::NotId(None, i, v.to_string())),
                    },
                    Leaf::Shown(show) => it.fault(|| Fault::NotId(None, i, show())),
                }
            }
            Kind::Texts => it.fault(|| Fault::NotText(i)),
            Kind::Rows => it.fault(|| Fault::NotRow(i)),
            Kind::Other => {}
        }
    }
}

/// A string cut as a message shows it.
pub(super) fn text_shown(s: &str) -> String {
    let cut = s.chars().nth(SHOWN_CHARS).is_some();
    let v = Value::String(s.chars().take(SHOWN_CHARS).collect());
    shown((v, cut))
}

impl<'de> DeserializeSeed<'de> for Element<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Element<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an input")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.leaf(Leaf::Id(v), Kind::Ids);
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.leaf(Leaf::Shown(&|| v.to_string()), Kind::Ids);
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.leaf(Leaf::Shown(&|| float(v)), Kind::Ids);
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.leaf(Leaf::Shown(&|| v.to_string()), Kind::Other);
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.leaf(Leaf::Shown(&|| "null".into()), Kind::Other);
        Ok(())
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        let it = self.items;
        let i = it.n;
        match it.kind(Kind::Texts) {
            Kind::Texts if s.is_empty() => it.fault(|| Fault::EmptyText(Some(i))),
            Kind::Texts => {
                if it.keeps() {
                    it.texts.push(s.into());
                }
            }
            Kind::Ids => it.fault(|| Fault::NotId(None, i, text_shown(s))),
            Kind::Rows => it.fault(|| Fault::NotRow(i)),
            Kind::Other => {}
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let it = self.items;
        let i = it.n;
        match it.kind(Kind::Other) {
            Kind::Ids if it.fault.is_none() => {
                let mut budget = SHOWN_VALUES;
                let v = shown(Partial(&mut budget).visit_map(map)?);
                it.fault(|| Fault::NotId(None, i, v));
                return Ok(());
            }
            Kind::Texts => it.fault(|| Fault::NotText(i)),
            Kind::Rows => it.fault(|| Fault::NotRow(i)),
            Kind::Ids | Kind::Other => {}
        }
        Skip.visit_map(map)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        let rules = self.rules;
        let it = self.items;
        let i = it.n;
        match it.kind(Kind::Rows) {
            Kind::Rows => return row(it, rules, seq),
            Kind::Ids if it.fault.is_none() => {
                let mut budget = SHOWN_VALUES;
                let v = shown(Partial(&mut budget).visit_seq(seq)?);
                it.fault(|| Fault::NotId(None, i, v));
                return Ok(());
            }
            Kind::Texts => it.fault(|| Fault::NotText(i)),
            Kind::Ids | Kind::Other => {}
        }
        Skip.visit_seq(seq)
    }
}

/// Row `items.n` of ids: kept (when ids are, and while nothing is wrong) up to
/// `rules.max_ids`.
fn row<'de, A: SeqAccess<'de>>(it: &mut Items, rules: Rules, mut seq: A) -> Result<(), A::Error> {
    let i = it.n;
    let mut keep = rules.token_ids && it.keeps();
    let mut ids = Vec::new();
    let mut j = 0usize;
    loop {
        let show = it.fault.is_none();
        let Some(leaf) = seq.next_element_seed(IdSeed { show })? else {
            break;
        };
        match leaf {
            Ok(id) if j < rules.max_ids => {
                if keep {
                    ids.push(id);
                }
            }
            Ok(_) if rules.token_ids => it.fault(|| Fault::LongRow(Some(i))),
            Ok(_) => {}
            Err(Some(s)) => it.fault(|| Fault::NotId(Some(i), j, s)),
            Err(None) => {}
        }
        j += 1;
        keep &= it.fault.is_none();
    }
    if j == 0 {
        it.fault(|| Fault::EmptyRow(Some(i)));
    } else if keep {
        it.rows.push(ids);
    }
    Ok(())
}

/// An element of a row: an id, or not (shown as a message shows it when `show`: only the
/// first fault is named, so later ones are not shown).
struct IdSeed {
    show: bool,
}

type Id = Result<u32, Option<String>>;

impl IdSeed {
    fn not(&self, show: impl FnOnce() -> String) -> Id {
        Err(self.show.then(show))
    }
}

impl<'de> DeserializeSeed<'de> for IdSeed {
    type Value = Id;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Id, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IdSeed {
    type Value = Id;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a token id")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Id, E> {
        Ok(u32::try_from(v).map_err(|_| self.show.then(|| v.to_string())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Id, E> {
        Ok(self.not(|| v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Id, E> {
        Ok(self.not(|| float(v)))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Id, E> {
        Ok(self.not(|| v.to_string()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Id, E> {
        Ok(self.not(|| "null".into()))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Id, E> {
        Ok(self.not(|| text_shown(s)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Id, A::Error> {
        if !self.show {
            Skip.visit_seq(seq)?;
            return Ok(Err(None));
        }
        let mut budget = SHOWN_VALUES;
        Ok(Err(Some(shown(Partial(&mut budget).visit_seq(seq)?))))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Id, A::Error> {
        if !self.show {
            Skip.visit_map(map)?;
            return Ok(Err(None));
        }
        let mut budget = SHOWN_VALUES;
        Ok(Err(Some(shown(Partial(&mut budget).visit_map(map)?))))
    }
}
