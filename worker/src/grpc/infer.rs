//! `ModelInfer`'s messages and the model's description: a request's inputs checked and made
//! into the model's arguments by the checks both v2 doors share (`infer/v2.rs`: [`Slots`],
//! [`check`], [`from_raw`]), whether they come as `raw_input_contents` (one entry per input,
//! in order: little-endian elements, `BYTES` as 4-byte lengths and bytes) or as typed
//! `contents` (converted to the same raw form first); the outputs, the model thread's typed
//! tensors, answered as `raw_output_contents` (as Triton does). Model metadata is made from
//! the model's description (`infer/v2.rs`).

use bytes::{BufMut, Bytes};
use vramfork::metadata::{Datatype, Dtype, TensorSpec};

use super::pb::infer_parameter::ParameterChoice;
use super::pb::model_infer_response::InferOutputTensor;
use super::pb::{self, InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse};
use crate::app::App;
use crate::args::Inputs;
use crate::decode::BodyError;
use crate::error::ApiError;
use crate::infer::v2::{check, from_raw, model_id, model_tensors, Checked, Slots, TensorMeta};
use crate::infer::{classification, Encoding, Parsed, Ranked, RunOutput, Wanted, MAX_TIMEOUT_S};
use vramfork::lanes::{Lane, TRITON_LEVELS};

/// What the answer needs of the request besides the outputs.
pub struct Asked {
    /// The request's `id` (empty: none given).
    pub id: String,
    /// `parameters.hwFetch`.
    pub hw_fetch: bool,
    /// Outputs asked for as their best classes (`parameters.classification`: the count).
    pub classes: Vec<(String, usize)>,
}

/// The model a request names must be this server's (an empty version: its one version).
pub fn check_model(app: &App, name: &str, version: &str) -> Result<(), ApiError> {
    let (model, v) = model_id(app);
    if name != model {
        return Err(ApiError::NoSuchModel(format!(
            "unknown model '{name}': this server serves one model, '{model}' (version {v})"
        )));
    }
    if !version.is_empty() && version != v {
        return Err(ApiError::NoSuchModel(format!(
            "unknown version '{version}' of model '{model}': its only version is '{v}'"
        )));
    }
    Ok(())
}

/// A request made into the model's input, the outputs' encoding (all binary: raw outputs)
/// and what the answer needs, with the lane its `priority` parameter asks for.
pub fn parse(
    req: ModelInferRequest,
    specs: Option<&[TensorSpec]>,
    declared: Option<Vec<TensorSpec>>,
) -> Result<Ranked<Asked>, ApiError> {
    let hw_fetch = flag(&req.parameters, "hwFetch")?;
    let timeout = timeout(&req.parameters)?;
    let lane = priority(&req.parameters)?;
    let inputs = inputs(&req, specs)?;
    let outputs = (!req.outputs.is_empty()).then(|| {
        req.outputs
            .iter()
            .map(|o| o.name.clone())
            .collect::<Vec<_>>()
    });
    let mut classes = Vec::new();
    for o in &req.outputs {
        match o.parameters.get("classification").and_then(|p| p.parameter_choice.as_ref()) {
            None => {}
            Some(ParameterChoice::Int64Param(n)) if *n >= 1 => classes.push((o.name.clone(), *n as usize)),
            Some(ParameterChoice::Uint64Param(n)) if *n >= 1 => classes.push((o.name.clone(), *n as usize)),
            Some(other) => {
                return Err(ApiError::BadRequest(format!(
                    "output {}: parameter classification must be a whole number of classes, 1 or more, not {other:?}",
                    o.name
                )))
            }
        }
    }
    let parsed = Parsed {
        inputs,
        encoding: Encoding::Tensors(Wanted { outputs, declared }),
        timeout,
        extra: Asked {
            id: req.id,
            hw_fetch,
            classes,
        },
    };
    Ok(Ranked { parsed, lane })
}

