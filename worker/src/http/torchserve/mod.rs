//! TorchServe's inference API, so that its clients and scripts work unchanged:
//! `POST`/`PUT /predictions/{name}[/{version}]` (the body as TorchServe's handlers take it:
//! an image's bytes, or JSON), `GET /ping` (`{"status": "Healthy"}`) and the management
//! API's read-only `GET /models[/{name}]`. A prediction runs through `POST /`'s path
//! (`root.rs`) and is written as the handler writes it: `image_classifier`'s
//! `{label: probability}` of the top 5, `image_segmenter`'s best class and probability per
//! pixel (`segments.rs`), `object_detector`'s boxes scoring at least 0.5
//! (`detections.rs`), else the outputs. Every refusal is in TorchServe's shape
//! (`error.rs`).

pub mod detections;
mod error;
pub mod segments;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{json, Map, Value};
use vramfork::torchserve::{handler, Archive, Handler};

use self::error::TsError;
use super::answer::{json_bytes, Answer};
use crate::app::App;
use crate::error::ApiError;
use crate::infer::{Done, Encoding, Wanted};

/// Whether `path` is one of TorchServe's.
pub fn owns(path: &str) -> bool {
    path == "/ping"
        || path == "/models"
        || path.starts_with("/models/")
        || path.starts_with("/predictions/")
        || path.starts_with("/explanations/")
}

/// A refusal of the server's own (token auth) on one of TorchServe's paths, in its shape.
pub fn refusal(e: ApiError) -> Answer {
    TsError::from(e).answer()
}

pub async fn route(req: Request<Incoming>, app: &App) -> Answer {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let done = match (path.as_str(), &method) {
        ("/ping", &Method::GET) => Ok(ping(app)),
        ("/ping", _) => Err(ApiError::not_allowed(&method, &path, "GET").into()),
        ("/models", &Method::GET) => Ok(Answer::ok(json!({"models": [summary(app)]}))),
        (p, &Method::GET) if p.starts_with("/models/") => describe(&p["/models/".len()..], app),
        _ if path.starts_with("/models") => {
            Err(TsError::from(ApiError::not_allowed(&method, &path, "GET")).hint(MANAGEMENT))
        }
        (p, _) if p.starts_with("/explanations/") => Err(TsError::new(
            StatusCode::NOT_FOUND,
            "ModelNotFoundException",
            "explanations are not served: TorchServe computes them with Captum in the handler's Python, which vramfork does not run",
        )),
        (p, &Method::POST | &Method::PUT) => predict(&p["/predictions/".len()..], req, app).await,
        _ => Err(ApiError::not_allowed(&method, &path, "POST, PUT").into()),
    };
    done.unwrap_or_else(TsError::answer)
}

/// What the management API's writes do here: it is read-only.
const MANAGEMENT: &str = "the management API is read-only here. One server serves the one model its metadata's `model` names (start another server for another archive: the host's ledger shares the GPU); its workers are set at start (--workers, or the plan) and changed while serving with SIGTTIN and SIGTTOU to the master; SIGTERM stops it";

/// `GET /ping`: TorchServe's health answer; 503 once this worker retires.
fn ping(app: &App) -> Answer {
    if app.shared.get().stopping() {
        Answer::retiring(json!({"status": "Unhealthy"}))
    } else {
        Answer::ok(json!({"status": "Healthy"}))
    }
}

/// The names the served model answers to: the archive's `modelName`, and the server's own
/// (`--model-name`, else the metadata's `name`).
fn answers_to(name: &str, app: &App) -> bool {
    name == app.model_name || archive(app).is_some_and(|a| a.model_name == name)
}

fn archive(app: &App) -> Option<&Archive> {
    app.metadata.archive.as_ref()
}

/// `{name}[/{version}]` checked against the served model.
fn checked<'a>(rest: &'a str, app: &App) -> Result<&'a str, TsError> {
    let (name, version) = match rest.split_once('/') {
        Some((n, v)) => (n, Some(v)),
        None => (rest, None),
    };
    if !answers_to(name, app) {
        return Err(TsError::new(
            StatusCode::NOT_FOUND,
            "ModelNotFoundException",
            format!(
                "Model not found: {name}; this server serves {}",
                app.model_name
            ),
        ));
    }
    let served = archive(app).and_then(|a| a.version.as_deref());
    if let Some(v) = version.filter(|v| !v.is_empty() && Some(*v) != served) {
        return Err(TsError::new(
            StatusCode::NOT_FOUND,
            "ModelVersionNotFoundException",
            format!(
                "Model version: {v} does not exist for model: {name}; it serves version {}",
                served.unwrap_or("(none)")
            ),
        ));
    }
    Ok(name)
}

