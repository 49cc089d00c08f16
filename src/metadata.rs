//! The app metadata file (SPEC section 3): parsing, validation with errors that name the
//! file, the field, and (for syntax errors) the line and column. The parsed JSON is kept
//! whole, unknown fields included, because `GET /` returns it as it was written.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::near_miss;
pub use crate::schema::{kind, Dtype};

/// A tensor's element type as the Open Inference Protocol names it: a numeric or boolean
/// dtype, or `BYTES` (strings: a TorchScript `List[str]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datatype {
    Tensor(Dtype),
    Bytes,
}

impl Datatype {
    /// Every v2 name, for error messages.
    pub const V2_NAMES: &'static str =
        "BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES";

    pub fn from_v2(name: &str) -> Option<Datatype> {
        Some(Datatype::Tensor(match name {
            "FP32" => Dtype::Float32,
            "FP64" => Dtype::Float64,
            "FP16" => Dtype::Float16,
            "BF16" => Dtype::BFloat16,
            "INT64" => Dtype::Int64,
            "INT32" => Dtype::Int32,
            "INT16" => Dtype::Int16,
            "INT8" => Dtype::Int8,
            "UINT8" => Dtype::UInt8,
            "BOOL" => Dtype::Bool,
            "BYTES" => return Some(Datatype::Bytes),
            _ => return None,
        }))
    }

    pub fn v2_name(self) -> &'static str {
        match self {
            Datatype::Tensor(d) => d.v2_name(),
            Datatype::Bytes => "BYTES",
        }
    }
}

impl fmt::Display for Datatype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.v2_name())
    }
}

/// One named input or output of the model's signature (`inputs` / `outputs` in the
/// metadata; the older single `input` is the input `input__0`).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: Datatype,
    /// `-1` accepts any size in that dimension. `None` (only from the older `input` without
    /// a shape): any shape.
    pub shape: Option<Vec<i64>>,
    /// A `BYTES` input's declared pre-processing (`tokenizer` or `image`): what the worker
    /// turns its documents into before `forward` (`documents.rs`).
    pub document: Option<crate::documents::Document>,
}

impl TensorSpec {
    /// The dtype and shape check `POST /` uses for a numeric input.
    pub fn input_spec(&self) -> Option<InputSpec> {
        match self.datatype {
            Datatype::Tensor(dtype) => Some(InputSpec {
                shape: self.shape.clone(),
                dtype,
            }),
            Datatype::Bytes => None,
        }
    }

    /// Checks a request's shape against this spec.
    pub fn check_shape(&self, got: &[i64]) -> Result<(), String> {
        check_shape(self.shape.as_deref(), got)
    }
}

/// The name the single input of a model without declared `inputs` has (Triton's
/// PyTorch-backend naming, as are `output__0…` for undeclared outputs).
pub const SINGLE_INPUT: &str = "input__0";

/// The optional `input` field: what a request's `inputs` must look like.
#[derive(Debug, Clone, PartialEq)]
pub struct InputSpec {
    /// Expected shape; `-1` accepts any size in that dimension. `None`: any shape.
    pub shape: Option<Vec<i64>>,
    pub dtype: Dtype,
}

impl InputSpec {
    /// Checks a request's shape; the error says what was expected.
    pub fn check_shape(&self, got: &[i64]) -> Result<(), String> {
        check_shape(self.shape.as_deref(), got)
    }
}

/// Checks a request's shape against the expected one; the error says what was expected.
fn check_shape(want: Option<&[i64]>, got: &[i64]) -> Result<(), String> {
    let Some(want) = want else {
        return Ok(());
    };
    let fits = want.len() == got.len() && want.iter().zip(got).all(|(w, g)| *w == -1 || w == g);
    if fits {
        Ok(())
    } else {
        Err(format!(
            "inputs have shape {got:?}, the model expects {want:?} (-1 = any size)"
        ))
    }
}

/// Parsed and validated app metadata.
#[derive(Debug, Clone)]
pub struct AppMetadata {
    /// The file it came from.
    pub path: PathBuf,
    /// The whole document as written (unknown fields kept), served by `GET /`.
    pub raw: Map<String, Value>,
    pub name: String,
    /// The TorchScript file, resolved against the metadata file's folder.
    pub model: Option<PathBuf>,
    /// Shared libraries of TorchScript operators (`op_libraries`) the worker loads, in
    /// order, before the model (torchvision's ops, a user's own), resolved like `model`.
    pub op_libraries: Vec<PathBuf>,
    /// MB the model needs at least on a GPU; 0 = no minimum.
    pub est_gpu_mem_min: u64,
    /// MB one worker typically uses on a GPU; sizes the pool; 0 = the app uses no GPU.
    pub est_gpu_mem_typ: u64,
    /// The model's inputs, in `forward`'s argument order: the declared `inputs`, or the
    /// older `input` as one input named `input__0`; `None` when neither is declared (one
    /// input of any shape: float32 on `POST /`, the request's datatype on v2).
    pub inputs: Option<Vec<TensorSpec>>,
    /// The declared `outputs`, in the order the model returns them; `None`: named
    /// `output__0…`, datatypes from the tensors.
    pub outputs: Option<Vec<TensorSpec>>,
    /// Rows a worker may stack into one forward pass (`max_batch_size`); 0 = no batching.
    pub max_batch_size: u32,
    /// The input to profile a worker's memory with (`profile_input`): a shape per declared
    /// input, by name; inputs not named take their declared shape with `-1` as 1.
    pub profile_input: Option<BTreeMap<String, Vec<i64>>>,
    /// The input shapes the warm-up passes use (`warmup_inputs`), by input name, in the
    /// same form as `profile_input`; inputs not named take their declared shape, `-1` as 1.
    pub warmup_inputs: Option<BTreeMap<String, Vec<i64>>>,
    /// Class names of classification outputs (`outputs[i].labels`), by output index.
    pub labels: BTreeMap<usize, crate::labels::Labels>,
}