/// The `priority` parameter (`uint64_param`, as `tritonclient` sends it, or `int64_param`):
/// a level from 1 (the highest) to 3, 0 the default level (`vramfork::lanes`).
fn priority(params: &Params) -> Result<Option<Lane>, ApiError> {
    let level = match params.get("priority").and_then(|p| p.parameter_choice.as_ref()) {
        None => return Ok(None),
        Some(ParameterChoice::Uint64Param(p)) => *p,
        Some(ParameterChoice::Int64Param(p)) if *p >= 0 => *p as u64,
        Some(other) => {
            return Err(ApiError::Body(BodyError::Invalid(format!(
                "parameter priority must be a whole number (uint64_param), a level from 1 (the highest) to {TRITON_LEVELS} or 0 for the default level, not {other:?}"
            ))))
        }
    };
    Lane::of_triton(level)
        .map(Some)
        .map_err(|e| ApiError::Body(BodyError::Invalid(e)))
}

fn flag(params: &Params, key: &str) -> Result<bool, ApiError> {
    match params.get(key).and_then(|p| p.parameter_choice.as_ref()) {
        None => Ok(false),
        Some(ParameterChoice::BoolParam(b)) => Ok(*b),
        Some(other) => Err(ApiError::Body(BodyError::Invalid(format!(
            "parameter {key} must be a bool_param, not {other:?}"
        )))),
    }
}

type Params = std::collections::HashMap<String, InferParameter>;

/// `parameters.timeout`: microseconds (`int64_param`, as `tritonclient` sends it; 0 = none),
/// at most a day, as the REST body's.
fn timeout(params: &Params) -> Result<Option<std::time::Duration>, ApiError> {
    let max_us = (MAX_TIMEOUT_S * 1e6) as u64;
    let us = match params.get("timeout").and_then(|p| p.parameter_choice.as_ref()) {
        None => return Ok(None),
        Some(ParameterChoice::Int64Param(us)) if *us >= 0 => *us as u64,
        Some(ParameterChoice::Uint64Param(us)) => *us,
        Some(other) => {
            return Err(ApiError::Body(BodyError::Invalid(format!(
            "parameter timeout must be a whole number of microseconds (int64_param, 0 = none), not {other:?}"
        ))))
        }
    };
    if us > max_us {
        return Err(ApiError::Body(BodyError::Invalid(format!(
            "parameter timeout must be at most {max_us} microseconds (a day, as X-Request-Timeout), not {us}"
        ))));
    }
    Ok((us > 0).then(|| std::time::Duration::from_micros(us)))
}

/// The inputs in the declared order, from raw or typed contents.
fn inputs(req: &ModelInferRequest, specs: Option<&[TensorSpec]>) -> Result<Inputs, BodyError> {
    let raw = &req.raw_input_contents;
    if !raw.is_empty() && raw.len() != req.inputs.len() {
        return Err(BodyError::Invalid(format!(
            "raw_input_contents has {} entries for {} inputs: one per input, in the order of `inputs`",
            raw.len(),
            req.inputs.len()
        )));
    }
    let mut slots = Slots::new(specs, req.inputs.len())?;
    for (i, input) in req.inputs.iter().enumerate() {
        let name = &input.name;
        let at = slots.place(name)?;
        let c = check(name, &input.datatype, &input.shape, slots.spec(at))?;
        let bytes = match (raw.get(i), &input.contents) {
            (Some(_), Some(_)) => {
                return Err(BodyError::Invalid(format!(
                    "input {name} has both `contents` and raw_input_contents"
                )))
            }
            (None, None) => {
                return Err(BodyError::Invalid(format!(
                    "input {name} has no `contents` and no raw_input_contents"
                )))
            }
            (Some(bytes), None) => bytes.clone(),
            (None, Some(contents)) => typed(name, &c, contents)?,
        };
        if let Some(want) = c.raw_len().filter(|want| bytes.len() != *want) {
            return Err(BodyError::Invalid(format!(
                "input {name}: raw_input_contents holds {} bytes; shape {:?} of {} takes {want}",
                bytes.len(),
                input.shape,
                input.datatype
            )));
        }
        slots.fill(at, from_raw(name, &c, &input.shape, &bytes)?);
    }
    Ok(slots.inputs())
}

