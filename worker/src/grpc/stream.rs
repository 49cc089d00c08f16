//! `ModelStreamInfer` (Triton's bidirectional stream of `ModelInferRequest`s): each request
//! runs through the pipeline as a `ModelInfer` would, one after the other, on the worker the
//! stream came to (a stream is never handed to a sibling: its answers keep the requests'
//! order), and each is answered on the stream as a `ModelStreamInferResponse` — an error in
//! its `error_message`, the stream going on, as Triton does. Each request is counted,
//! logged and recorded as a model request of its own (its arrival: when its message was
//! read). The stream ends with status OK when the client ends its side; a message that
//! cannot be read ends it with that error's status. The stream's `grpc-timeout` bounds
//! every request on it.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use hyper::body::{Frame, Incoming};
use hyper::header::HeaderMap;
use hyper::Request;
use tokio::sync::mpsc;

use super::pb::{ModelInferResponse, ModelStreamInferResponse};
use super::wire::{self, Reader};
use super::{decode, infer, ok_trailers, status_headers, Call, Outcome};
use crate::error::ApiError;
use crate::infer::{Admitted, Meta};
use crate::metrics::Endpoint;
use crate::observe::access_log::Trace;

/// Answers held for a client slow to read them before the next request is read.
const AHEAD: usize = 4;

/// Starts serving the stream: its answers come on the returned body as they are made.
pub fn start(req: Request<Incoming>, call: &Call) -> Result<Outcome, ApiError> {
    let deadline = wire::deadline(req.headers(), call.arrived)?;
    let (tx, rx) = mpsc::channel(AHEAD);
    let reader = Reader::new(req.into_body(), call.app.max_body_bytes);
    tokio::spawn(serve(reader, call.clone(), deadline, tx));
    Ok(Outcome::Stream(rx))
}

async fn serve(
    mut reader: Reader,
    call: Call,
    deadline: Option<crate::infer::Deadline>,
    tx: mpsc::Sender<Frame<Bytes>>,
) {
    loop {
        let framed = match reader.next().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                let mut t = HeaderMap::new();
                status_headers(&mut t, &e);
                let _ = tx.send(Frame::trailers(t)).await;
                return;
            }
        };
        let arrived = Instant::now();
        let trace = call
            .app
            .access_log
            .as_ref()
            .map(|_| Arc::new(Trace::default()));
        let meta = Meta {
            arrived,
            endpoint: Endpoint::GrpcInfer,
            id: call.id.as_str().into(),
            trace: trace.clone(),
            deadline,
        };
        let (answer, status) = match one(&call, meta, &framed).await {
            Ok(r) => (
                ModelStreamInferResponse {
                    error_message: String::new(),
                    infer_response: Some(r),
                },
                200,
            ),
            Err(e) => (
                ModelStreamInferResponse {
                    error_message: e.to_string(),
                    infer_response: None,
                },
                e.status().as_u16(),
            ),
        };
        let out = wire::frame(&answer);
        call.record(status, out.len(), arrived, trace, None);
        if tx.send(Frame::data(out)).await.is_err() {
            // The client is gone.
            return;
        }
    }
    let _ = tx.send(Frame::trailers(ok_trailers())).await;
}

/// One request of the stream, run here.
async fn one(call: &Call, meta: Meta, framed: &Bytes) -> Result<ModelInferResponse, ApiError> {
    let app = &call.app;
    let mut admitted = Admitted::admit(app, meta).map_err(|r| r.error)?;
    let request: super::pb::ModelInferRequest = decode(framed, "ModelInferRequest")?;
    infer::check_model(app, &request.model_name, &request.model_version)?;
    admitted.received(framed.len() - 5);
    let (specs, declared) = (app.metadata.inputs.clone(), app.metadata.outputs.clone());
    let parse = move |r| infer::parse(r, specs.as_deref(), declared);
    let done = admitted.run(request, parse).await?;
    call.answered(done)
}