/// The largest `max_batch_size` (metadata or `--max-batch-size`) accepted.
pub const MAX_BATCH_SIZE_LIMIT: u32 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("cannot read app metadata {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("app metadata {path} is not valid JSON: {msg} at line {line}, column {column}")]
    Syntax {
        path: PathBuf,
        msg: String,
        line: usize,
        column: usize,
    },
    #[error("app metadata {path}: {msg}")]
    Field { path: PathBuf, msg: String },
}

impl AppMetadata {
    /// Reads and validates a metadata file.
    pub fn load(path: &Path) -> Result<AppMetadata, MetadataError> {
        // A regular file of at most 64 MiB (`crate::files`): the master reads it again on a
        // HUP, in its loop, where a FIFO must not make it wait.
        let bytes =
            crate::files::read_regular(path, 64 << 20).map_err(|source| MetadataError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let text = String::from_utf8(bytes).map_err(|_| MetadataError::Read {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
        })?;
        Self::parse(path, &text)
    }

    /// Validates metadata text; `path` names it in errors and anchors the model path.
    pub fn parse(path: &Path, text: &str) -> Result<AppMetadata, MetadataError> {
        let value: Value = serde_json::from_str(text).map_err(|e| MetadataError::Syntax {
            path: path.to_path_buf(),
            msg: strip_position(&e.to_string()),
            line: e.line(),
            column: e.column(),
        })?;
        let field = |msg: String| MetadataError::Field {
            path: path.to_path_buf(),
            msg,
        };
        let Value::Object(raw) = value else {
            return Err(field(format!(
                "the top level must be a JSON object, found {}",
                kind(&value)
            )));
        };

        let name = match raw.get("name") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(Value::String(_)) => return Err(field("field `name` must not be empty".into())),
            Some(v) => {
                return Err(field(format!(
                    "field `name` must be a string, found {}",
                    kind(v)
                )))
            }
            None => return Err(field("required field `name` is missing".into())),
        };
        near_miss::check("", &raw, &KNOWN_FIELDS, &FOREIGN_FIELDS).map_err(field)?;
        for key in ["description", "version"] {
            if let Some(v) = raw.get(key) {
                if !v.is_string() {
                    return Err(field(format!(
                        "field `{key}` must be a string, found {}",
                        kind(v)
                    )));
                }
            }
        }
        let model = match raw.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() => {
                let base = path.parent().unwrap_or(Path::new("."));
                Some(base.join(s))
            }
            Some(v) => {
                return Err(field(format!(
                    "field `model` must be a non-empty string (a path relative to the metadata file), found {}",
                    kind(v)
                )))
            }
        };
        let op_libraries = match raw.get("op_libraries") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => {
                let base = path.parent().unwrap_or(Path::new("."));
                let mut libs = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) if !s.is_empty() => libs.push(base.join(s)),
                        v => {
                            return Err(field(format!(
                                "field `op_libraries[{i}]` must be a non-empty string (the path of a shared library, relative to the metadata file), found {}",
                                kind(v)
                            )))
                        }
                    }
                }
                libs
            }
            Some(v) => {
                return Err(field(format!(
                    "field `op_libraries` must be a list of paths of shared libraries of TorchScript operators, found {}",
                    kind(v)
                )))
            }
        };
        let mb = |key: &str| -> Result<u64, MetadataError> {
            match raw.get(key) {
                None | Some(Value::Null) => Ok(0),
                Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
                    field(format!(
                        "field `{key}` must be a whole number of MB ≥ 0, found {n}"
                    ))
                }),
                Some(v) => Err(field(format!(
                    "field `{key}` must be a whole number of MB ≥ 0, found {}",
                    kind(v)
                ))),
            }
        };
        let est_gpu_mem_min = mb("est_gpu_mem_min")?;
        let est_gpu_mem_typ = mb("est_gpu_mem_typ")?;
        if est_gpu_mem_typ < est_gpu_mem_min {
            return Err(field(format!(
                "field `est_gpu_mem_typ` ({est_gpu_mem_typ} MB) must be at least `est_gpu_mem_min` ({est_gpu_mem_min} MB)"
            )));
        }
        let input = match raw.get("input") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_input(v).map_err(field)?),
        };
        let declared = |key: &str| match raw.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => parse_signature(key, v).map(Some).map_err(field),
        };
        let inputs = match (input, declared("inputs")?) {
            (Some(_), Some(_)) => {
                return Err(field(
                    "declare either `input` (one input) or `inputs` (named inputs), not both"
                        .into(),
                ))
            }
            (Some(spec), None) => Some(vec![TensorSpec {
                name: SINGLE_INPUT.into(),
                datatype: Datatype::Tensor(spec.dtype),
                shape: spec.shape,
                document: None,
            }]),
            (None, inputs) => inputs,
        };
        let mut inputs = inputs;
        documents(&raw, inputs.as_deref_mut(), path).map_err(field)?;
        let outputs = declared("outputs")?;
        let labels = labels(&raw, outputs.as_deref(), path).map_err(field)?;
        let max_batch_size = match raw.get("max_batch_size") {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => n
                .as_u64()
                .filter(|n| *n <= u64::from(MAX_BATCH_SIZE_LIMIT))
                .ok_or_else(|| {
                    field(format!(
                        "field `max_batch_size` must be a whole number 0..={MAX_BATCH_SIZE_LIMIT} (0 = no batching), found {n}"
                    ))
                })? as u32,
            Some(v) => {
                return Err(field(format!(
                    "field `max_batch_size` must be a whole number 0..={MAX_BATCH_SIZE_LIMIT} (0 = no batching), found {}",
                    kind(v)
                )))
            }
        };
        if let Some(spec) = unbatchable_input(inputs.as_deref(), max_batch_size) {
            return Err(field(spec));
        }
        let profile_input = match raw.get("profile_input") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_shapes("profile_input", v, inputs.as_deref()).map_err(field)?),
        };
        let warmup_inputs = match raw.get("warmup_inputs") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_shapes("warmup_inputs", v, inputs.as_deref()).map_err(field)?),
        };
        Ok(AppMetadata {
            path: path.to_path_buf(),
            raw,
            name,
            model,
            op_libraries,
            est_gpu_mem_min,
            est_gpu_mem_typ,
            inputs,
            outputs,
            max_batch_size,
            profile_input,
            warmup_inputs,
            labels,
        })
    }

    /// The input shapes of the warm-up passes, one set (a shape per declared input, in
    /// order) per shape the worker will run at: with batching (`max_batch_size` > 1), the
    /// full batch first (`max_batch_size` rows in the leading dimension of every input that
    /// declares it `-1` or declares no shape), then the one-request shape —
    /// `warmup_inputs`' where given, else the declared shape with `-1` as 1. `None` when an
    /// input has neither a declared shape nor a `warmup_inputs` one.
    pub fn warmup_shapes(&self, max_batch_size: u32) -> Option<Vec<Vec<Vec<i64>>>> {
        let specs = self.inputs.as_ref()?;
        let one: Vec<Vec<i64>> = specs
            .iter()
            .map(|s| {
                if let Some(w) = self.warmup_inputs.as_ref().and_then(|w| w.get(&s.name)) {
                    return Some(w.clone());
                }
                Some(
                    s.shape
                        .as_ref()?
                        .iter()
                        .map(|d| if *d < 0 { 1 } else { *d })
                        .collect(),
                )
            })
            .collect::<Option<_>>()?;
        let batched: Vec<Vec<i64>> = specs
            .iter()
            .zip(&one)
            .map(|(s, shape)| {
                let mut shape = shape.clone();
                let open = s.shape.as_ref().is_none_or(|d| d.first() == Some(&-1));
                if max_batch_size > 1 && open && !shape.is_empty() {
                    shape[0] = i64::from(max_batch_size);
                }
                shape
            })
            .collect();
        Some(if batched == one {
            vec![one]
        } else {
            vec![batched, one]
        })
    }

    /// The shapes a profiling pass uses, one per declared input in order: `profile_input`'s
    /// where given, else the declared shape with a leading `-1` as `batch` (the rows a
    /// batching worker stacks: `max_batch_size`, 1 without batching) and other `-1` as 1.
    /// `None` when an input has no declared shape (nothing to build a pass from).
    pub fn profile_shapes(&self, batch: u32) -> Option<Vec<Vec<i64>>> {
        let specs = self.inputs.as_ref()?;
        specs
            .iter()
            .map(|s| {
                if let Some(p) = self.profile_input.as_ref().and_then(|p| p.get(&s.name)) {
                    return Some(p.clone());
                }
                let shape = s.shape.as_ref()?;
                Some(
                    shape
                        .iter()
                        .enumerate()
                        .map(|(i, d)| match (i, *d < 0) {
                            (0, true) => i64::from(batch.max(1)),
                            (_, true) => 1,
                            _ => *d,
                        })
                        .collect(),
                )
            })
            .collect()
    }

    /// Likely mistakes that do not stop the start, for warnings (the plan's): `mean` or
    /// `std` of an `image` block in 0–255 units.
    pub fn warnings(&self) -> Vec<String> {
        let inputs = self.inputs.as_deref().unwrap_or_default();
        inputs
            .iter()
            .enumerate()
            .flat_map(|(i, spec)| match &spec.document {
                Some(crate::documents::Document::Image(image)) => {
                    image.unit_warnings(&format!("inputs[{i}].image"))
                }
                _ => Vec::new(),
            })
            .collect()
    }

    /// The document as JSON text, as handed to workers.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.raw).expect("a JSON map always serializes")
    }
}