/// Typed contents as raw bytes: the field the datatype uses, each value in range for the
/// datatype, as many as the shape takes.
fn typed(name: &str, c: &Checked, t: &InferTensorContents) -> Result<Bytes, BodyError> {
    let mut b = Vec::new();
    let (field, n) = match c.datatype {
        Datatype::Bytes => {
            for s in &t.bytes_contents {
                b.put_u32_le(s.len() as u32);
                b.extend_from_slice(s);
            }
            ("bytes_contents", t.bytes_contents.len())
        }
        Datatype::Tensor(d) => match d {
            Dtype::Bool => {
                b.extend(t.bool_contents.iter().map(|v| u8::from(*v)));
                ("bool_contents", t.bool_contents.len())
            }
            Dtype::Int8 | Dtype::Int16 | Dtype::Int32 => {
                ints(name, d, &t.int_contents, &mut b)?;
                ("int_contents", t.int_contents.len())
            }
            Dtype::UInt8 => {
                for v in &t.uint_contents {
                    b.put_u8(u8::try_from(*v).map_err(|_| out_of_range(name, d, *v))?);
                }
                ("uint_contents", t.uint_contents.len())
            }
            Dtype::Int64 => {
                t.int64_contents.iter().for_each(|v| b.put_i64_le(*v));
                ("int64_contents", t.int64_contents.len())
            }
            Dtype::Float32 => {
                t.fp32_contents.iter().for_each(|v| b.put_f32_le(*v));
                ("fp32_contents", t.fp32_contents.len())
            }
            Dtype::Float64 => {
                t.fp64_contents.iter().for_each(|v| b.put_f64_le(*v));
                ("fp64_contents", t.fp64_contents.len())
            }
            Dtype::Float16 | Dtype::BFloat16 => {
                return Err(BodyError::Invalid(format!(
                    "input {name} is {}: the protocol has no typed contents for it; send it in raw_input_contents",
                    c.datatype
                )))
            }
        },
    };
    if n != c.count {
        return Err(BodyError::Invalid(format!(
            "input {name} ({}) has {n} elements in contents.{field}; its shape takes {}",
            c.datatype, c.count
        )));
    }
    Ok(b.into())
}

fn ints(name: &str, d: Dtype, values: &[i32], b: &mut Vec<u8>) -> Result<(), BodyError> {
    for v in values {
        match d {
            Dtype::Int8 => b.put_i8(i8::try_from(*v).map_err(|_| out_of_range(name, d, *v))?),
            Dtype::Int16 => b.put_i16_le(i16::try_from(*v).map_err(|_| out_of_range(name, d, *v))?),
            _ => b.put_i32_le(*v),
        }
    }
    Ok(())
}

fn out_of_range(name: &str, d: Dtype, v: impl std::fmt::Display) -> BodyError {
    BodyError::Invalid(format!(
        "input {name}: {v} is out of range for {}",
        Datatype::Tensor(d)
    ))
}

/// The answer to a request from the model's typed outputs: each one's data as it is in
/// `raw_output_contents`.
pub fn response(
    app: &App,
    out: RunOutput,
    asked: Asked,
    request_id: &str,
    hw_line: Option<String>,
) -> Result<ModelInferResponse, ApiError> {
    let tensors = out.outputs.tensors().map_err(ApiError::Run)?;
    let tensors = classification::apply(&app.metadata, tensors, &asked.classes)?;
    let mut outputs = Vec::with_capacity(tensors.len());
    let mut raw = Vec::with_capacity(tensors.len());
    for t in tensors {
        raw.push(Bytes::from(t.data));
        outputs.push(InferOutputTensor {
            name: t.name,
            datatype: t.datatype.v2_name().to_string(),
            shape: t.shape,
            ..Default::default()
        });
    }
    let (model_name, model_version) = model_id(app);
    let mut parameters = Params::new();
    if let Some(line) = hw_line {
        parameters.insert(
            "hwFetch".into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam(line)),
            },
        );
    }
    Ok(ModelInferResponse {
        model_name,
        model_version,
        id: if asked.id.is_empty() {
            request_id.to_string()
        } else {
            asked.id
        },
        parameters,
        outputs,
        raw_output_contents: raw,
    })
}

/// `ModelMetadata`'s answer, from the model's description (`infer/v2.rs`).
pub fn model_metadata(app: &App) -> pb::ModelMetadataResponse {
    let listed = |ts: Vec<TensorMeta>| {
        ts.into_iter()
            .map(|t| pb::model_metadata_response::TensorMetadata {
                name: t.name,
                datatype: t.datatype.to_string(),
                shape: t.shape,
            })
            .collect()
    };
    let (inputs, outputs) = model_tensors(app);
    let (name, version) = model_id(app);
    pb::ModelMetadataResponse {
        name,
        versions: vec![version],
        platform: app.platform.to_string(),
        inputs: listed(inputs),
        outputs: listed(outputs),
    }
}
