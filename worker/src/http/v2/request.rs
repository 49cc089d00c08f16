//! A v2 inference request (`POST /v2/models/{name}[/versions/{v}]/infer`): its JSON header,
//! optionally followed by binary tensor data (Triton's binary tensor data extension:
//! `Inference-Header-Content-Length` says where the JSON ends, each input's
//! `parameters.binary_data_size` how many raw little-endian bytes it takes), turned into the
//! model's input tensor and what the answer should hold. Every way it can be wrong is a 400
//! that names the input.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use vramfork::metadata::TensorSpec;

use super::answer::Binary;
use crate::args::{Arg, Inputs};
use crate::decode::elements::{arg_from_json, Layout};
use crate::decode::BodyError;
use crate::infer::v2::{check, from_raw, Slots};
use crate::infer::Wanted;
use crate::infer::MAX_TIMEOUT_S;
use vramfork::lanes::{Lane, TRITON_LEVELS};

/// The JSON header. Values that may be large (`data`, `id`, parameters) are kept as their
/// JSON text, never as a tree of values: `data` is read in one pass by `elements.rs`.
#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    parameters: Params<'a>,
    #[serde(borrow)]
    inputs: Vec<InputHeader<'a>>,
    #[serde(borrow)]
    outputs: Option<Vec<OutputHeader<'a>>>,
}

type Params<'a> = BTreeMap<String, &'a RawValue>;

#[derive(Deserialize)]
struct InputHeader<'a> {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default, borrow)]
    parameters: Params<'a>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct OutputHeader<'a> {
    name: String,
    #[serde(default, borrow)]
    parameters: Params<'a>,
}

/// A value's JSON text for a message (long ones cut).
fn shown(v: &RawValue) -> String {
    let t = v.get();
    match t.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &t[..at]),
        None => t.to_string(),
    }
}

/// A parameter that is a whole number (`None` when absent or null).
fn whole(params: &Params<'_>, key: &str) -> Result<Option<u64>, String> {
    match params.get(key).map(|v| v.get()) {
        None | Some("null") => Ok(None),
        Some(t) => t.parse().map(Some).map_err(|_| shown(params[key])),
    }
}

/// A parsed request.
pub struct Infer {
    pub id: Option<String>,
    pub inputs: Inputs,
    pub wanted: Wanted,
    /// Which outputs' data go binary.
    pub binary: Binary,
    /// `parameters.hwFetch: true`.
    pub hw_fetch: bool,
    /// Outputs asked for as their best classes (`parameters.classification`: the count).
    pub classes: Vec<(String, usize)>,
    /// `parameters.timeout` (microseconds, as Triton defines it; 0 = none): the client's
    /// deadline, from the request's arrival.
    pub timeout: Option<std::time::Duration>,
    /// `parameters.priority` (Triton's levels: `vramfork::lanes`), when given.
    pub priority: Option<Lane>,
}

/// `parameters.priority`: a level from 1 (the highest) to 3, 0 the default level; absent or
/// null is none.
fn priority(params: &Params<'_>) -> Result<Option<Lane>, String> {
    let p = whole(params, "priority").map_err(|other| {
        format!("parameter priority must be a whole number, a level from 1 (the highest) to {TRITON_LEVELS} or 0 for the default level, not {other}")
    })?;
    p.map(Lane::of_triton).transpose()
}

/// `parameters.timeout`: a whole number of microseconds, at most a day as the
/// `X-Request-Timeout` header; 0 (Triton: "no timeout") or absent is none.
fn timeout(params: &Params<'_>) -> Result<Option<std::time::Duration>, String> {
    let max_us = (MAX_TIMEOUT_S * 1e6) as u64;
    let us = whole(params, "timeout").map_err(|other| {
        format!("parameter timeout must be a whole number of microseconds (0 = none), not {other}")
    })?;
    if let Some(us) = us.filter(|us| *us > max_us) {
        return Err(format!(
            "parameter timeout must be at most {max_us} microseconds (a day, as X-Request-Timeout), not {us}"
        ));
    }
    Ok(us
        .filter(|us| *us > 0)
        .map(std::time::Duration::from_micros))
}

fn flag(params: &Params<'_>, key: &str) -> Result<bool, String> {
    match params.get(key).map(|v| v.get()) {
        None | Some("null" | "false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(format!(
            "parameter {key} must be true or false, not {}",
            shown(params[key])
        )),
    }
}

/// Parses a request body; `header_len` is `Inference-Header-Content-Length` when sent,
/// `specs` the model's declared inputs. Every refusal is a [`BodyError`] naming the input.
pub fn parse(
    body: &[u8],
    header_len: Option<usize>,
    specs: Option<&[TensorSpec]>,
) -> Result<Infer, BodyError> {
    parse_infer(body, header_len, specs)
}

