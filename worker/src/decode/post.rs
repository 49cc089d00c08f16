//! The `POST /` body formats: one numeric input as `{"inputs": <nested array>}` (the
//! streaming parser in `numeric.rs`) or by its name, one `BYTES` input as
//! `{"inputs": ["a document", …]}` or by its name, several inputs as
//! `{"inputs": {"<name>": <nested array>, …}}`.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use vramfork::metadata::TensorSpec;

use super::elements::{arg_from_json, Layout};
use super::numeric::{parse_body, INPUTS_IS_AN_OBJECT};
use super::{BodyError, NOT_AN_OBJECT};
use crate::args::Inputs;

/// Parses a `POST /` body for a model whose declared inputs are `inputs` (`None`: one
/// numeric input of any shape, float32). One numeric input: `{"inputs": <nested array>}`
/// (the streaming parser below). One `BYTES` input: `{"inputs": ["a document", …]}`.
/// Several inputs: `{"inputs": {"<name>": <nested array>, …}}`, every declared input once;
/// one declared input may be given that way too (the form the docs lead with).
pub fn parse_request(body: &[u8], inputs: Option<&[TensorSpec]>) -> Result<Inputs, BodyError> {
    match inputs {
        None => parse_body(body, None).map(Inputs::from),
        Some([one]) => match one.input_spec() {
            // The streaming parser reads the bare array; the object form (`{"inputs":
            // {"<name>": …}}`, the form every named input takes) is read by name, only
            // once the streaming parser has found an object there.
            Some(spec) => match parse_body(body, Some(&spec)) {
                Err(BodyError::Invalid(m)) if m == INPUTS_IS_AN_OBJECT => {
                    parse_named(body, std::slice::from_ref(one))
                }
                parsed => parsed.map(Inputs::from),
            },
            None => parse_named(body, std::slice::from_ref(one)),
        },
        Some(specs) => parse_named(body, specs),
    }
}

