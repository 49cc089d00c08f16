//! What the Open Inference Protocol's two doors (v2 REST, `http/v2/`, and gRPC, `grpc/`)
//! share of a request and of the model's description, whatever their wire format: the model's
//! name and version, whether it takes requests, its tensors as metadata lists them, and a
//! request's inputs checked against the declared ones and made into the model's arguments
//! ([`Slots`], [`check`], [`from_raw`]).

use serde_json::Value;
use vramfork::metadata::{Datatype, TensorSpec, SINGLE_INPUT};

use crate::app::App;
use crate::args::{kind_of, tensor_from_bytes, Arg, Inputs};
use crate::decode::elements::{element_count, strings_from_bytes};
use crate::decode::BodyError;

/// The protocol's extensions this server has (`GET /v2`, gRPC's `ServerMetadata`).
pub const EXTENSIONS: [&str; 2] = ["binary_tensor_data", "classification"];

/// The model's name and version, as v2 paths and answers use them (and gRPC's).
pub fn model_id(app: &App) -> (String, String) {
    let version = match app.metadata.raw.get("version") {
        Some(Value::String(v)) => v.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "1".to_string(),
    };
    (app.model_name.clone(), version)
}

/// Whether this worker takes inference requests: not retiring, its model usable.
pub fn is_ready(app: &App) -> bool {
    let c = app.shared.get();
    !(c.stopping() || c.model_unusable)
}

/// A tensor as the model's metadata lists it (v2 REST `GET /v2/models/{m}`, gRPC
/// `ModelMetadata`).
pub struct TensorMeta {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<i64>,
}

/// The model's inputs and outputs as its metadata lists them: the declared ones (a shape left
/// open by the older `input` is `[-1]`), else the one undeclared input `input__0` (FP32 of
/// any shape); undeclared outputs are known only once the model has answered (`output__0…`
/// with the tensors' datatypes): listed empty.
pub fn model_tensors(app: &App) -> (Vec<TensorMeta>, Vec<TensorMeta>) {
    let listed = |spec: &TensorSpec| TensorMeta {
        name: spec.name.clone(),
        datatype: spec.datatype.v2_name(),
        shape: spec.shape.clone().unwrap_or_else(|| vec![-1]),
    };
    let m = &app.metadata;
    let inputs = match &m.inputs {
        Some(specs) => specs.iter().map(listed).collect(),
        None => vec![TensorMeta {
            name: SINGLE_INPUT.to_string(),
            datatype: "FP32",
            shape: vec![-1],
        }],
    };
    let outputs = m.outputs.iter().flatten().map(listed).collect();
    (inputs, outputs)
}

/// The model's inputs as v2 requests must name them: the declared ones, or `input__0`
/// of whatever numeric datatype the request sends when none is declared.
fn names(specs: Option<&[TensorSpec]>) -> String {
    match specs {
        Some(specs) => specs
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        None => SINGLE_INPUT.to_string(),
    }
}

/// The model's arguments, filled in the declared order from a request's inputs given in any
/// order (the REST body's `inputs`, a gRPC request's): each input named once, every declared
/// one given.
pub struct Slots<'s> {
    specs: Option<&'s [TensorSpec]>,
    args: Vec<Option<Arg>>,
}

