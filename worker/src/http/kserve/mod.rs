//! KServe's v1 protocol (TensorFlow Serving's, as KServe's `pytorch` runtime speaks it):
//! `POST /v1/models/{name}:predict` with `{"instances": […]}`, answered
//! `{"predictions": […]}`, one prediction per instance. An instance is a row of the model's
//! one input (numbers, nested), an object of its named inputs, or for an image model
//! TorchServe's `{"data": "<base64>"}`; an image classifier's predictions are
//! `{label: probability}` as TorchServe's `image_classifier` writes them, an image
//! segmenter's its `[H][W][class, probability]`, an object detector's its list of
//! `{label: [x1, y1, x2, y2], "score": score}`. `GET
//! /v1/models/{name}` is OpenAI's door's, whose answer carries v1's `name` and `ready` too
//! (`openai/mod.rs`). Refusals are the server's own (`{"error": …}`, v1's shape).

use base64::Engine;
use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{json, Map, Value};
use vramfork::torchserve::{handler, Handler};

use super::answer::{json_bytes, Answer};
use super::request::model_request;
use crate::app::App;
use crate::args::{Arg, Inputs};
use crate::decode::post::parse_request;
use crate::error::ApiError;
use crate::infer::{Done, Encoding, Parsed};

/// The suffix of v1's predict path.
const PREDICT: &str = ":predict";

/// Whether `path` is v1's predict path (`/v1/models/{name}:predict`).
pub fn owns(path: &str) -> bool {
    path.strip_prefix("/v1/models/").is_some_and(|rest| {
        rest.ends_with(PREDICT) && !rest[..rest.len() - PREDICT.len()].contains('/')
    })
}

/// Whether `path` is v1's explain path (`/v1/models/{name}:explain`), which vramfork does
/// not serve.
pub fn explains(path: &str) -> bool {
    path.strip_prefix("/v1/models/")
        .and_then(|rest| rest.strip_suffix(":explain"))
        .is_some_and(|name| !name.contains('/'))
}

/// `POST /v1/models/{name}:predict`.
pub async fn predict(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let path = req.uri().path().to_string();
    let name = &path["/v1/models/".len()..path.len() - PREDICT.len()];
    let archive = app.metadata.archive.as_ref();
    if name != app.model_name && archive.is_none_or(|a| a.model_name != name) {
        return Err(ApiError::NoSuchModel(format!(
            "model '{name}' is not served here; this server serves '{}'",
            app.model_name
        )));
    }
    let specs = app.metadata.inputs.clone();
    let segmenter = archive.is_some_and(|a| a.handler == Handler::ImageSegmenter);
    let detector = archive.is_some_and(|a| a.handler == Handler::ObjectDetector);
    let encoding = match (segmenter, detector) {
        (true, _) => super::torchserve::segmenter_outputs(app),
        (_, true) => super::torchserve::detections::detector_outputs(app),
        _ => Encoding::Json,
    };
    let Done {
        out,
        extra: (),
        last,
    } = model_request(req, app, move |body| {
        Ok(Parsed {
            inputs: instances(&body, specs.as_deref())?,
            encoding,
            timeout: None,
            extra: (),
        })
    })
    .await?;
    if segmenter {
        let images = super::torchserve::segmentations(out)?;
        let mut body = b"{\"predictions\":[".to_vec();
        for (i, image) in images.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(image);
        }
        body.extend_from_slice(b"]}");
        let mut answer = Answer::with(StatusCode::OK, body);
        answer.close = last;
        return Ok(answer);
    }
    if detector {
        let images = super::torchserve::detections::detections(app, out)?;
        let mut answer = Answer::with(StatusCode::OK, json_bytes(&json!({"predictions": images})));
        answer.close = last;
        return Ok(answer);
    }
    let outputs: Value = serde_json::from_slice(&out.outputs.json().map_err(ApiError::Run)?)
        .map_err(|e| ApiError::BadRequest(format!("the outputs could not be read back: {e}")))?;
    let classifier = archive.is_some_and(|a| a.handler == Handler::ImageClassifier);
    let predictions = if classifier {
        classified(app, &outputs)
    } else {
        outputs
    };
    let mut answer = Answer::with(
        StatusCode::OK,
        json_bytes(&json!({"predictions": predictions})),
    );
    answer.close = last;
    Ok(answer)
}

/// `{"instances": […]}` as the model's inputs.
fn instances(
    body: &[u8],
    specs: Option<&[vramfork::metadata::TensorSpec]>,
) -> Result<Inputs, ApiError> {
    let bad = |m: String| ApiError::BadRequest(m);
    let doc: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("request body is not valid JSON: {e}")))?;
    let Some(Value::Array(rows)) = doc.get("instances") else {
        return Err(bad(
            "a v1 predict body is {\"instances\": [...]}, one instance per row".into(),
        ));
    };
    let image = matches!(specs, Some([one]) if one.document.is_some());
    if image {
        let blobs = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let data = r
                    .get("data")
                    .or_else(|| r.get("b64"))
                    .and_then(Value::as_str);
                let data = data.ok_or_else(|| {
                    bad(format!(
                        "instances[{i}] must be {{\"data\": \"<base64 of the document>\"}}"
                    ))
                })?;
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| bad(format!("instances[{i}].data is not base64: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Inputs {
            args: vec![Arg::Blobs(blobs)],
        });
    }
    // Objects of named inputs: each input's rows gathered under its name.
    let inputs = if rows.iter().all(Value::is_object) && !rows.is_empty() {
        let mut by_name: Map<String, Value> = Map::new();
        for r in rows {
            for (k, v) in r.as_object().into_iter().flatten() {
                let column = by_name.entry(k.clone()).or_insert_with(|| json!([]));
                if let Value::Array(c) = column {
                    c.push(v.clone());
                }
            }
        }
        Value::Object(by_name)
    } else {
        Value::Array(rows.clone())
    };
    let text = json_bytes(&json!({"inputs": inputs}));
    parse_request(&text, specs).map_err(ApiError::from)
}

/// An image classifier's rows of scores as TorchServe's `{label: probability}`, per row.
fn classified(app: &App, outputs: &Value) -> Value {
    let rows = outputs.as_array().cloned().unwrap_or_default();
    let labels = app.metadata.labels.get(&0);
    Value::Array(
        rows.iter()
            .map(|r| {
                let row: Vec<f64> = r
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_f64).collect())
                    .unwrap_or_default();
                let by_index = handler::by_index(row.len());
                let top = labels.unwrap_or(&by_index).top(&row).unwrap_or_default();
                Value::Object(top.into_iter().map(|(n, s)| (n, json!(s))).collect())
            })
            .collect(),
    )
}