/// `GET /models`' entry for the served model.
fn summary(app: &App) -> Value {
    let url = archive(app)
        .and_then(|a| a.path.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    json!({"modelName": name_of(app), "modelUrl": url})
}

fn name_of(app: &App) -> &str {
    archive(app).map_or(app.model_name.as_str(), |a| a.model_name.as_str())
}

/// `GET /models/{name}[/{version}]`: the management API's description, read-only.
fn describe(rest: &str, app: &App) -> Result<Answer, TsError> {
    checked(rest, app)?;
    let a = archive(app);
    Ok(Answer::ok(json!([{
        "modelName": name_of(app),
        "modelVersion": a.and_then(|a| a.version.clone()).unwrap_or_default(),
        "modelUrl": summary(app)["modelUrl"],
        "runtime": "libtorch",
        "handler": a.map(|a| a.handler_name.as_str()).unwrap_or_default(),
        "batchSize": app.metadata.max_batch_size.max(1),
        "responseTimeout": app.request_timeout.as_secs(),
        "loadedAtStartup": true,
        "workers": [{"id": app.pid.to_str().unwrap_or_default(), "status": "READY"}],
    }])))
}

/// `POST /predictions/{name}[/{version}]`: `POST /`'s path, answered as the handler would.
async fn predict(rest: &str, req: Request<Incoming>, app: &App) -> Result<Answer, TsError> {
    checked(rest, app)?;
    match archive(app).map(|a| a.handler) {
        Some(Handler::ImageSegmenter) => return segment(req, app).await,
        Some(Handler::ObjectDetector) => return Ok(detections::detect(req, app).await?),
        _ => {}
    }
    let mut answer = super::root::infer(req, app).await?;
    let done: Value = serde_json::from_slice(&answer.body).map_err(|e| {
        TsError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerException",
            format!("the answer could not be read back: {e}"),
        )
    })?;
    answer.body = json_bytes(&handled(app, done));
    Ok(answer)
}

/// The model's segmentation output (`out` of its dict), as every door that post-processes
/// for `image_segmenter` asks for it.
pub fn segmenter_outputs(app: &App) -> Encoding {
    Encoding::Tensors(Wanted {
        outputs: Some(vec![handler::SEGMENTS.into()]),
        declared: app.metadata.outputs.clone(),
    })
}

/// Each image's segmentation (`segments.rs`) from a pass's outputs.
pub fn segmentations(out: crate::infer::RunOutput) -> Result<Vec<Vec<u8>>, ApiError> {
    let tensors = out.outputs.tensors().map_err(ApiError::Run)?;
    let scores = tensors.first().ok_or_else(|| {
        ApiError::Run(crate::infer::RunError::Unsupported(
            "the model returned no `out` output".into(),
        ))
    })?;
    segments::segmented(scores).map_err(|e| ApiError::Run(crate::infer::RunError::Unsupported(e)))
}

/// `image_segmenter`'s prediction: for one image its `[H][W][2]`, for several a list.
async fn segment(req: Request<Incoming>, app: &App) -> Result<Answer, TsError> {
    let Done {
        out,
        extra: (),
        last,
    } = super::root::run(req, app, segmenter_outputs(app)).await?;
    let timing = out.preprocess.map(|p| (p, out.forward));
    let mut images = segmentations(out)?;
    let body = match images.len() {
        1 => images.remove(0),
        _ => {
            let mut all = vec![b'['];
            for (i, image) in images.iter().enumerate() {
                if i > 0 {
                    all.push(b',');
                }
                all.extend_from_slice(image);
            }
            all.push(b']');
            all
        }
    };
    let mut answer = Answer::with(StatusCode::OK, body);
    answer.timing = timing;
    answer.close = last;
    Ok(answer)
}

/// `POST /`'s answer as TorchServe's handler writes it: `image_classifier`'s top classes as
/// `{label: probability}` (one object per image, the object itself for one), else the
/// outputs as they are.
fn handled(app: &App, done: Value) -> Value {
    let classifier = archive(app).is_some_and(|a| a.handler == Handler::ImageClassifier);
    let rows = match (&done["labels"], classifier) {
        (Value::Array(rows), _) => rows.clone(),
        (_, true) => by_index(&done["outputs"]),
        _ => return done["outputs"].clone(),
    };
    let mut objects: Vec<Value> = rows
        .into_iter()
        .map(|row| {
            let pairs = row.as_array().cloned().unwrap_or_default();
            let mut o = Map::new();
            for p in pairs {
                if let (Some(name), Some(score)) = (p[0].as_str(), p.get(1)) {
                    o.insert(name.to_string(), score.clone());
                }
            }
            Value::Object(o)
        })
        .collect();
    match objects.len() {
        1 => objects.remove(0),
        _ => Value::Array(objects),
    }
}

/// `image_classifier` without `index_to_name.json`: each row's top classes named by index.
fn by_index(outputs: &Value) -> Vec<Value> {
    let rows = outputs.as_array().cloned().unwrap_or_default();
    rows.iter()
        .filter_map(|r| {
            let row: Vec<f64> = r.as_array()?.iter().filter_map(Value::as_f64).collect();
            let top = handler::by_index(row.len()).top(&row).ok()?;
            Some(Value::Array(
                top.into_iter().map(|(n, s)| json!([n, s])).collect(),
            ))
        })
        .collect()
}