/// A body for text inputs or several named inputs: each input's value is kept as its JSON
/// text (no tree of values) and read in one pass by `elements.rs`.
fn parse_named(body: &[u8], specs: &[TensorSpec]) -> Result<Inputs, BodyError> {
    let names = || {
        specs
            .iter()
            .map(|s| format!("\"{}\"", s.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let invalid = BodyError::Invalid;
    let not_json = |e: serde_json::Error| BodyError::NotJson(e.to_string());
    // Checked first: serde would also read an array as a struct's fields in order.
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        serde_json::from_slice::<IgnoredAny>(body).map_err(not_json)?;
        return Err(invalid(NOT_AN_OBJECT.into()));
    }
    let doc: Named = serde_json::from_slice(body).map_err(not_json)?;
    let given = doc.inputs.ok_or_else(|| {
        let example: Vec<String> = specs.iter().map(|s| format!("\"{}\": …", s.name)).collect();
        invalid(format!(
            "request body has no `inputs` field; send {{\"inputs\": {{{}}}}}",
            example.join(", ")
        ))
    })?;
    let mut by_name: BTreeMap<String, &RawValue> = match given.get().as_bytes()[0] {
        b'{' => serde_json::from_str(given.get()).map_err(not_json)?,
        // The one input, given without its name.
        b'[' if specs.len() == 1 => BTreeMap::from([(specs[0].name.clone(), given)]),
        other => {
            let found = match other {
                b'[' => "an array",
                b'"' => "a string",
                b't' | b'f' => "a boolean",
                b'n' => "null",
                _ => "a number",
            };
            return Err(invalid(format!(
                "`inputs` must be an object naming the model's inputs ({}), found {found}",
                names()
            )));
        }
    };
    let mut args = Vec::with_capacity(specs.len());
    for spec in specs {
        let name = &spec.name;
        let v = by_name.remove(name).ok_or_else(|| {
            invalid(format!(
                "`inputs` lacks input \"{name}\"; the model takes {}",
                names()
            ))
        })?;
        let max_documents = spec.document.as_ref().map(|d| d.max_documents());
        let (shape, arg) = arg_from_json(name, v, spec.datatype, Layout::Nested, max_documents)?;
        spec.check_shape(&shape)
            .map_err(|e| invalid(format!("input {name}: {e}")))?;
        args.push(arg);
    }
    if let Some(extra) = by_name.keys().next() {
        return Err(invalid(format!(
            "`inputs` has \"{extra}\", which is not an input of the model; it takes {}",
            names()
        )));
    }
    Ok(Inputs { args })
}

/// A `POST /` body with named inputs, each input's value left as its JSON text.
#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    inputs: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Arg;
    use tch::Kind;
    use vramfork::metadata::Dtype;

    fn named(specs: &[(&str, vramfork::metadata::Datatype, &[i64])]) -> Vec<TensorSpec> {
        specs
            .iter()
            .map(|(n, d, s)| TensorSpec {
                name: n.to_string(),
                datatype: *d,
                shape: Some(s.to_vec()),
                document: None,
            })
            .collect()
    }

    #[test]
    fn named_inputs_and_text_bodies() {
        use vramfork::metadata::Datatype::{Bytes, Tensor as T};
        let specs = named(&[
            ("a", T(Dtype::Float32), &[-1, 2]),
            ("b", T(Dtype::Int64), &[-1]),
        ]);
        let body = br#"{"inputs": {"b": [7], "a": [[1, 2]]}}"#;
        let r = parse_request(body, Some(&specs)).unwrap();
        match &r.args[..] {
            [Arg::Tensor(a), Arg::Tensor(b)] => {
                assert_eq!((a.size(), a.kind()), (vec![1, 2], Kind::Float));
                assert_eq!((b.size(), b.kind()), (vec![1], Kind::Int64));
            }
            other => panic!("{other:?}"),
        }
        let text = named(&[("docs", Bytes, &[-1])]);
        for body in [
            &br#"{"inputs": ["x y", "z"]}"#[..],
            br#"{"inputs": {"docs": ["x y", "z"]}}"#,
        ] {
            match &parse_request(body, Some(&text)).unwrap().args[..] {
                [Arg::Strings(s)] => assert_eq!(s, &["x y", "z"]),
                other => panic!("{other:?}"),
            }
        }
        let cases: [(&[u8], &[TensorSpec], &str); 5] = [
            (
                br#"{"inputs": [["x"]]}"#,
                &text,
                "input docs: inputs have shape [1, 1]",
            ),
            (
                br#"{"inputs": "x"}"#,
                &text,
                "must be an object naming the model's inputs (\"docs\")",
            ),
            (
                br#"{"other": 1}"#,
                &specs,
                "no `inputs` field; send {\"inputs\": {\"a\": …, \"b\": …}}",
            ),
            (br#"["x"]"#, &text, "must be a JSON object"),
            (
                br#"{"inputs": {"a": [[1, 2]], "b": [[7]]}}"#,
                &specs,
                "input b: inputs have shape [1, 1]",
            ),
        ];
        for (body, specs, want) in cases {
            let e = parse_request(body, Some(specs)).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
        // A single numeric input still goes through the streaming parser.
        let one = named(&[("input__0", T(Dtype::Int32), &[-1])]);
        match &parse_request(br#"{"inputs": [1, 2]}"#, Some(&one))
            .unwrap()
            .args[..]
        {
            [Arg::Tensor(t)] => assert_eq!(t.kind(), Kind::Int),
            other => panic!("{other:?}"),
        }
    }

    /// The object form the docs lead with works for one numeric input too, with
    /// the same tensor as the bare array; a wrong name is refused naming the right one.
    #[test]
    fn one_numeric_input_may_be_given_by_name() {
        use vramfork::metadata::Datatype::Tensor as T;
        let one = named(&[("image", T(Dtype::Float32), &[-1, 2, 2])]);
        let tensor = |body: &[u8]| match parse_request(body, Some(&one)).unwrap().args.remove(0) {
            Arg::Tensor(t) => t,
            other => panic!("{other:?}"),
        };
        let bare = tensor(br#"{"inputs": [[[1, 2], [3, 4.5]]]}"#);
        let named_form = tensor(br#"{"inputs": {"image": [[[1, 2], [3, 4.5]]]}}"#);
        assert_eq!(bare.size(), vec![1, 2, 2]);
        assert!(bare.equal(&named_form));
        for (body, want) in [
            (
                &br#"{"inputs": {"img": [[[1, 2], [3, 4]]]}}"#[..],
                "`inputs` lacks input \"image\"",
            ),
            (br#"{"inputs": {"image": [[1, 2]]}}"#, "input image: "),
            (br#"{"inputs": {"image": [[["a", 2], [3, 4]]]}}"#, "image"),
        ] {
            let e = parse_request(body, Some(&one)).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
        // Without declared names, the object form says what it needs.
        let e = parse_request(br#"{"inputs": {"image": [1]}}"#, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("need the metadata to declare `inputs`"), "{e}");
    }
}
