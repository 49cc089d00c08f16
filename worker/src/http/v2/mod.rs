//! The Open Inference Protocol (KServe v2 REST), beside `POST /` on the same port: server
//! and model metadata, health and readiness, and inference with JSON or binary tensor data.
//! The model is the app: its name is the metadata's `name` (or `--model-name`), its one
//! version the metadata's `version` (else `1`); its inputs and outputs are the metadata's
//! `inputs` and `outputs` when declared, else `input__0` (the older `input`, when
//! declared) and `output__0…` (see `request.rs` and `runner/v2out.rs`). Inference runs
//! through the same core as `POST /` (`infer/`): recycling, timeouts,
//! 503/504/507 and hwFetch behave the same.

pub mod answer;
pub mod request;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{json, Value};
use vramfork::hwline::wants_hw_fetch;

use super::answer::{json_bytes, Answer};
use super::request::{hw_fetch, model_request, request_id_of, INFERENCE_HEADER};
use crate::app::App;
use crate::error::ApiError;
use crate::infer::v2::{is_ready, model_id, model_tensors, TensorMeta, EXTENSIONS};
use crate::infer::{classification, Done, Encoding, Parsed, Ranked};

/// Percent-decodes a path segment (model names may hold spaces and such).
fn decode(seg: &str) -> Result<String, ApiError> {
    let bytes = seg.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = seg
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| ApiError::BadRequest(format!("bad percent-encoding in '{seg}'")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ApiError::BadRequest(format!("'{seg}' is not UTF-8")))
}

/// What a v2 path asks for.
enum Target {
    Server,
    Live,
    Ready,
    Model,
    ModelReady,
    Infer,
}

fn target(path: &str, app: &App) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(2).collect();
    let not_found = || ApiError::NotFound(path.to_string());
    let (model, rest) = match segs.as_slice() {
        [] => return Ok(Target::Server),
        ["health", "live"] => return Ok(Target::Live),
        ["health", "ready"] => return Ok(Target::Ready),
        ["models", name, rest @ ..] => (decode(name)?, rest),
        _ => return Err(not_found()),
    };
    let (name, version) = model_id(app);
    if model != name {
        return Err(ApiError::NoSuchModel(format!(
            "unknown model '{model}': this server serves one model, '{name}' (version {version})"
        )));
    }
    let rest = match rest {
        ["versions", v, rest @ ..] => {
            let v = decode(v)?;
            if v != version {
                return Err(ApiError::NoSuchModel(format!(
                    "unknown version '{v}' of model '{name}': its only version is '{version}'"
                )));
            }
            rest
        }
        rest => rest,
    };
    match rest {
        [] => Ok(Target::Model),
        ["ready"] => Ok(Target::ModelReady),
        ["infer"] => Ok(Target::Infer),
        _ => Err(not_found()),
    }
}

/// Answers a request under `/v2`.
pub async fn route(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let t = target(&path, app)?;
    let (get, post) = (method == Method::GET, method == Method::POST);
    match t {
        Target::Infer if post => infer(req, app).await,
        Target::Infer => Err(ApiError::not_allowed(&method, &path, "POST")),
        _ if !get => Err(ApiError::not_allowed(&method, &path, "GET")),
        Target::Server => Ok(Answer::ok(json!({
            "name": "vramfork",
            "version": env!("CARGO_PKG_VERSION"),
            "extensions": EXTENSIONS,
        }))),
        Target::Live => Ok(Answer::ok(json!({"live": true}))),
        Target::Ready | Target::ModelReady => Ok(ready(app)),
        Target::Model => Ok(Answer::ok(model_metadata(app))),
    }
}

fn ready(app: &App) -> Answer {
    if !is_ready(app) {
        Answer::retiring(json!({"ready": false, "error": "this worker is retiring"}))
    } else {
        Answer::ok(json!({"ready": true}))
    }
}

/// The model's metadata, as `GET /v2/models/{name}` answers it.
fn model_metadata(app: &App) -> Value {
    let (name, version) = model_id(app);
    let (inputs, outputs) = model_tensors(app);
    let listed = |ts: Vec<TensorMeta>| -> Vec<Value> {
        ts.into_iter()
            .map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape}))
            .collect()
    };
    json!({
        "name": name,
        "versions": [version],
        "platform": app.platform,
        "inputs": listed(inputs),
        "outputs": listed(outputs),
    })
}

async fn infer(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let query_hw =
        wants_hw_fetch(req.uri().query()).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let header_len = match req.headers().get(INFERENCE_HEADER) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "Inference-Header-Content-Length must be a byte count, not {v:?}"
                    ))
                })?,
        ),
    };
    let specs = app.metadata.inputs.clone();
    let declared = app.metadata.outputs.clone();
    // The answer's `id`: the body's, else the request's X-Request-Id.
    let request_id = request_id_of(&req);
    let Done {
        out,
        extra: (id, hw, binary, classes),
        last,
    } = model_request(req, app, move |body| {
        let mut r = request::parse(&body, header_len, specs.as_deref())?;
        r.wanted.declared = declared;
        let parsed = Parsed {
            inputs: r.inputs,
            encoding: Encoding::Tensors(r.wanted),
            timeout: r.timeout,
            extra: (r.id, r.hw_fetch, r.binary, r.classes),
        };
        Ok(Ranked {
            parsed,
            lane: r.priority,
        })
    })
    .await?;
    let out_timing = out.preprocess.map(|p| (p, out.forward));
    let (name, version) = model_id(app);
    let mut head = serde_json::Map::new();
    head.insert("model_name".into(), Value::String(name));
    head.insert("model_version".into(), Value::String(version));
    head.insert("id".into(), Value::String(id.unwrap_or(request_id)));
    if query_hw || hw {
        if let Some(line) = hw_fetch(Some("hwFetch"), app)? {
            head.insert("parameters".into(), json!({ "hwFetch": line }));
        }
    }
    // {…, "outputs": [...]}, then the binary tail when any output goes binary.
    let outputs = out.outputs.tensors().map_err(ApiError::Run)?;
    let outputs = classification::apply(&app.metadata, outputs, &classes)?;
    let mut body = json_bytes(&Value::Object(head));
    body.pop();
    body.extend_from_slice(b",\"outputs\":");
    let any_binary = answer::write_outputs(&outputs, &binary, &mut body);
    body.push(b'}');
    let header_len = any_binary.then_some(body.len());
    if any_binary {
        answer::write_tail(&outputs, &binary, &mut body);
    }
    drop(outputs);
    let mut answer = Answer::with(StatusCode::OK, body);
    answer.timing = out_timing;
    answer.header_len = header_len;
    answer.close = last;
    Ok(answer)
}