impl<'s> Slots<'s> {
    /// Slots for `specs` (`None`: the one undeclared input), for a request of `given` inputs.
    pub fn new(specs: Option<&'s [TensorSpec]>, given: usize) -> Result<Slots<'s>, BodyError> {
        let wanted = specs.map_or(1, <[TensorSpec]>::len);
        if given != wanted {
            return Err(BodyError::Invalid(format!(
                "the request has {given} inputs; this model takes {wanted}: {}",
                names(specs)
            )));
        }
        Ok(Slots {
            specs,
            args: (0..wanted).map(|_| None).collect(),
        })
    }

    /// Where the input `name` goes: an unknown one, or one given twice, is refused.
    pub fn place(&self, name: &str) -> Result<usize, BodyError> {
        let at = match self.specs {
            Some(specs) => specs.iter().position(|s| s.name == name),
            None => (name == SINGLE_INPUT).then_some(0),
        }
        .ok_or_else(|| {
            format!(
                "unknown input '{name}'; this model takes {}",
                names(self.specs)
            )
        })?;
        if self.args[at].is_some() {
            return Err(BodyError::Invalid(format!("input {name} is given twice")));
        }
        Ok(at)
    }

    /// The declaration of the input at `at` (`None`: the undeclared single input).
    pub fn spec(&self, at: usize) -> Option<&'s TensorSpec> {
        self.specs.map(|s| &s[at])
    }

    pub fn fill(&mut self, at: usize, arg: Arg) {
        self.args[at] = Some(arg);
    }

    /// The arguments, in the declared order.
    pub fn inputs(self) -> Inputs {
        // Every slot is filled: as many inputs as slots (`new`), none twice (`place`).
        Inputs {
            args: self.args.into_iter().flatten().collect(),
        }
    }
}

/// An input's header checked against its declaration.
pub struct Checked {
    pub datatype: Datatype,
    /// Its elements, from its shape.
    pub count: usize,
    /// A document input's `max_documents`.
    pub max_documents: Option<usize>,
}

impl Checked {
    /// The bytes its raw data must have: `None` for `BYTES` (each element says its length).
    pub fn raw_len(&self) -> Option<usize> {
        match self.datatype {
            Datatype::Tensor(dtype) => Some(self.count * kind_of(dtype).elt_size_in_bytes()),
            Datatype::Bytes => None,
        }
    }
}

/// Checks an input's datatype and shape against its declaration (`None`: the undeclared
/// single input); a document input's count is refused from the shape alone, before its data
/// is read.
pub fn check(
    name: &str,
    datatype: &str,
    shape: &[i64],
    spec: Option<&TensorSpec>,
) -> Result<Checked, BodyError> {
    let v2 = datatype;
    let datatype = Datatype::from_v2(v2).ok_or_else(|| {
        format!(
            "input {name}: unknown datatype '{v2}' ({})",
            Datatype::V2_NAMES
        )
    })?;
    match spec {
        Some(spec) if spec.datatype != datatype => {
            return Err(BodyError::Invalid(format!(
                "input {name} has datatype {datatype}; the model takes {}",
                spec.datatype
            )))
        }
        Some(spec) => spec
            .check_shape(shape)
            .map_err(|e| format!("input {name}: {e}"))?,
        None if datatype == Datatype::Bytes => {
            return Err(BodyError::Invalid(format!(
                "input {name} has datatype BYTES; this model declares no BYTES input (declare it in the metadata's `inputs`)"
            )))
        }
        None => {}
    }
    let count = element_count(name, shape)?;
    let max_documents = spec
        .and_then(|s| s.document.as_ref())
        .map(|d| d.max_documents());
    if let Some(max) = max_documents.filter(|max| count > *max) {
        return Err(BodyError::TooLarge(vramfork::documents::too_many(
            name, count, max,
        )));
    }
    Ok(Checked {
        datatype,
        count,
        max_documents,
    })
}

/// An input from its raw bytes (the size already checked against [`Checked::raw_len`]):
/// little-endian elements, or for `BYTES` each a 4-byte little-endian length and its bytes.
pub fn from_raw(name: &str, c: &Checked, shape: &[i64], bytes: &[u8]) -> Result<Arg, BodyError> {
    Ok(match c.datatype {
        Datatype::Bytes => strings_from_bytes(name, bytes, c.count, c.max_documents.is_some())?,
        Datatype::Tensor(dtype) => tensor_from_bytes(bytes, shape, kind_of(dtype))
            .map(Arg::Tensor)
            .map_err(|e| format!("input {name}: {e}"))?,
    })
}
