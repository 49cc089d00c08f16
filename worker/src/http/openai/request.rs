//! The body of `POST /v1/embeddings` as OpenAI defines it: `input` (a string, an array of
//! strings, an array of token ids, or an array of arrays of token ids; at most
//! [`MAX_INPUTS`]), `model` (required, echoed), `encoding_format` (`float` or `base64`),
//! `dimensions` (a positive integer), `user` (accepted, unused) and vLLM's `priority` (an
//! integer, lower served earlier, 0 the default: the request's lane). Each refusal is a 400
//! naming the field. The body is read by one streaming pass (`walk.rs`) that keeps only
//! what the limits let a request hold; this file judges what it found.

use super::walk::{walk, Fault, Field, Kind, Seen};
pub use super::walk::{Rules, MAX_INPUTS};

use super::error::OaiError;
use vramfork::lanes::{self, Lane};

/// Token ids one input may carry, unless the model's `max_length` is larger: what OpenAI's
/// embedding models take (8,191 tokens), so a client that cuts its inputs for them —
/// LangChain's `OpenAIEmbeddings` sends chunks of 8,191 ids — is never refused.
pub const MAX_IDS_PER_INPUT: usize = 8192;

/// What is to be embedded.
#[derive(Debug, PartialEq)]
pub enum Input {
    Texts(Vec<String>),
    /// Token ids, one row per input.
    Ids(Vec<Vec<u32>>),
}

