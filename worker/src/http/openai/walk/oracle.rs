//! The reading of the body this streaming pass replaced — a `serde_json::Value` of the whole
//! body, then its fields — kept as the oracle the pass must agree with: the same request,
//! or the same refusal (status, field, code, message), for every body.

use serde_json::{Map, Value};

use crate::http::openai::error::OaiError;
use crate::http::openai::request::{EmbeddingsRequest, Format, Input, MAX_INPUTS};

const SHAPES: &str =
    "a string, an array of strings, an array of token ids or an array of arrays of token ids";

fn bad_input(message: String) -> OaiError {
    OaiError::invalid("input", "invalid_input", message)
}

/// The request in `body`.
pub fn parse(body: &[u8]) -> Result<EmbeddingsRequest, OaiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        OaiError::invalid("body", "invalid_json", format!("the body is not JSON: {e}"))
    })?;
    let Value::Object(o) = v else {
        return Err(OaiError::invalid(
            "body",
            "invalid_json",
            "the body must be a JSON object with `input` and `model`",
        ));
    };
    let model = match o.get("model") {
        Some(Value::String(m)) => m.clone(),
        None | Some(Value::Null) => {
            return Err(OaiError::invalid(
                "model",
                "missing_model",
                "`model` is required (any name: this server serves one model, listed by GET /v1/models)",
            ))
        }
        Some(_) => {
            return Err(OaiError::invalid(
                "model",
                "invalid_model",
                "`model` must be a string",
            ))
        }
    };
    Ok(EmbeddingsRequest {
        input: input(&o)?,
        model,
        format: format(&o)?,
        dimensions: dimensions(&o)?,
        // The bodies it is compared on give none.
        priority: None,
    })
}

fn input(o: &Map<String, Value>) -> Result<Input, OaiError> {
    let items = match o.get("input") {
        None | Some(Value::Null) => {
            return Err(bad_input(format!("`input` is required: {SHAPES}")))
        }
        Some(Value::String(s)) => return Ok(Input::Texts(vec![text(s, None)?])),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(bad_input(format!("`input` must be {SHAPES}"))),
    };
    if items.is_empty() {
        return Err(bad_input("`input` is an empty array".into()));
    }
    match &items[0] {
        // One input of token ids.
        Value::Number(_) => Ok(Input::Ids(vec![ids(items, None)?])),
        Value::String(_) | Value::Array(_) => {
            if items.len() > MAX_INPUTS {
                return Err(bad_input(format!(
                    "`input` has {} inputs; a request takes at most {MAX_INPUTS}: send them in several requests",
                    items.len()
                )));
            }
            if let Value::String(_) = items[0] {
                let texts = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::String(s) => text(s, Some(i)),
                        _ => Err(bad_input(format!(
                            "`input[{i}]` is not a string; an array of strings must hold strings only"
                        ))),
                    })
                    .collect::<Result<_, _>>()?;
                return Ok(Input::Texts(texts));
            }
            let rows = items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Array(row) => ids(row, Some(i)),
                    _ => Err(bad_input(format!(
                        "`input[{i}]` is not an array of token ids; an array of arrays must hold arrays of token ids only"
                    ))),
                })
                .collect::<Result<_, _>>()?;
            Ok(Input::Ids(rows))
        }
        _ => Err(bad_input(format!("`input` must be {SHAPES}"))),
    }
}

fn at(i: Option<usize>) -> String {
    i.map_or_else(|| "`input`".into(), |i| format!("`input[{i}]`"))
}

fn text(s: &str, i: Option<usize>) -> Result<String, OaiError> {
    if s.is_empty() {
        return Err(bad_input(format!("{} is an empty string", at(i))));
    }
    Ok(s.to_string())
}

fn ids(row: &[Value], i: Option<usize>) -> Result<Vec<u32>, OaiError> {
    if row.is_empty() {
        return Err(bad_input(format!(
            "{} is an empty array of token ids",
            at(i)
        )));
    }
    row.iter()
        .enumerate()
        .map(|(j, v)| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    bad_input(format!(
                        "{} element {j} is {v}, not a token id (an integer from 0 to 4294967295)",
                        at(i)
                    ))
                })
        })
        .collect()
}

fn format(o: &Map<String, Value>) -> Result<Format, OaiError> {
    match o.get("encoding_format") {
        None | Some(Value::Null) => Ok(Format::Float),
        Some(Value::String(s)) if s == "float" => Ok(Format::Float),
        Some(Value::String(s)) if s == "base64" => Ok(Format::Base64),
        Some(v) => Err(OaiError::invalid(
            "encoding_format",
            "invalid_encoding_format",
            format!("`encoding_format` is {v}; it takes \"float\" (the default) or \"base64\""),
        )),
    }
}

fn dimensions(o: &Map<String, Value>) -> Result<Option<usize>, OaiError> {
    match o.get("dimensions") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&n| n >= 1)
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                OaiError::invalid(
                    "dimensions",
                    "invalid_dimensions",
                    format!("`dimensions` is {v}; it takes a positive integer"),
                )
            }),
    }
}

/// What the old reading gives, as the new must: the request's fields (with the ids the
/// model takes, and none for one that takes text only: the refusal), or the error's body.
pub fn outcome(body: &[u8], token_ids: bool) -> Result<String, serde_json::Value> {
    let r = parse(body).map_err(|e| e.body())?;
    if matches!(r.input, Input::Ids(_)) && !token_ids {
        return Err(super::super::request::token_ids_refusal().body());
    }
    Ok(format!(
        "{:?} {} {:?} {:?}",
        r.input, r.model, r.format, r.dimensions
    ))
}
