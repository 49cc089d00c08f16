//! The app metadata file: parsing, validation with errors that name the
//! file, the field, and (for syntax errors) the line and column. The parsed JSON is kept
//! whole, unknown fields included, because `GET /` returns it as it was written.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | [`AppMetadata`], [`MetadataError`], loading and the order of the checks |
//! | `fields.rs` | the top-level fields: which there are, `name`, `model`, `op_libraries`, the GPU estimates, `max_batch_size` |
//! | `signature.rs` | the model's declared inputs and outputs ([`TensorSpec`], [`Datatype`]), the older `input` ([`InputSpec`]) |
//! | `blocks.rs` | an entry's `tokenizer`/`image` (inputs) and `labels` (outputs) blocks |
//! | `embeddings.rs` | the `embeddings` block (OpenAI's `/v1/embeddings`) |
//! | `rerank.rs` | the `rerank` block (cross-encoders: the rerank and score endpoints), the activations |
//! | `output_choice.rs` | which of the model's outputs a block reads (`output`: a position or a declared name) |
//! | `classify.rs` | the `classify` block (sequence classifiers: the classify and predict endpoints) |
//! | `shapes.rs` | the shapes of the warm-up and profiling passes (`warmup_inputs`, `profile_input`) |
//! | `batch_tokens.rs` | the token budget of a text pass (`max_batch_tokens`) and its worst shape |
//! | `torchserve.rs` | a TorchServe archive as `model`: read, and what it amounts to filled in |

pub mod batch_tokens;
mod blocks;
pub mod classify;
pub mod embeddings;
mod fields;
mod output_choice;
pub mod rerank;
mod shapes;
mod signature;
mod torchserve;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::near_miss;
pub use crate::schema::{kind, Dtype};
pub use shapes::with_rows;
pub use signature::{Datatype, InputSpec, TensorSpec, SINGLE_INPUT};

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
    /// Rows × padded length one pass of a text input may hold (`max_batch_tokens`); `None`:
    /// the default (`batch_tokens.rs`).
    pub max_batch_tokens: Option<usize>,
    /// The input to profile a worker's memory with (`profile_input`): a shape per declared
    /// input, by name; inputs not named take their declared shape with `-1` as 1.
    pub profile_input: Option<BTreeMap<String, Vec<i64>>>,
    /// The input shapes the warm-up passes use (`warmup_inputs`), by input name, in the
    /// same form as `profile_input`; inputs not named take their declared shape, `-1` as 1.
    pub warmup_inputs: Option<BTreeMap<String, Vec<i64>>>,
    /// Class names of classification outputs (`outputs[i].labels`), by output index.
    pub labels: BTreeMap<usize, crate::labels::Labels>,
    /// How the model makes vectors for `/v1/embeddings` (`embeddings`), when it declares it.
    pub embeddings: Option<embeddings::Embeddings>,
    /// How a cross-encoder scores pairs (`rerank`), when it declares it.
    pub rerank: Option<rerank::Rerank>,
    /// How a sequence classifier names its classes (`classify`), when it declares it.
    pub classify: Option<classify::Classify>,
    /// `pin`: the server keeps its GPU room whatever its neighbours need (as `--pin`).
    pub pin: bool,
    /// The TorchServe archive `model` names, when it names one (`crate::torchserve`).
    pub archive: Option<crate::torchserve::Archive>,
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

    /// Validates metadata text; `path` names it in errors and anchors the model path. The
    /// fields are checked in one order, so that of two mistakes the same one is named.
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

        let name = fields::name(&raw).map_err(field)?;
        near_miss::check("", &raw, &fields::KNOWN_FIELDS, &fields::FOREIGN_FIELDS)
            .map_err(field)?;
        fields::strings(&raw).map_err(field)?;
        torchserve::settings(&raw).map_err(field)?;
        let model = fields::model(&raw, path).map_err(field)?;
        let archive = torchserve::archive(&raw, model.as_deref()).map_err(field)?;
        let view = torchserve::view(&raw, archive.as_ref());
        let doc = view.as_ref().unwrap_or(&raw);
        let op_libraries = fields::op_libraries(&raw, path).map_err(field)?;
        let (est_gpu_mem_min, est_gpu_mem_typ) = fields::estimates(&raw).map_err(field)?;
        let mut inputs = signature::inputs(doc).map_err(field)?;
        blocks::documents(doc, inputs.as_deref_mut(), path).map_err(field)?;
        let outputs = signature::declared(doc, "outputs").map_err(field)?;
        let mut labels = blocks::labels(doc, outputs.as_deref(), path).map_err(field)?;
        if let Some(l) = archive.as_ref().and_then(|a| a.labels_block()) {
            labels.entry(0).or_insert(l);
        }
        let embeddings =
            embeddings::parse(doc, inputs.as_deref(), outputs.as_deref()).map_err(field)?;
        let rerank = rerank::parse(doc, inputs.as_deref(), outputs.as_deref()).map_err(field)?;
        let classify =
            classify::parse(doc, inputs.as_deref(), outputs.as_deref()).map_err(field)?;
        let max_batch_size = fields::max_batch_size(doc).map_err(field)?;
        let pin = fields::pin(&raw).map_err(field)?;
        let max_batch_tokens = batch_tokens::parse(&raw).map_err(field)?;
        if let Some(spec) = unbatchable_input(inputs.as_deref(), max_batch_size) {
            return Err(field(spec));
        }
        let profile_input = match raw.get("profile_input") {
            None | Some(Value::Null) => None,
            Some(v) => {
                Some(shapes::parse_shapes("profile_input", v, inputs.as_deref()).map_err(field)?)
            }
        };
        let warmup_inputs = match raw.get("warmup_inputs") {
            None | Some(Value::Null) => None,
            Some(v) => {
                Some(shapes::parse_shapes("warmup_inputs", v, inputs.as_deref()).map_err(field)?)
            }
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
            max_batch_tokens,
            profile_input,
            warmup_inputs,
            labels,
            embeddings,
            rerank,
            classify,
            pin,
            archive,
        })
    }

    /// Likely mistakes that do not stop the start, for warnings (the plan's): `mean` or
    /// `std` of an `image` block in 0–255 units; a TorchServe store's settings not applied.
    pub fn warnings(&self) -> Vec<String> {
        let inputs = self.inputs.as_deref().unwrap_or_default();
        let archive = self.archive.iter();
        let settings = archive.flat_map(|a| a.settings.not_applied.iter().cloned());
        inputs
            .iter()
            .enumerate()
            .flat_map(|(i, spec)| match &spec.document {
                Some(crate::documents::Document::Image(image)) => {
                    image.unit_warnings(&format!("inputs[{i}].image"))
                }
                _ => Vec::new(),
            })
            .chain(settings)
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
            // The newcomer's two traps, each with its fix named.
            (
                r#"{"name": "a", "est_gpu_mem_min": 700, "est_gpu_mem_typ": 0}"#,
                "for a CPU-only app set both to 0 (or leave both out)",
            ),
            (
                r#"{"name": "a", "input": [{"@type": "http://mmif.clams.ai/vocabulary/VideoDocument/v1", "required": true}]}"#,
                "a list here is CLAMS's `input` (the MMIF types an app reads), which vramfork does not read: rename it (`clams_input`",
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