fn parse_infer(
    body: &[u8],
    header_len: Option<usize>,
    specs: Option<&[TensorSpec]>,
) -> Result<Infer, BodyError> {
    let (head, mut tail) = match header_len {
        None => (body, &[][..]),
        Some(n) if n <= body.len() => body.split_at(n),
        Some(n) => {
            return Err(BodyError::Invalid(format!(
                "Inference-Header-Content-Length is {n}, but the body has only {} bytes",
                body.len()
            )))
        }
    };
    let h: Header = serde_json::from_slice(head)
        .map_err(|e| format!("the inference request is not a valid v2 request: {e}"))?;
    let id = match h.id {
        None => None,
        Some(v) => match serde_json::from_str::<String>(v.get()) {
            Ok(s) => Some(s),
            Err(_) => {
                return Err(BodyError::Invalid(format!(
                    "`id` must be a string, not {}",
                    shown(v)
                )))
            }
        },
    };
    let hw_fetch = flag(&h.parameters, "hwFetch")?;
    let timeout = timeout(&h.parameters)?;
    let priority = priority(&h.parameters)?;
    let binary_default = flag(&h.parameters, "binary_data_output")?;
    // The arguments in the declared order; binary data is taken in the request's order.
    let mut slots = Slots::new(specs, h.inputs.len())?;
    for input in h.inputs {
        let at = slots.place(&input.name)?;
        let arg = one_input(input, slots.spec(at), &mut tail)?;
        slots.fill(at, arg);
    }
    if !tail.is_empty() {
        return Err(BodyError::Invalid(format!(
            "{} bytes of binary data follow the header that no input claims",
            tail.len()
        )));
    }
    let mut binary = Binary {
        named: Vec::new(),
        default: binary_default,
    };
    let mut classes = Vec::new();
    let outputs = match h.outputs {
        None => None,
        Some(outs) => Some(
            outs.into_iter()
                .map(|o| {
                    let bin = flag(&o.parameters, "binary_data")? || binary_default;
                    binary.named.push(bin);
                    match whole(&o.parameters, "classification") {
                        Ok(None) => {}
                        Ok(Some(n)) if n >= 1 => classes.push((o.name.clone(), n as usize)),
                        Ok(Some(_)) | Err(_) => {
                            return Err(format!(
                                "output {}: parameter classification must be a whole number of classes, 1 or more, not {}",
                                o.name,
                                shown(o.parameters["classification"])
                            ))
                        }
                    }
                    Ok(o.name)
                })
                .collect::<Result<_, String>>()?,
        ),
    };
    let wanted = Wanted {
        outputs,
        declared: None,
    };
    Ok(Infer {
        id,
        inputs: slots.inputs(),
        wanted,
        binary,
        hw_fetch,
        classes,
        timeout,
        priority,
    })
}