impl Input {
    pub fn len(&self) -> usize {
        match self {
            Input::Texts(t) => t.len(),
            Input::Ids(r) => r.len(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    Float,
    Base64,
}

#[derive(Debug)]
pub struct EmbeddingsRequest {
    pub input: Input,
    pub model: String,
    pub format: Format,
    pub dimensions: Option<usize>,
    /// The lane `priority` asks for (`None`: absent or null).
    pub priority: Option<Lane>,
}

const SHAPES: &str =
    "a string, an array of strings, an array of token ids or an array of arrays of token ids";

fn bad_input(message: String) -> OaiError {
    OaiError::invalid("input", "invalid_input", message)
}

/// The request in `body`, read in one streaming pass (`walk.rs`) that keeps no more than
/// `rules` let it: refused at the first input past [`MAX_INPUTS`], at the first id of a
/// model that takes text only (`token_ids_not_accepted`), at a row of more ids than
/// `rules.max_ids`. Of several faults the one named is the one a reading of the whole body
/// would name first: the body's syntax, `model`, `input`, `encoding_format`, `dimensions`,
/// then token ids a model does not take.
pub fn parse(body: &[u8], rules: Rules) -> Result<EmbeddingsRequest, OaiError> {
    let w = walk(body, rules).map_err(|e| {
        OaiError::invalid("body", "invalid_json", format!("the body is not JSON: {e}"))
    })?;
    if !w.object {
        return Err(OaiError::invalid(
            "body",
            "invalid_json",
            "the body must be a JSON object with `input` and `model`",
        ));
    }
    let model = match w.model {
        Some(Field::Text(m)) => m,
        None | Some(Field::Null) => {
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
    let input = input(w.input, rules)?;
    let format = format(w.encoding_format)?;
    let dimensions = dimensions(w.dimensions)?;
    if matches!(input, Input::Ids(_)) && !rules.token_ids {
        return Err(token_ids_refusal());
    }
    let priority = priority(w.priority)?;
    Ok(EmbeddingsRequest {
        input,
        model,
        format,
        dimensions,
        priority,
    })
}

/// Token ids sent to a model that takes text only.
pub fn token_ids_refusal() -> OaiError {
    OaiError::invalid(
        "input",
        "token_ids_not_accepted",
        "`input` holds token ids, and this model takes text only (its metadata's `embeddings.token_ids` is off): ids from another tokenizer mean nothing to it. Send the text; LangChain's OpenAIEmbeddings sends token ids unless made with check_embedding_ctx_length=False",
    )
}

fn input(seen: Seen, rules: Rules) -> Result<Input, OaiError> {
    let items = match seen {
        Seen::Missing => return Err(bad_input(format!("`input` is required: {SHAPES}"))),
        Seen::Text(s) if s.is_empty() => return Err(fault(Fault::EmptyText(None), rules)),
        Seen::Text(s) => return Ok(Input::Texts(vec![s])),
        Seen::Other => return Err(bad_input(format!("`input` must be {SHAPES}"))),
        Seen::Array(items) => items,
    };
    let Some(kind) = items.kind else {
        return Err(bad_input("`input` is an empty array".into()));
    };
    if matches!(kind, Kind::Texts | Kind::Rows) && items.n > MAX_INPUTS {
        return Err(bad_input(format!(
            "`input` has {} inputs; a request takes at most {MAX_INPUTS}: send them in several requests",
            items.n
        )));
    }
    if let Some(f) = items.fault {
        return Err(fault(f, rules));
    }
    match kind {
        Kind::Texts => Ok(Input::Texts(items.texts)),
        // Ids not kept for a model that takes none: `parse` refuses them.
        Kind::Ids | Kind::Rows => Ok(Input::Ids(items.rows)),
        Kind::Other => Err(bad_input(format!("`input` must be {SHAPES}"))),
    }
}

fn at(i: Option<usize>) -> String {
    i.map_or_else(|| "`input`".into(), |i| format!("`input[{i}]`"))
}

fn fault(f: Fault, rules: Rules) -> OaiError {
    bad_input(match f {
        Fault::EmptyText(i) => format!("{} is an empty string", at(i)),
        Fault::NotText(i) => format!(
            "`input[{i}]` is not a string; an array of strings must hold strings only"
        ),
        Fault::NotRow(i) => format!(
            "`input[{i}]` is not an array of token ids; an array of arrays must hold arrays of token ids only"
        ),
        Fault::EmptyRow(i) => format!("{} is an empty array of token ids", at(i)),
        Fault::NotId(i, j, v) => format!(
            "{} element {j} is {v}, not a token id (an integer from 0 to 4294967295)",
            at(i)
        ),
        Fault::LongRow(i) => format!(
            "{} holds more than {} token ids, the most one input may hold here (the model's `max_length`, or 8192, OpenAI's own limit, if larger): cut it before sending",
            at(i),
            rules.max_ids
        ),
    })
}

fn format(f: Option<Field>) -> Result<Format, OaiError> {
    match f {
        None | Some(Field::Null) => Ok(Format::Float),
        Some(Field::Text(s)) if s == "float" => Ok(Format::Float),
        Some(Field::Text(s)) if s == "base64" => Ok(Format::Base64),
        Some(v) => Err(OaiError::invalid(
            "encoding_format",
            "invalid_encoding_format",
            format!(
                "`encoding_format` is {}; it takes \"float\" (the default) or \"base64\"",
                v.shown()
            ),
        )),
    }
}

fn dimensions(f: Option<Field>) -> Result<Option<usize>, OaiError> {
    match f {
        None | Some(Field::Null) => Ok(None),
        Some(Field::Unsigned(n)) if n >= 1 && usize::try_from(n).is_ok() => Ok(Some(n as usize)),
        Some(v) => Err(OaiError::invalid(
            "dimensions",
            "invalid_dimensions",
            format!("`dimensions` is {}; it takes a positive integer", v.shown()),
        )),
    }
}

/// vLLM's `priority`: an integer, lower served earlier (`vramfork::lanes`).
fn priority(f: Option<Field>) -> Result<Option<Lane>, OaiError> {
    let refused =
        |shown: &str| OaiError::invalid("priority", "invalid_priority", lanes::vllm_refusal(shown));
    match f {
        None | Some(Field::Null) => Ok(None),
        Some(Field::Unsigned(n)) => Ok(Some(i64::try_from(n).map_or(Lane::Low, Lane::of_vllm))),
        Some(Field::Shown(s)) => s
            .parse::<i64>()
            .map(|p| Some(Lane::of_vllm(p)))
            .map_err(|_| refused(&s)),
        Some(v) => Err(refused(&v.shown())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const IDS: Rules = Rules {
        token_ids: true,
        max_ids: MAX_IDS_PER_INPUT,
    };

    fn p(v: Value) -> Result<EmbeddingsRequest, OaiError> {
        parse(&serde_json::to_vec(&v).unwrap(), IDS)
    }

    fn refused(v: Value) -> Value {
        p(v).unwrap_err().body()["error"].clone()
    }

    #[test]
    fn the_four_input_shapes_and_the_options() {
        let r = p(json!({"input": "hi", "model": "m"})).unwrap();
        assert_eq!(r.input, Input::Texts(vec!["hi".into()]));
        assert_eq!((r.format, r.dimensions), (Format::Float, None));
        let r = p(
            json!({"input": ["a", "b"], "model": "m", "encoding_format": "base64",
                         "dimensions": 8, "user": "u"}),
        )
        .unwrap();
        assert_eq!(r.input, Input::Texts(vec!["a".into(), "b".into()]));
        assert_eq!((r.format, r.dimensions), (Format::Base64, Some(8)));
        let r = p(json!({"input": [1, 2, 3], "model": "m"})).unwrap();
        assert_eq!(r.input, Input::Ids(vec![vec![1, 2, 3]]));
        let r = p(json!({"input": [[1], [2, 3]], "model": "m"})).unwrap();
        assert_eq!(r.input, Input::Ids(vec![vec![1], vec![2, 3]]));
        assert_eq!(r.priority, None);
        for (level, lane) in [(-2, Lane::High), (0, Lane::Normal), (3, Lane::Low)] {
            let r = p(json!({"input": "hi", "model": "m", "priority": level})).unwrap();
            assert_eq!(r.priority, Some(lane), "{level}");
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        for (body, param) in [
            (json!({"input": "x"}), "model"),
            (json!({"input": 3, "model": "m"}), "input"),
            (json!({"input": [], "model": "m"}), "input"),
            (json!({"input": "", "model": "m"}), "input"),
            (json!({"input": ["a", 1], "model": "m"}), "input"),
            (json!({"input": [[1], "a"], "model": "m"}), "input"),
            (json!({"input": [1, -2], "model": "m"}), "input"),
            (json!({"input": [1.5], "model": "m"}), "input"),
            (json!({"input": [[]], "model": "m"}), "input"),
            (json!({"input": [{"a": 1}], "model": "m"}), "input"),
            (
                json!({"input": "x", "model": "m", "encoding_format": "int8"}),
                "encoding_format",
            ),
            (
                json!({"input": "x", "model": "m", "dimensions": 0}),
                "dimensions",
            ),
            (
                json!({"input": "x", "model": "m", "dimensions": "8"}),
                "dimensions",
            ),
            (
                json!({"input": "x", "model": "m", "priority": "high"}),
                "priority",
            ),
            (
                json!({"input": "x", "model": "m", "priority": 1.5}),
                "priority",
            ),
            (
                json!({"input": "x", "model": "m", "priority": [1]}),
                "priority",
            ),
        ] {
            let e = refused(body.clone());
            assert_eq!(e["param"], param, "{body}: {e}");
            assert_eq!(e["type"], "invalid_request_error", "{body}: {e}");
        }
        let many = vec!["x"; MAX_INPUTS + 1];
        let e = refused(json!({"input": many, "model": "m"}));
        assert!(
            e["message"].as_str().unwrap().contains("at most 2048"),
            "{e}"
        );
        assert!(p(json!({"input": vec!["x"; MAX_INPUTS], "model": "m"})).is_ok());
    }

    /// Bodies of every shape, well and badly made, read by the pass and by the whole-body
    /// reading it replaced: the same request or the same refusal, word for word.
    #[test]
    fn the_streaming_pass_agrees_with_a_whole_reading_of_every_body() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let many_texts = serde_json::to_string(&vec!["ab"; 2100]).unwrap();
        let many_rows = serde_json::to_string(&vec![[7]; 2100]).unwrap();
        let mut bodies: Vec<String> = [
            r#"{"input": "hi", "model": "m"}"#,
            r#"{"input": ["a", "b\u00e9"], "model": "m", "user": {"x": [1]}}"#,
            r#"{"input": [1, 2], "model": "m", "input": "later wins"}"#,
            r#"{"input": [[1, 2], [3]], "model": "m", "dimensions": 4}"#,
            r#"{"input": [1, 2], "model": "m"}"#,
            r#"{"model": "m", "input": [[5, 6]]}"#,
            r#"{"input": [1, [2, {"a": [3, "x"]}]], "model": "m"}"#,
            r#"{"input": [1, 1.5, -2, 4294967296], "model": "m"}"#,
            r#"{"input": [[1], [2, true], [null]], "model": "m"}"#,
            r#"{"input": [[1], "a", 7], "model": "m"}"#,
            r#"{"input": ["a", "", 3], "model": "m"}"#,
            r#"{"input": [[], [1]], "model": "m"}"#,
            r#"{"input": [true], "model": "m"}"#,
            r#"{"input": [{"a": 1}], "model": "m"}"#,
            r#"{"input": {"a": 1}, "model": "m"}"#,
            r#"{"input": 7, "model": 7}"#,
            r#"{"input": "x", "model": null}"#,
            r#"{"input": null, "model": "m"}"#,
            r#"{"model": "m"}"#,
            r#"{"input": "x", "model": "m", "encoding_format": [1, 2, {"b": "c"}]}"#,
            r#"{"input": "x", "model": "m", "encoding_format": null, "dimensions": null}"#,
            r#"{"input": "x", "model": "m", "dimensions": 1e3}"#,
            r#"{"input": "x", "model": "m", "dimensions": -1}"#,
            r#"{"input": "x", "model": "m", "dimensions": 18446744073709551615}"#,
            r#"{"input": ["x", 1], "model": "m", "encoding_format": "int8"}"#,
            r#"{"input": [1.5, 2], "model": "m", "dimensions": 0}"#,
            r#"[1, 2, 3]"#,
            r#""text""#,
            r#"{"input": "x", "model": "m"} trailing"#,
            r#"{"input": ["x", 1, "#,
            r#"{"input": "\ud800", "model": "m"}"#,
            r#"{"input": [1e999], "model": "m"}"#,
            "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        bodies.push(format!(r#"{{"input": {deep}, "model": "m"}}"#));
        bodies.push(format!(r#"{{"user": {deep}, "input": "x", "model": "m"}}"#));
        bodies.push(format!(r#"{{"input": [1, {deep}], "model": "m"}}"#));
        bodies.push(format!(r#"{{"input": {many_texts}, "model": "m"}}"#));
        bodies.push(format!(r#"{{"input": {many_rows}, "model": 5}}"#));
        bodies.push(format!(r#"{{"input": {many_rows}, "model": "m"}}"#));
        let mut bytes: Vec<Vec<u8>> = bodies.into_iter().map(String::into_bytes).collect();
        bytes.push(b"{\"input\": \"\xff\", \"model\": \"m\"}".to_vec());
        for body in &bytes {
            for token_ids in [true, false] {
                let rules = Rules {
                    token_ids,
                    max_ids: MAX_IDS_PER_INPUT,
                };
                let new = parse(body, rules).map(|r| {
                    format!(
                        "{:?} {} {:?} {:?}",
                        r.input, r.model, r.format, r.dimensions
                    )
                });
                let new = new.map_err(|e| e.body());
                let old = crate::http::openai::walk::oracle::outcome(body, token_ids);
                let what = String::from_utf8_lossy(&body[..body.len().min(120)]);
                assert_eq!(new, old, "{what} (token ids {token_ids})");
            }
        }
    }

    #[test]
    fn what_is_kept_is_bounded_by_the_limits_not_by_the_body() {
        // Ids of a model that takes text only are never kept: refused.
        let ids = serde_json::to_vec(&json!({"input": vec![7; 100_000], "model": "m"})).unwrap();
        let off = Rules {
            token_ids: false,
            max_ids: MAX_IDS_PER_INPUT,
        };
        let e = parse(&ids, off).unwrap_err().body();
        assert_eq!(e["error"]["code"], "token_ids_not_accepted", "{e}");
        // A row longer than the bound is refused, naming it; one at the bound is taken.
        let small = Rules {
            token_ids: true,
            max_ids: 10,
        };
        let e = parse(&ids, small).unwrap_err().body();
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("`input` holds more than 10 token ids"),
            "{e}"
        );
        let rows = serde_json::to_vec(&json!({"input": [vec![7; 10], vec![7; 11]], "model": "m"}));
        let e = parse(&rows.unwrap(), small).unwrap_err().body();
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("`input[1]` holds more than 10"),
            "{e}"
        );
        // Past 2,048 inputs, the rest is counted, not kept.
        let mut items = crate::http::openai::walk::walk(
            &serde_json::to_vec(&json!({"input": vec![[7]; 5000], "model": "m"})).unwrap(),
            IDS,
        )
        .unwrap();
        let crate::http::openai::walk::Seen::Array(items) = std::mem::take(&mut items.input) else {
            panic!("an array")
        };
        assert_eq!((items.n, items.rows.len()), (5000, MAX_INPUTS));
    }
}