/// With batching on (`max_batch_size` > 0), a declared input must have a leading batch
/// dimension: a scalar (`shape: []`) cannot be stacked. The message when one has none.
pub fn unbatchable_input(inputs: Option<&[TensorSpec]>, max_batch_size: u32) -> Option<String> {
    if max_batch_size == 0 {
        return None;
    }
    let spec = inputs?
        .iter()
        .find(|s| s.shape.as_ref().is_some_and(Vec::is_empty))?;
    Some(format!(
        "batching (max_batch_size {max_batch_size}) needs a leading batch dimension on every input, but input `{}` is declared with shape [] (a scalar)",
        spec.name
    ))
}

/// The `tokenizer` and `image` blocks of the declared `inputs` (none on `outputs`), with the
/// shape a document input has: `[-1]`, one document per row.
fn documents(
    raw: &Map<String, Value>,
    inputs: Option<&mut [TensorSpec]>,
    path: &Path,
) -> Result<(), String> {
    let base = path.parent().unwrap_or(Path::new("."));
    if let (Some(Value::Array(items)), Some(specs)) = (raw.get("inputs"), inputs) {
        for (i, (item, spec)) in items.iter().zip(specs.iter_mut()).enumerate() {
            let Value::Object(o) = item else { continue };
            let at = format!("inputs[{i}]");
            spec.document =
                crate::documents::parse(&at, o, spec.datatype == Datatype::Bytes, base)?;
            if spec.document.is_some() && spec.shape.as_ref().is_some_and(|s| s.len() != 1) {
                return Err(format!(
                    "field `{at}.shape`: a document input has one dimension, the documents ([-1])"
                ));
            }
        }
    }
    if let Some(Value::Array(items)) = raw.get("outputs") {
        for (i, item) in items.iter().enumerate() {
            for block in ["tokenizer", "image"] {
                if item.get(block).is_some() {
                    return Err(format!(
                        "field `outputs[{i}].{block}`: pre-processing applies to inputs only"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The `labels` blocks of the declared `outputs`, by output index.
fn labels(
    raw: &Map<String, Value>,
    outputs: Option<&[TensorSpec]>,
    path: &Path,
) -> Result<BTreeMap<usize, crate::labels::Labels>, String> {
    let base = path.parent().unwrap_or(Path::new("."));
    let mut out = BTreeMap::new();
    if let (Some(Value::Array(items)), Some(specs)) = (raw.get("outputs"), outputs) {
        for (i, (item, spec)) in items.iter().zip(specs).enumerate() {
            let Value::Object(o) = item else { continue };
            let classes = spec.shape.as_ref().and_then(|s| s.last().copied());
            if let Some(l) = crate::labels::parse(&format!("outputs[{i}]"), o, base, classes)? {
                out.insert(i, l);
            }
        }
    }
    Ok(out)
}

/// `profile_input` or `warmup_inputs` (`key`): one shape (a model with one declared input)
/// or an object of shapes by input name; each must fit its input's declared shape with every
/// size ≥ 1.
fn parse_shapes(
    key: &str,
    v: &Value,
    inputs: Option<&[TensorSpec]>,
) -> Result<BTreeMap<String, Vec<i64>>, String> {
    let Some(specs) = inputs else {
        return Err(format!(
            "field `{key}` needs the model's inputs declared (`input` or `inputs`)"
        ));
    };
    let given: Vec<(String, &Value)> = match v {
        Value::Array(_) => match specs {
            [one] => vec![(one.name.clone(), v)],
            _ => {
                return Err(format!(
                    "field `{key}`: the model has {} inputs; give an object of shapes by input name",
                    specs.len()
                ))
            }
        },
        Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
        other => {
            return Err(format!(
                "field `{key}` must be a shape (an array of sizes) or an object of shapes by input name, found {}",
                kind(other)
            ))
        }
    };
    let mut out = BTreeMap::new();
    for (name, shape) in given {
        let Some(spec) = specs.iter().find(|s| s.name == name) else {
            return Err(format!(
                "field `{key}`: the model has no input named '{name}'"
            ));
        };
        let field = format!("{key}.{name}");
        let Value::Array(dims) = shape else {
            return Err(format!(
                "field `{field}` must be an array of sizes ≥ 1, found {}",
                kind(shape)
            ));
        };
        let shape = dims
            .iter()
            .enumerate()
            .map(|(i, d)| match d.as_i64() {
                Some(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "field `{field}[{i}]` must be a size ≥ 1, found {d}"
                )),
            })
            .collect::<Result<Vec<i64>, String>>()?;
        if let Some(declared) = &spec.shape {
            let fits = declared.len() == shape.len()
                && declared.iter().zip(&shape).all(|(w, g)| *w == -1 || w == g);
            if !fits {
                return Err(format!(
                    "`{field}` is {shape:?}, which input '{name}' (shape {declared:?}, -1 = any size) does not accept"
                ));
            }
        }
        out.insert(name, shape);
    }
    Ok(out)
}

/// The fields vramfork reads from the metadata.
const KNOWN_FIELDS: [&str; 13] = [
    "name",
    "description",
    "version",
    "model",
    "op_libraries",
    "est_gpu_mem_min",
    "est_gpu_mem_typ",
    "input",
    "inputs",
    "outputs",
    "max_batch_size",
    "profile_input",
    "warmup_inputs",
];
/// Fields other apps' metadata carries on purpose that are close to one vramfork reads
/// (CLAMS app metadata's `output`, its versions and licences).
const FOREIGN_FIELDS: [&str; 9] = [
    "output",
    "app_version",
    "mmif_version",
    "analyzer_version",
    "app_license",
    "analyzer_license",
    "identifier",
    "parameters",
    "dependencies",
];

fn parse_input(v: &Value) -> Result<InputSpec, String> {
    let Value::Object(o) = v else {
        return Err(format!(
            "field `input` must be an object with `shape` and `dtype`, found {}",
            kind(v)
        ));
    };
    // Both keys are optional, so a misspelt one would silently mean "any shape, float32";
    // other keys (a description…) are kept as written.
    near_miss::check("input", o, &["shape", "dtype"], &[])?;
    let shape = match o.get("shape") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_shape("input.shape", v)?),
    };
    let dtype = match o.get("dtype") {
        None | Some(Value::Null) => Dtype::Float32,
        Some(Value::String(s)) => Dtype::parse(s).ok_or_else(|| {
            format!(
                "field `input.dtype` is \"{s}\"; accepted: {}",
                Dtype::NAMES.join(", ")
            )
        })?,
        Some(other) => {
            return Err(format!(
                "field `input.dtype` must be a string, found {}",
                kind(other)
            ))
        }
    };
    Ok(InputSpec { shape, dtype })
}

/// The fields vramfork reads in an entry of `inputs` or `outputs` (`key`).
fn entry_fields(key: &str) -> &'static [&'static str] {
    match key {
        "inputs" => &["name", "datatype", "shape", "tokenizer", "image"],
        _ => &["name", "datatype", "shape", "labels"],
    }
}

/// `inputs` or `outputs`: a non-empty array of `{name, datatype, shape}` with unique names.
fn parse_signature(key: &str, v: &Value) -> Result<Vec<TensorSpec>, String> {
    let items = match v {
        Value::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(format!(
                "field `{key}` must be a non-empty array of {{\"name\", \"datatype\", \"shape\"}} objects, found {}",
                if v.is_array() { "an empty array" } else { kind(v) }
            ))
        }
    };
    let mut specs: Vec<TensorSpec> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{key}[{i}]");
        let Value::Object(o) = item else {
            return Err(format!(
                "field `{at}` must be an object with `name`, `datatype` and `shape`, found {}",
                kind(item)
            ));
        };
        near_miss::check(&at, o, entry_fields(key), &[])?;
        let name = match o.get("name") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(v) => {
                return Err(format!(
                    "field `{at}.name` must be a non-empty string, found {}",
                    kind(v)
                ))
            }
            None => return Err(format!("field `{at}.name` is missing")),
        };
        if specs.iter().any(|s| s.name == name) {
            return Err(format!("field `{at}.name`: '{name}' is declared twice"));
        }
        let datatype = match o.get("datatype") {
            Some(Value::String(s)) => Datatype::from_v2(s).ok_or_else(|| {
                format!(
                    "field `{at}.datatype` is \"{s}\"; accepted: {}",
                    Datatype::V2_NAMES
                )
            })?,
            Some(v) => {
                return Err(format!(
                    "field `{at}.datatype` must be a string, found {}",
                    kind(v)
                ))
            }
            None => {
                return Err(format!(
                    "field `{at}.datatype` is missing ({})",
                    Datatype::V2_NAMES
                ))
            }
        };
        let shape = match o.get("shape") {
            Some(v) => parse_shape(&format!("{at}.shape"), v)?,
            None => {
                return Err(format!(
                    "field `{at}.shape` is missing (an array of sizes, -1 = any)"
                ))
            }
        };
        specs.push(TensorSpec {
            name,
            datatype,
            shape: Some(shape),
            document: None,
        });
    }
    Ok(specs)
}

