//! The endpoints at `/` (SPEC section 8): `GET /` the metadata (with the measured footprint
//! and hwFetch when asked), `POST /` inference, `GET /healthz`.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::Value;
use vramfork::hwline::wants_hw_fetch;

use super::answer::{json_bytes, Answer};
use super::body_kind::{classify, explained, BodyKind};
use super::pipeline::{model_request, Parsed};
use super::request::{hw_fetch, with_hw};
use crate::app::App;
use crate::args::{Arg, Inputs};
use crate::decode::post::parse_request;
use crate::error::ApiError;
use crate::runner::Encoding;

/// `GET /`: the metadata as given, with the measured footprint beside the declared one
/// (`--profile-memory`) and the hwFetch line when asked.
pub fn metadata(query: Option<&str>, app: &App) -> Result<Answer, ApiError> {
    let hw = hw_fetch(query, app)?;
    let mut doc = app.metadata.raw.clone();
    if let Some(f) = &app.footprint {
        doc.insert(
            "gpu_footprint_mb".into(),
            serde_json::json!({
                "declared": f.declared_mb,
                "measured": f.measured_mb,
                "planned": f.planned_mb,
            }),
        );
    }
    Ok(Answer::ok(with_hw(Value::Object(doc), hw)))
}

/// `GET /healthz`: 200 while this worker takes requests, 503 (try another worker) once it
/// retires.
pub fn health(app: &App) -> Answer {
    if app.shared.get().stopping() {
        Answer::retiring(serde_json::json!({"status": "retiring"}))
    } else {
        Answer::ok(serde_json::json!({"status": "ok"}))
    }
}

/// `POST /`: `{"inputs": …}` in (`decode/post.rs`), `{"outputs": …}` out, through the
/// pipeline every model request takes.
pub async fn infer(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let hw_wanted =
        wants_hw_fetch(req.uri().query()).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let specs = app.metadata.inputs.clone();
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let (out, (), last) = model_request(req, app, move |body| {
        let one = match specs.as_deref() {
            Some([one]) => one.document.as_ref(),
            _ => None,
        };
        let inputs = match classify(content_type.as_deref(), one, &body)? {
            // One document, as it is: pre-processing decodes it.
            BodyKind::Image | BodyKind::Text => Inputs {
                args: vec![Arg::Blobs(vec![body])],
            },
            BodyKind::Json => parse_request(&body, specs.as_deref())
                .map_err(|e| explained(e.into(), content_type.as_deref(), one))?,
        };
        Ok(Parsed {
            inputs,
            encoding: Encoding::Json,
            timeout: None,
            extra: (),
        })
    })
    .await?;
    let out_timing = out.preprocess.map(|p| (p, out.forward));
    let outputs = out.outputs;
    // {"outputs": <written by the runner>[, "hwFetch": "<line>"]}
    let mut body = Vec::with_capacity(outputs.len() + 64);
    body.extend_from_slice(b"{\"outputs\":");
    body.extend_from_slice(&outputs);
    if !app.metadata.labels.is_empty() {
        body.extend_from_slice(b",\"labels\":");
        body.extend_from_slice(&json_bytes(&labelled(app, &outputs)?));
    }
    drop(outputs);
    if hw_wanted {
        if let Some(line) = hw_fetch(Some("hwFetch"), app)? {
            body.extend_from_slice(b",\"hwFetch\":");
            body.extend_from_slice(&json_bytes(&Value::String(line)));
        }
    }
    body.push(b'}');
    let mut answer = Answer::with(StatusCode::OK, body);
    answer.timing = out_timing;
    answer.close = last;
    Ok(answer)
}

/// The best classes of each row of the labelled output (`outputs[i].labels`), best first:
/// `[[[name, score], …], …]`, one list per row. With one labelled output among several,
/// the rows are its rows; with several labelled, an object by output name.
fn labelled(app: &App, outputs: &[u8]) -> Result<Value, ApiError> {
    let internal = |e: String| ApiError::Run(crate::runner::RunError::Unsupported(e));
    let all: Value = serde_json::from_slice(outputs).map_err(|e| {
        internal(format!(
            "the outputs could not be read back for labels: {e}"
        ))
    })?;
    let declared = app.metadata.outputs.as_ref().map_or(1, Vec::len);
    let mut by_output = serde_json::Map::new();
    for (&i, labels) in &app.metadata.labels {
        let out = if declared == 1 { &all } else { &all[i] };
        let rows: Vec<Vec<f64>> = match out {
            Value::Array(items) if items.iter().all(Value::is_number) => {
                vec![items.iter().filter_map(Value::as_f64).collect()]
            }
            Value::Array(items) => items
                .iter()
                .map(|r| {
                    r.as_array()
                        .filter(|r| r.iter().all(Value::is_number))
                        .map(|r| r.iter().filter_map(Value::as_f64).collect())
                })
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    internal("the labelled output is not a list of rows of scores".into())
                })?,
            _ => {
                return Err(internal(
                    "the labelled output is not a tensor of scores".into(),
                ))
            }
        };
        let ranked = rows
            .iter()
            .map(|r| {
                labels.top(r).map(|top| {
                    Value::Array(
                        top.into_iter()
                            .map(|(name, score)| serde_json::json!([name, score]))
                            .collect(),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(internal)?;
        let name = app
            .metadata
            .outputs
            .as_ref()
            .and_then(|o| o.get(i))
            .map_or_else(|| format!("output__{i}"), |o| o.name.clone());
        by_output.insert(name, Value::Array(ranked));
    }
    Ok(match by_output.len() {
        1 => by_output
            .into_iter()
            .next()
            .map(|(_, v)| v)
            .unwrap_or(Value::Null),
        _ => Value::Object(by_output),
    })
}
