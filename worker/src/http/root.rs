//! The endpoints at `/`: `GET /` the metadata (with the measured footprint
//! and hwFetch when asked), `POST /` inference, `GET /healthz`.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::Value;
use vramfork::hwline::wants_hw_fetch;
use vramfork::metadata::TensorSpec;

use super::answer::{json_bytes, Answer};
use super::body_kind::{classify, explained, BodyKind};
use super::request::{hw_fetch, model_request, with_hw};
use crate::app::App;
use crate::args::{Arg, Inputs};
use crate::decode::post::parse_request;
use crate::error::ApiError;
use crate::infer::{Done, Encoding, Parsed};

/// `GET /`: the metadata as given, with the measured footprint beside the declared one
/// (`--profile-memory`) and the hwFetch line when asked; and `"status": "alive"`, the
/// answer KServe v1's liveness check (`is_server_live`) reads at `/`, unless the metadata
/// has a `status` of its own.
pub fn metadata(query: Option<&str>, app: &App) -> Result<Answer, ApiError> {
    let hw = hw_fetch(query, app)?;
    let mut doc = app.metadata.raw.clone();
    doc.entry("status").or_insert_with(|| Value::from("alive"));
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
/// core every model request takes (`infer/`).
pub async fn infer(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let hw_wanted =
        wants_hw_fetch(req.uri().query()).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let Done {
        out,
        extra: (),
        last,
    } = run(req, app, Encoding::Json).await?;
    let out_timing = out.preprocess.map(|p| (p, out.forward));
    let outputs = out.outputs.json().map_err(ApiError::Run)?;
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

/// `POST /`'s request (a document as it is, or `{"inputs": …}`) through the core, its outputs
/// made as `encoding` asks: what TorchServe's `/predictions` runs too.
pub async fn run(
    req: Request<Incoming>,
    app: &App,
    encoding: Encoding,
) -> Result<Done<()>, ApiError> {
    let specs = app.metadata.inputs.clone();
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    model_request(req, app, move |body| {
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
            encoding,
            timeout: None,
            extra: (),
        })
    })
    .await
}

/// Output `i` of the model's outputs as `POST /` writes them (`all`), `declared` being the
/// metadata's `outputs`. With several declared, the model returns a tuple or list: its `i`-th
/// item. With one, the model returns that output, or a tuple or list of it alone — what a
/// transformers model traced with `torchscript=True` returns, `(logits,)` — written as a
/// one-element array one level deeper than the declared shape: that element (as v2 names
/// the tuple's item `outputs[0].name`).
fn output_of<'a>(all: &'a Value, i: usize, declared: &[TensorSpec]) -> &'a Value {
    if declared.len() > 1 {
        return &all[i];
    }
    fn depth(v: &Value) -> usize {
        match v {
            Value::Array(items) => 1 + items.first().map_or(0, depth),
            _ => 0,
        }
    }
    // The labelled output has rows of scores (two levels) unless declared otherwise.
    let rank = declared
        .first()
        .and_then(|d| d.shape.as_ref())
        .map_or(2, Vec::len);
    match all {
        Value::Array(items) if items.len() == 1 && depth(all) == rank + 1 => &items[0],
        _ => all,
    }
}

/// The best classes of each row of the labelled output (`outputs[i].labels`), best first:
/// `[[[name, score], …], …]`, one list per row. With one labelled output among several,
/// the rows are its rows; with several labelled, an object by output name.
fn labelled(app: &App, outputs: &[u8]) -> Result<Value, ApiError> {
    let internal = |e: String| ApiError::Run(crate::infer::RunError::Unsupported(e));
    let all: Value = serde_json::from_slice(outputs).map_err(|e| {
        internal(format!(
            "the outputs could not be read back for labels: {e}"
        ))
    })?;
    let declared = app.metadata.outputs.as_deref().unwrap_or_default();
    let mut by_output = serde_json::Map::new();
    for (&i, labels) in &app.metadata.labels {
        let out = output_of(&all, i, declared);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use vramfork::metadata::{Datatype, Dtype};

    fn spec(name: &str, shape: &[i64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            datatype: Datatype::Tensor(Dtype::Float32),
            shape: Some(shape.to_vec()),
            document: None,
        }
    }

    #[test]
    fn a_labelled_output_is_found_alone_in_a_tuple_or_among_several() {
        let rows = json!([[0.1, 0.9], [0.7, 0.3]]);
        let one = [spec("logits", &[-1, 2])];
        // The tensor itself, or a tuple of it alone (`(logits,)`).
        assert_eq!(output_of(&rows, 0, &one), &rows);
        assert_eq!(output_of(&json!([rows.clone()]), 0, &one), &rows);
        // One row is not mistaken for a tuple.
        let row = json!([[0.1, 0.9]]);
        assert_eq!(output_of(&row, 0, &one), &row);
        // With several outputs, the i-th.
        let two = [spec("logits", &[-1, 2]), spec("pooled", &[-1, 4])];
        let both = json!([rows.clone(), [[1, 2, 3, 4], [5, 6, 7, 8]]]);
        assert_eq!(output_of(&both, 0, &two), &rows);
        // Nothing declared: the outputs as they are.
        assert_eq!(output_of(&rows, 0, &[]), &rows);
    }
}