/// A shape field (`field` names it in errors): an array of sizes ≥ 0, or -1 for any size.
fn parse_shape(field: &str, v: &Value) -> Result<Vec<i64>, String> {
    let Value::Array(dims) = v else {
        return Err(format!(
            "field `{field}` must be an array of sizes (-1 = any), found {}",
            kind(v)
        ));
    };
    dims.iter()
        .enumerate()
        .map(|(i, d)| match d.as_i64() {
            Some(n) if n == -1 || n >= 0 => Ok(n),
            _ => Err(format!(
                "field `{field}[{i}]` must be a size ≥ 0 or -1 (any size), found {d}"
            )),
        })
        .collect()
}

/// serde_json appends " at line L column C"; the error carries them separately.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AppMetadata, MetadataError> {
        AppMetadata::parse(Path::new("/apps/demo/app-metadata.json"), text)
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn profile_input_fits_the_declared_inputs() {
        let m = parse(r#"{"name": "a", "input": {"shape": [-1, 4]}, "profile_input": [64, 4]}"#)
            .unwrap();
        assert_eq!(m.profile_shapes(16), Some(vec![vec![64, 4]]));
        let m = parse(r#"{"name": "a", "input": {"shape": [-1, 3, -1]}}"#).unwrap();
        assert_eq!(m.profile_shapes(0), Some(vec![vec![1, 3, 1]]));
        // With batching, the leading dimension is a full batch.
        assert_eq!(m.profile_shapes(16), Some(vec![vec![16, 3, 1]]));
        assert_eq!(parse(r#"{"name": "a"}"#).unwrap().profile_shapes(1), None);
        let two = r#""inputs": [{"name": "f", "datatype": "FP32", "shape": [-1, 3]},
                               {"name": "s", "datatype": "INT64", "shape": [-1]}]"#;
        let m = parse(&format!(
            r#"{{"name": "a", {two}, "profile_input": {{"f": [8, 3]}}}}"#
        ))
        .unwrap();
        assert_eq!(m.profile_shapes(1), Some(vec![vec![8, 3], vec![1]]));
        for (text, want) in [
            (r#"{"name": "a", "profile_input": [1]}"#.to_string(), "needs the model's inputs declared"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "profile_input": [64, 5]}"#.into(), "`profile_input.input__0` is [64, 5], which input 'input__0' (shape [-1, 4], -1 = any size) does not accept"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "profile_input": [0, 4]}"#.into(), "`profile_input.input__0[0]` must be a size ≥ 1"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "profile_input": "big"}"#.into(), "must be a shape (an array of sizes) or an object"),
            (format!(r#"{{"name": "a", {two}, "profile_input": [8, 3]}}"#), "the model has 2 inputs; give an object"),
            (format!(r#"{{"name": "a", {two}, "profile_input": {{"g": [1]}}}}"#), "no input named 'g'"),
        ] {
            let e = err(&text);
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn warmup_inputs_fit_the_declared_inputs_and_make_the_warm_up_shapes() {
        // Without warmup_inputs: the declared shapes, -1 as 1.
        let m = parse(r#"{"name": "a", "input": {"shape": [-1, 3, -1]}}"#).unwrap();
        assert_eq!(m.warmup_shapes(0), Some(vec![vec![vec![1, 3, 1]]]));
        // With batching: the full batch first, then one request's shape.
        assert_eq!(
            m.warmup_shapes(4),
            Some(vec![vec![vec![4, 3, 1]], vec![vec![1, 3, 1]]])
        );
        // One row per batch is the one-request shape alone.
        assert_eq!(m.warmup_shapes(1), Some(vec![vec![vec![1, 3, 1]]]));
        assert_eq!(parse(r#"{"name": "a"}"#).unwrap().warmup_shapes(0), None);
        assert_eq!(
            parse(r#"{"name": "a", "input": {}}"#)
                .unwrap()
                .warmup_shapes(0),
            None
        );
        // An input without a declared shape takes warmup_inputs' (and the batch in front).
        let m = parse(r#"{"name": "a", "input": {}, "warmup_inputs": [2, 5]}"#).unwrap();
        assert_eq!(
            m.warmup_shapes(8),
            Some(vec![vec![vec![8, 5]], vec![vec![2, 5]]])
        );
        let bert = r#""inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
                                {"name": "mask", "datatype": "INT64", "shape": [-1, -1]},
                                {"name": "fixed", "datatype": "FP32", "shape": [2, 3]}]"#;
        let m = parse(&format!(
            r#"{{"name": "a", {bert}, "warmup_inputs": {{"ids": [1, 128], "mask": [1, 128]}}}}"#
        ))
        .unwrap();
        assert_eq!(
            m.warmup_shapes(0),
            Some(vec![vec![vec![1, 128], vec![1, 128], vec![2, 3]]])
        );
        // A fixed leading dimension is not a batch dimension: it keeps its size.
        assert_eq!(
            m.warmup_shapes(16).unwrap()[0],
            vec![vec![16, 128], vec![16, 128], vec![2, 3]]
        );
        for (text, want) in [
            (r#"{"name": "a", "warmup_inputs": [1]}"#.to_string(), "field `warmup_inputs` needs the model's inputs declared"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "warmup_inputs": [1, 5]}"#.into(), "`warmup_inputs.input__0` is [1, 5], which input 'input__0' (shape [-1, 4], -1 = any size) does not accept"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "warmup_inputs": [1, 4, 1]}"#.into(), "`warmup_inputs.input__0` is [1, 4, 1]"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "warmup_inputs": [-1, 4]}"#.into(), "field `warmup_inputs.input__0[0]` must be a size ≥ 1, found -1"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "warmup_inputs": [1, 4.5]}"#.into(), "field `warmup_inputs.input__0[1]` must be a size ≥ 1, found 4.5"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "warmup_inputs": 3}"#.into(), "field `warmup_inputs` must be a shape (an array of sizes) or an object of shapes by input name, found a number"),
            (format!(r#"{{"name": "a", {bert}, "warmup_inputs": [1, 128]}}"#), "field `warmup_inputs`: the model has 3 inputs; give an object"),
            (format!(r#"{{"name": "a", {bert}, "warmup_inputs": {{"tokens": [1, 128]}}}}"#), "field `warmup_inputs`: the model has no input named 'tokens'"),
            (format!(r#"{{"name": "a", {bert}, "warmup_inputs": {{"ids": "1x128"}}}}"#), "field `warmup_inputs.ids` must be an array of sizes ≥ 1, found a string"),
            (r#"{"name": "a", "input": {"shape": [-1, 4]}, "warmup_input": [1, 4]}"#.into(), "rename it to `warmup_inputs`"),
        ] {
            let e = err(&text);
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn max_batch_size_is_checked() {
        assert_eq!(parse(r#"{"name": "a"}"#).unwrap().max_batch_size, 0);
        let m = parse(r#"{"name": "a", "max_batch_size": 16, "input": {"shape": [-1, 4]}}"#);
        assert_eq!(m.unwrap().max_batch_size, 16);
        for (text, want) in [
            (r#"{"name": "a", "max_batch_size": -1}"#, "`max_batch_size` must be a whole number 0..=4096 (0 = no batching), found -1"),
            (r#"{"name": "a", "max_batch_size": "8"}"#, "`max_batch_size` must be a whole number 0..=4096 (0 = no batching), found a string"),
            (r#"{"name": "a", "max_batch_size": 4097}"#, "found 4097"),
            (r#"{"name": "a", "max_batch_size": 2.5}"#, "found 2.5"),
            (r#"{"name": "a", "max_batch_size": 4, "input": {"shape": []}}"#, "input `input__0` is declared with shape [] (a scalar)"),
        ] {
            let e = err(text);
            assert!(e.contains(want), "{text}: {e}");
        }
        // A scalar input is fine without batching.
        assert!(parse(r#"{"name": "a", "max_batch_size": 0, "input": {"shape": []}}"#).is_ok());
    }

    #[test]
    fn minimal_metadata_gets_defaults() {
        let m = parse(r#"{"name": "demo"}"#).unwrap();
        assert_eq!(m.name, "demo");
        assert_eq!(m.est_gpu_mem_min, 0);
        assert_eq!(m.est_gpu_mem_typ, 0);
        assert!(m.model.is_none());
        assert!(m.inputs.is_none());
        assert!(m.outputs.is_none());
    }

    #[test]
    fn a_near_miss_of_a_known_field_is_an_error_naming_it_and_clams_fields_are_kept() {
        let e = parse(r#"{"name": "x", "est_gpu_mem_type": 4000}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`est_gpu_mem_type`") && e.contains("rename it to `est_gpu_mem_typ`"),
            "{e}"
        );
        let e = parse(r#"{"name": "x", "Max_Batch_Sise": 4}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`max_batch_size`"), "{e}");
        // CLAMS app metadata: `output`, versions, licences, parameters are not typos.
        let m = parse(
            r#"{"name": "x", "output": [], "app_version": "1", "mmif_version": "1", "parameters": [], "identifier": "x", "url": "u", "est_gpu_mem_maximum": 9}"#,
        )
        .unwrap();
        assert!(m.raw.contains_key("output") && m.raw.contains_key("est_gpu_mem_maximum"));
    }

    #[test]
    fn misspelt_keys_inside_input_are_refused() {
        let e = parse(r#"{"name": "d", "input": {"shap": [-1, 4]}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("field `input.shap` is so close to `input.shape`"),
            "{e}"
        );
        let e = parse(r#"{"name": "d", "input": {"Dtype": "int64"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rename it to `dtype`"), "{e}");
        // Other keys are kept, not refused.
        assert!(parse(r#"{"name": "d", "input": {"shape": [-1, 4], "description": "x"}}"#).is_ok());
        assert!(parse(r#"{"name": "d", "input": {"shape": [-1, 4], "dtype": "int64"}}"#).is_ok());
        assert!(parse(r#"{"name": "d", "input": {}}"#).is_ok());
    }

    #[test]
    fn misspelt_fields_at_every_level_are_refused_with_their_path() {
        let sig = |input: &str, output: &str| {
            format!(
                r#"{{"name": "d", "inputs": [{{"name": "text", "datatype": "BYTES", "shape": [-1]{input}}}],
                   "outputs": [{{"name": "logits", "datatype": "FP32", "shape": [-1, 3]{output}}}]}}"#
            )
        };
        for (input, output, want) in [
            (
                r#", "tokeniser": {"file": "t.json", "max_length": 8}"#,
                "",
                "field `inputs[0].tokeniser` is so close to `inputs[0].tokenizer`",
            ),
            (
                r#", "Image": {"size": [8, 8]}"#,
                "",
                "field `inputs[0].Image` is so close to `inputs[0].image`",
            ),
            (
                r#", "data_type": "BYTES""#,
                "",
                "(did you mean `datatype`?)",
            ),
            (
                "",
                r#", "label": {"file": "labels.json"}"#,
                "field `outputs[0].label` is so close to `outputs[0].labels`",
            ),
            (
                r#", "tokenizer": {"file": "t.json", "max_lenght": 8}"#,
                "",
                "field `inputs[0].tokenizer.max_lenght` is so close to `inputs[0].tokenizer.max_length`",
            ),
            (
                r#", "image": {"size": [8, 8], "sdt": [1, 1, 1], "meen": [0, 0, 0]}"#,
                "",
                "field `inputs[0].image.meen` is so close to `inputs[0].image.mean`",
            ),
            (
                "",
                r#", "labels": {"file": "labels.json", "topk": 2}"#,
                "field `outputs[0].labels.topk` is so close to `outputs[0].labels.top_k`",
            ),
        ] {
            let e = err(&sig(input, output));
            assert!(e.contains(want), "{input} {output}: {e}");
        }
        let e = err(r#"{"name": "d", "input": {"shpae": [-1, 4]}}"#);
        assert!(
            e.contains("field `input.shpae` is so close to `input.shape`"),
            "{e}"
        );
        // Fields no near miss of one vramfork reads are kept, at every level.
        let m = parse(
            r#"{"name": "d", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4], "description": "features", "dims": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3], "note": "logits", "reshape": [3]}]}"#,
        )
        .unwrap();
        assert_eq!(m.raw["inputs"][0]["description"], "features");
        assert_eq!(m.raw["outputs"][0]["reshape"], serde_json::json!([3]));
    }

    #[test]
    fn an_image_mean_in_0_255_units_is_a_warning_naming_its_input() {
        let m = parse(
            r#"{"name": "d", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]},
                {"name": "photo", "datatype": "BYTES", "shape": [-1],
                 "image": {"size": [8, 8], "mean": [123.675, 116.28, 103.53]}}]}"#,
        )
        .unwrap();
        let w = m.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("`inputs[1].image.mean` is"), "{}", w[0]);
        assert!(parse(r#"{"name": "d"}"#).unwrap().warnings().is_empty());
    }

    #[test]
    fn op_libraries_resolve_like_the_model_and_bad_ones_are_named() {
        let m =
            parse(r#"{"name": "d", "op_libraries": ["ops/libvision.so", "/opt/x.so"]}"#).unwrap();
        assert_eq!(
            m.op_libraries,
            vec![
                PathBuf::from("/apps/demo/ops/libvision.so"),
                PathBuf::from("/opt/x.so")
            ]
        );
        assert!(parse(r#"{"name": "d"}"#).unwrap().op_libraries.is_empty());
        let e = parse(r#"{"name": "d", "op_libraries": ["a.so", 3]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("field `op_libraries[1]` must be a non-empty string"),
            "{e}"
        );
        let e = parse(r#"{"name": "d", "op_libraries": "a.so"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("field `op_libraries` must be a list of paths"),
            "{e}"
        );
        // A near miss of the new field is named too.
        let e = parse(r#"{"name": "d", "op_libaries": ["a.so"]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rename it to `op_libraries`"), "{e}");
    }

    #[test]
    fn full_metadata_keeps_unknown_fields_and_resolves_model() {
        let m = parse(
            r#"{"name": "demo", "version": "1.2", "model": "m.pt", "est_gpu_mem_min": 100,
                "est_gpu_mem_typ": 250, "input": {"shape": [-1, 4], "dtype": "float64"},
                "app_license": "MIT", "parameters": [{"name": "x"}]}"#,
        )
        .unwrap();
        assert_eq!(m.model.as_deref(), Some(Path::new("/apps/demo/m.pt")));
        assert_eq!((m.est_gpu_mem_min, m.est_gpu_mem_typ), (100, 250));
        let inputs = m.inputs.clone().unwrap();
        assert_eq!(
            inputs,
            vec![TensorSpec {
                name: "input__0".into(),
                datatype: Datatype::Tensor(Dtype::Float64),
                shape: Some(vec![-1, 4]),
                document: None,
            }]
        );
        assert_eq!(
            inputs[0].input_spec(),
            Some(InputSpec {
                shape: Some(vec![-1, 4]),
                dtype: Dtype::Float64
            })
        );
        assert_eq!(m.raw["app_license"], "MIT");
        assert!(m.to_json().contains("\"parameters\":[{\"name\":\"x\"}]"));
    }

    #[test]
    fn a_signature_of_named_inputs_and_outputs() {
        let m = parse(
            r#"{"name": "pair", "inputs": [
                   {"name": "features", "datatype": "FP32", "shape": [-1, 3]},
                   {"name": "docs", "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": "total", "datatype": "FP64", "shape": [-1]}]}"#,
        )
        .unwrap();
        let inputs = m.inputs.unwrap();
        assert_eq!(
            inputs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["features", "docs"]
        );
        assert_eq!(inputs[0].datatype, Datatype::Tensor(Dtype::Float32));
        assert_eq!(inputs[1].datatype, Datatype::Bytes);
        assert_eq!(inputs[1].input_spec(), None);
        assert!(inputs[0].check_shape(&[5, 3]).is_ok());
        assert!(inputs[0].check_shape(&[5, 4]).is_err());
        let outputs = m.outputs.unwrap();
        assert_eq!(outputs[0].datatype.to_string(), "FP64");
        for name in Datatype::V2_NAMES.split(", ") {
            assert_eq!(Datatype::from_v2(name).unwrap().v2_name(), name);
        }
    }

    #[test]
    fn syntax_error_names_file_line_and_column() {
        let e = err("{\"name\": \"demo\",\n  \"version\": }");
        assert!(e.contains("/apps/demo/app-metadata.json"), "{e}");
        assert!(e.contains("line 2, column 14"), "{e}");
    }

    #[test]
    fn field_errors_name_the_field() {
        let cases = [
            (r#"{}"#, "required field `name` is missing"),
            (r#"[1]"#, "top level must be a JSON object"),
            (
                r#"{"name": 3}"#,
                "field `name` must be a string, found a number",
            ),
            (r#"{"name": " "}"#, "field `name` must not be empty"),
            (
                r#"{"name": "a", "version": 2}"#,
                "field `version` must be a string",
            ),
            (
                r#"{"name": "a", "model": 5}"#,
                "field `model` must be a non-empty string",
            ),
            (
                r#"{"name": "a", "est_gpu_mem_min": -1}"#,
                "`est_gpu_mem_min` must be a whole number of MB ≥ 0, found -1",
            ),
            (
                r#"{"name": "a", "est_gpu_mem_typ": 1.5}"#,
                "`est_gpu_mem_typ` must be a whole number",
            ),
            (
                r#"{"name": "a", "est_gpu_mem_typ": "2GB"}"#,
                "found a string",
            ),
            (
                r#"{"name": "a", "est_gpu_mem_min": 10, "est_gpu_mem_typ": 5}"#,
                "`est_gpu_mem_typ` (5 MB) must be at least `est_gpu_mem_min` (10 MB)",
            ),
            (
                r#"{"name": "a", "input": [1]}"#,
                "field `input` must be an object",
            ),
            (
                r#"{"name": "a", "input": {"shape": [2, -2]}}"#,
                "`input.shape[1]` must be a size",
            ),
            (
                r#"{"name": "a", "input": {"shape": "2x2"}}"#,
                "`input.shape` must be an array",
            ),
            (
                r#"{"name": "a", "input": {"dtype": "complex"}}"#,
                "`input.dtype` is \"complex\"; accepted: float32",
            ),
            (
                r#"{"name": "a", "input": {}, "inputs": [{"name": "x", "datatype": "FP32", "shape": []}]}"#,
                "either `input` (one input) or `inputs`",
            ),
            (
                r#"{"name": "a", "inputs": []}"#,
                "`inputs` must be a non-empty array",
            ),
            (
                r#"{"name": "a", "outputs": {}}"#,
                "`outputs` must be a non-empty array",
            ),
            (
                r#"{"name": "a", "inputs": [3]}"#,
                "`inputs[0]` must be an object",
            ),
            (
                r#"{"name": "a", "inputs": [{"datatype": "FP32", "shape": []}]}"#,
                "`inputs[0].name` is missing",
            ),
            (
                r#"{"name": "a", "inputs": [{"name": "x", "datatype": "FP32", "shape": []}, {"name": "x", "datatype": "FP32", "shape": []}]}"#,
                "`inputs[1].name`: 'x' is declared twice",
            ),
            (
                r#"{"name": "a", "inputs": [{"name": "x", "datatype": "float32", "shape": []}]}"#,
                "`inputs[0].datatype` is \"float32\"; accepted: BOOL",
            ),
            (
                r#"{"name": "a", "outputs": [{"name": "y", "datatype": "FP32"}]}"#,
                "`outputs[0].shape` is missing",
            ),
            (
                r#"{"name": "a", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, -3]}]}"#,
                "`inputs[0].shape[1]` must be a size",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "for {text}: got {e:?}, want {want:?}");
            assert!(e.contains("app-metadata.json"), "{e}");
        }
    }

    #[test]
    fn shape_check_accepts_wildcards_and_explains_mismatch() {
        let spec = InputSpec {
            shape: Some(vec![-1, 4]),
            dtype: Dtype::Float32,
        };
        assert!(spec.check_shape(&[7, 4]).is_ok());
        assert!(spec.check_shape(&[0, 4]).is_ok());
        let e = spec.check_shape(&[4]).unwrap_err();
        assert!(e.contains("[4]") && e.contains("[-1, 4]"), "{e}");
        assert!(spec.check_shape(&[2, 5]).is_err());
        let any = InputSpec {
            shape: None,
            dtype: Dtype::Int64,
        };
        assert!(any.check_shape(&[1, 2, 3]).is_ok());
    }
}
