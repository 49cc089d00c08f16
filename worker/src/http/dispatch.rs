//! The hyper service: every request routed to its handler (`root.rs` for `/` and
//! `/healthz`, `v2/` for the Open Inference Protocol, `openai/` for `/v1/`: its refusals of
//! token auth in OpenAI's shape too, `torchserve/` for TorchServe's paths, likewise; `kserve/` for v1's predict), every outcome an HTTP answer with
//! `X-Worker-Pid`, `X-Request-Id` and the headers its [`Answer`] asks for; counted for
//! `/metrics` and recorded in the access log when it is on.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response};

use super::answer::{Answer, Body};
use super::request::{endpoint_of, INFERENCE_HEADER};
use super::{kserve, openai, rerank, root, torchserve, v2};
use crate::app::App;
use crate::error::ApiError;
use crate::head::{arrival, key_given, Closer};
use crate::infer::Meta;
use crate::metrics::Endpoint;
use crate::observe::access_log::{Record, Trace};
use crate::observe::trace_context;
use crate::request_id::{self, RequestId};

/// The hyper service: never fails, every outcome is an HTTP answer.
pub async fn handle(
    mut req: Request<Incoming>,
    app: Arc<App>,
) -> Result<Response<Body>, Infallible> {
    let endpoint = match req.uri().path() {
        p if rerank::owns(p) && req.method() == Method::POST => Endpoint::Rerank,
        p if p.starts_with("/predictions/")
            && matches!(*req.method(), Method::POST | Method::PUT) =>
        {
            Endpoint::TorchServe
        }
        p if kserve::owns(p) && req.method() == Method::POST => Endpoint::KServeV1,
        p => endpoint_of(req.method(), p),
    };
    let arrived = arrival(&req);
    // HTTP/2 (prior knowledge, or `h2` under TLS): closing is the connection's GOAWAY, never
    // a `Connection` header.
    let closer = (req.version() == hyper::Version::HTTP_2)
        .then(|| req.extensions().get::<Closer>().cloned())
        .flatten();
    let id = RequestId::of(req.headers());
    req.extensions_mut().insert(id.clone());
    let trace_ctx = app.trace_context(req.headers(), req.uri().path());
    // The record (access log, spans), started before the request is handed on.
    let access = app.records().then(|| {
        let trace = Arc::new(Trace::default());
        let target = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
        (req.method().to_string(), target, trace)
    });
    // What the core needs of a model request that it is not to work out again (its
    // deadline is read from the head by a model route alone: `request::meta_of`).
    req.extensions_mut().insert(Meta {
        arrived,
        endpoint,
        id: id.as_str().into(),
        trace: access.as_ref().map(|(_, _, trace)| trace.clone()),
        deadline: None,
    });
    let answer = match authorized(&req, &app) {
        Ok(()) => route(req, &app).await.unwrap_or_else(Answer::from),
        Err(e) if rerank::owns(req.uri().path()) => rerank::refusal(req.uri().path(), e),
        Err(e) if openai::owns(req.uri().path()) => openai::refusal(e),
        Err(e) if torchserve::owns(req.uri().path()) => torchserve::refusal(e),
        Err(e) => Answer::from(e),
    };
    if let Some((method, target, trace)) = access {
        app.record(Record {
            time: SystemTime::now(),
            request_id: id.as_str().to_string(),
            context: trace_ctx.clone(),
            method,
            target,
            status: answer.status.as_u16(),
            bytes_out: answer.body.len(),
            total: arrived.elapsed(),
            trace: Some(trace),
        });
    }
    if let Some(m) = &app.metrics {
        m.answered(
            endpoint,
            answer.status.as_u16(),
            answer.body.len(),
            arrived.elapsed(),
        );
    }
    Ok(respond(answer, &app, id, &trace_ctx, closer))
}

/// The answer as hyper sends it: its status and body, `X-Worker-Pid`, `X-Request-Id`,
/// `traceparent`, the headers the [`Answer`] asks for, and the connection's close when this
/// worker must close it (GOAWAY on HTTP/2).
fn respond(
    answer: Answer,
    app: &App,
    id: RequestId,
    trace_ctx: &trace_context::TraceContext,
    closer: Option<Closer>,
) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(answer.body)));
    *resp.status_mut() = answer.status;
    let h = resp.headers_mut();
    match answer.header_len {
        None => h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json")),
        Some(n) => {
            h.insert(INFERENCE_HEADER, HeaderValue::from(n));
            h.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )
        }
    };
    h.insert("x-worker-pid", app.pid.clone());
    h.insert(request_id::HEADER.clone(), id.0);
    h.insert(trace_context::HEADER.clone(), trace_ctx.header());
    if let Some(state) = trace_ctx.state() {
        h.insert(trace_context::STATE.clone(), state.clone());
    }
    if let Some(allow) = answer.allow {
        h.insert(ALLOW, HeaderValue::from_static(allow));
    }
    if let Some(c) = answer.challenge {
        h.insert(WWW_AUTHENTICATE, HeaderValue::from_static(c));
    }
    if let Some(t) = answer.timing {
        if let Ok(v) = HeaderValue::from_str(&super::answer::server_timing(t)) {
            h.insert("server-timing", v);
        }
    }
    for (name, value) in answer.headers {
        h.insert(name, value);
    }
    if let Some(s) = answer.retry_after {
        h.insert(RETRY_AFTER, HeaderValue::from(s));
    }
    match closer {
        Some(c) if app.shared.must_close_multiplexed() => c.ask(),
        Some(_) => {}
        None if answer.close || app.shared.must_close() => {
            h.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        None => {}
    }
    resp
}

/// Paths open without a key: the health checks load balancers and probes call.
const OPEN: [&str; 4] = ["/healthz", "/v2/health/live", "/v2/health/ready", "/ping"];

/// Token auth (`--api-key-file`), decided on the request head alone: a refused request's
/// body is never read, and its connection closes.
fn authorized(req: &Request<Incoming>, app: &App) -> Result<(), ApiError> {
    let Some(keys) = &app.api_keys else {
        return Ok(());
    };
    if OPEN.contains(&req.uri().path()) {
        return Ok(());
    }
    key_given(keys, req, app)
}

async fn route(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (path.as_str(), &method) {
        ("/", &Method::GET) => root::metadata(req.uri().query(), app),
        ("/", &Method::POST) => root::infer(req, app).await,
        ("/healthz", &Method::GET) => Ok(root::health(app)),
        // Before `/v2/` and `/v1/`, whose routers would take `/v2/rerank`, `/v1/rerank`
        // and `/v1/classify`.
        (p, _) if rerank::owns(p) => Ok(rerank::route(req, app).await),
        (p, _) if p == "/v2" || p.starts_with("/v2/") => v2::route(req, app).await,
        (p, &Method::POST) if kserve::owns(p) => kserve::predict(req, app).await,
        (p, _) if openai::owns(p) => Ok(openai::route(req, app).await),
        (p, _) if torchserve::owns(p) => Ok(torchserve::route(req, app).await),
        ("/", _) => Err(ApiError::not_allowed(&method, &path, "GET, POST")),
        ("/healthz", _) => Err(ApiError::not_allowed(&method, &path, "GET")),
        // TorchServe's and most servers' habit: metrics on a port of their own here.
        ("/metrics", _) => Err(ApiError::NotFound(format!(
            "{method} {path} (Prometheus metrics are served on --metrics-port)"
        ))),
        _ => Err(ApiError::NotFound(format!("{method} {path}"))),
    }
}