/// One request input, checked against its declaration (`None`: the undeclared single
/// input), its binary data (if any) taken from the front of `tail`.
fn one_input(
    input: InputHeader<'_>,
    spec: Option<&TensorSpec>,
    tail: &mut &[u8],
) -> Result<Arg, BodyError> {
    let name = &input.name;
    let c = check(name, &input.datatype, &input.shape, spec)?;
    let binary_size = whole(&input.parameters, "binary_data_size")
        .map_err(|v| {
            format!("input {name}: binary_data_size must be a non-negative integer, not {v}")
        })?
        .map(|n| n as usize);
    match (binary_size, &input.data) {
        (Some(_), Some(_)) => Err(BodyError::Invalid(format!(
            "input {name} has both `data` and binary_data_size"
        ))),
        (None, None) => Err(BodyError::Invalid(format!(
            "input {name} has no `data` and no binary data"
        ))),
        (Some(size), None) => {
            if let Some(want) = c.raw_len().filter(|want| size != *want) {
                return Err(BodyError::Invalid(format!(
                    "input {name}: binary_data_size is {size} bytes; shape {:?} of {} takes {want}",
                    input.shape, input.datatype
                )));
            }
            if size > tail.len() {
                return Err(BodyError::Invalid(format!(
                    "input {name}: binary_data_size is {size} bytes, but only {} follow the header",
                    tail.len()
                )));
            }
            let (bytes, rest) = tail.split_at(size);
            *tail = rest;
            from_raw(name, &c, &input.shape, bytes)
        }
        (None, Some(data)) => arg_from_json(
            name,
            data,
            c.datatype,
            Layout::Shape(&input.shape),
            c.max_documents,
        )
        .map(|(_, arg)| arg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Tensor;
    use vramfork::metadata::{Datatype, SINGLE_INPUT};
    // The messages, as `BodyError::Invalid` carries them.

    /// The parse, its refusal as the message the client gets.
    fn parse(
        body: &[u8],
        header_len: Option<usize>,
        specs: Option<&[TensorSpec]>,
    ) -> Result<Infer, String> {
        super::parse_infer(body, header_len, specs).map_err(|e| e.to_string())
    }

    use vramfork::metadata::Dtype;

    fn spec() -> Vec<TensorSpec> {
        vec![TensorSpec {
            name: SINGLE_INPUT.into(),
            datatype: Datatype::Tensor(Dtype::Float32),
            shape: Some(vec![-1, 4]),
            document: None,
        }]
    }

    fn tensor(i: &Infer, at: usize) -> &Tensor {
        match &i.inputs.args[at] {
            Arg::Tensor(t) => t,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn json_and_binary_requests_give_the_same_tensor() {
        let json = br#"{"id":"a","inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[[1,2,3,4]]}]}"#;
        let a = parse(json, None, Some(&spec())).unwrap();
        assert_eq!(a.id.as_deref(), Some("a"));
        let head = br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}],"outputs":[{"name":"output__0","parameters":{"binary_data":true}}]}"#;
        let mut body = head.to_vec();
        for f in [1f32, 2.0, 3.0, 4.0] {
            body.extend_from_slice(&f.to_le_bytes());
        }
        let b = parse(&body, Some(head.len()), Some(&spec())).unwrap();
        assert!(tensor(&a, 0).equal(tensor(&b, 0)));
        assert_eq!(b.wanted.outputs, Some(vec!["output__0".to_string()]));
        assert_eq!(b.binary.named, vec![true]);
    }

    #[test]
    fn every_malformed_request_names_its_problem() {
        let s = spec();
        let s = Some(s.as_slice());
        let cases: &[(&[u8], Option<usize>, &str)] = &[
            (b"{", None, "not a valid v2 request"),
            (br#"{"inputs":[]}"#, None, "has 0 inputs; this model takes 1: input__0"),
            (br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#, None, "unknown input 'x'"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"INT64","data":[1,2,3,4]}]}"#, None, "input input__0 has datatype INT64; the model takes FP32"),
            (br#"{"inputs":[{"name":"input__0","shape":[4],"datatype":"BYTES","data":["a","b","c","d"]}]}"#, None, "has datatype BYTES; the model takes FP32"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP33","data":[1,2,3,4]}]}"#, None, "unknown datatype"),
            (br#"{"inputs":[{"name":"input__0","shape":[2,4],"datatype":"FP32","data":[1,2,3,4]}]}"#, None, "has 4 elements"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}"#, None, "the model expects"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,"x",4]}]}"#, None, "element 2"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,1e39,4]}]}"#, None, "element 2"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32"}]}"#, None, "no `data`"),
            (br#"{"id":7,"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#, None, "`id` must be a string"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":12}}]}"#, Some(usize::MAX), "takes 16"),
            (br#"{"inputs":[{"name":"input__0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}"#, Some(usize::MAX), "only"),
        ];
        for (body, hl, want) in cases {
            let hl = hl.map(|n| n.min(body.len()));
            let e = parse(body, hl, s)
                .err()
                .unwrap_or_else(|| panic!("accepted {}", String::from_utf8_lossy(body)));
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
        // Without a declared input: shapes whose product overflows, negative sizes.
        let huge = br#"{"inputs":[{"name":"input__0","shape":[4294967296,4294967296,16],"datatype":"FP32","data":[]}]}"#;
        assert!(parse(huge, None, None).err().unwrap().contains("too large"));
        let neg = br#"{"inputs":[{"name":"input__0","shape":[-1,4],"datatype":"FP32","data":[]}]}"#;
        assert!(parse(neg, None, None).err().unwrap().contains("negative"));
        // Binary data beyond what the inputs claim.
        let head = br#"{"inputs":[{"name":"input__0","shape":[1],"datatype":"INT8","parameters":{"binary_data_size":1}}]}"#;
        let mut body = head.to_vec();
        body.extend_from_slice(&[1, 2]);
        assert!(parse(&body, Some(head.len()), None)
            .err()
            .unwrap()
            .contains("no input claims"));
        // BYTES to a model that declares no inputs.
        let bytes =
            br#"{"inputs":[{"name":"input__0","shape":[1],"datatype":"BYTES","data":["a"]}]}"#;
        assert!(parse(bytes, None, None)
            .err()
            .unwrap()
            .contains("declares no BYTES input"));
    }

    fn pair() -> Vec<TensorSpec> {
        vec![
            TensorSpec {
                name: "features".into(),
                datatype: Datatype::Tensor(Dtype::Float32),
                shape: Some(vec![-1, 3]),
                document: None,
            },
            TensorSpec {
                name: "docs".into(),
                datatype: Datatype::Bytes,
                shape: Some(vec![-1]),
                document: None,
            },
        ]
    }

    #[test]
    fn named_inputs_come_in_declared_order_whatever_the_request_order() {
        // docs first in the request, and binary: its bytes come first in the tail.
        let head = br#"{"inputs":[{"name":"docs","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":15}},{"name":"features","shape":[1,3],"datatype":"FP32","parameters":{"binary_data_size":12}}]}"#;
        let mut body = head.to_vec();
        for d in ["ab", "café"] {
            body.extend_from_slice(&(d.len() as u32).to_le_bytes());
            body.extend_from_slice(d.as_bytes());
        }
        for f in [1f32, 2.0, 3.0] {
            body.extend_from_slice(&f.to_le_bytes());
        }
        let p = pair();
        let r = parse(&body, Some(head.len()), Some(&p)).unwrap();
        assert_eq!(tensor(&r, 0).size(), [1, 3]);
        match &r.inputs.args[1] {
            Arg::Strings(s) => assert_eq!(s, &["ab", "café"]),
            other => panic!("{other:?}"),
        }
        let json = br#"{"inputs":[{"name":"features","shape":[1,3],"datatype":"FP32","data":[1,2,3]},{"name":"docs","shape":[1],"datatype":"BYTES","data":["x"]}]}"#;
        assert!(parse(json, None, Some(&p)).is_ok());
    }

    #[test]
    fn named_inputs_missing_twice_unknown_or_mistyped_are_named() {
        let p = pair();
        let cases: &[(&[u8], &str)] = &[
            (br#"{"inputs":[{"name":"features","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}"#, "has 1 inputs; this model takes 2: features, docs"),
            (br#"{"inputs":[{"name":"features","shape":[1,3],"datatype":"FP32","data":[1,2,3]},{"name":"features","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}"#, "input features is given twice"),
            (br#"{"inputs":[{"name":"features","shape":[1,3],"datatype":"FP32","data":[1,2,3]},{"name":"doc","shape":[1],"datatype":"BYTES","data":["x"]}]}"#, "unknown input 'doc'; this model takes features, docs"),
            (br#"{"inputs":[{"name":"features","shape":[1,3],"datatype":"FP32","data":[1,2,3]},{"name":"docs","shape":[1],"datatype":"FP32","data":[1]}]}"#, "input docs has datatype FP32; the model takes BYTES"),
            (br#"{"inputs":[{"name":"features","shape":[1,3],"datatype":"BYTES","data":["a","b","c"]},{"name":"docs","shape":[1],"datatype":"BYTES","data":["x"]}]}"#, "input features has datatype BYTES; the model takes FP32"),
            (br#"{"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]},{"name":"docs","shape":[1],"datatype":"BYTES","data":["x"]}]}"#, "input features: inputs have shape [1, 4], the model expects [-1, 3]"),
            (br#"{"inputs":[{"name":"features","shape":[1,3],"datatype":"FP32","data":[1,2,3]},{"name":"docs","shape":[2],"datatype":"BYTES","data":["x", 3]}]}"#, "input docs is BYTES: element 1 (3) is not a string"),
        ];
        for (body, want) in cases {
            let e = parse(body, None, Some(&p))
                .err()
                .unwrap_or_else(|| panic!("accepted {}", String::from_utf8_lossy(body)));
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }

    #[test]
    fn parameters_priority_is_a_triton_level() {
        let s = spec();
        let body = |p: &str| {
            format!(
                r#"{{"parameters":{{"priority":{p}}},"inputs":[{{"name":"input__0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}}]}}"#
            )
        };
        let lane =
            |p: &str| parse(body(p).as_bytes(), None, Some(s.as_slice())).map(|r| r.priority);
        assert_eq!(lane("1").ok(), Some(Some(Lane::High)));
        assert_eq!(lane("0").ok(), Some(Some(Lane::Normal)));
        assert_eq!(lane("2").ok(), Some(Some(Lane::Normal)));
        assert_eq!(lane("3").ok(), Some(Some(Lane::Low)));
        assert_eq!(lane("null").ok(), Some(None));
        for bad in ["4", "-1", "1.5", "\"high\"", "true", "[1]"] {
            let e = lane(bad)
                .err()
                .unwrap_or_else(|| panic!("accepted priority {bad}"));
            assert!(e.contains("parameter priority"), "{bad}: {e:?}");
        }
    }
}
