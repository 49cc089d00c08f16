//! TorchServe's model archives served as they are: a `.mar` named as the metadata's
//! `model`, or a model store (a folder with `config.properties` and `model-store/*.mar`, as
//! KServe mounts one at `/mnt/models`). The archive's manifest (`MAR-INF/MANIFEST.json`)
//! names the serialized model, its handler and version; `index_to_name.json` the classes.
//! A default handler whose model is TorchScript or a `.pt2` is served without Python (its
//! pre- and post-processing are the metadata blocks it amounts to, `handler.rs`); Python
//! code (a custom `handler.py`, an eager `model.py` with its `.pth`) is refused at start,
//! naming what to write in the metadata instead.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | [`Archive`]: what an archive says, read and checked |
//! | `zipped.rs` | the archive's zip, read bounded (zip bombs, `../` names refused) |
//! | `store.rs` | a model store: its one archive, `config.properties` |
//! | `handler.rs` | the default handlers: the inputs and outputs each amounts to |
//! | `cli.rs` | TorchServe's command-line options, refused naming what does the same here |

pub mod cli;
pub mod handler;
pub mod store;
mod zipped;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use handler::Handler;

/// The manifest's place in an archive.
pub const MANIFEST: &str = "MAR-INF/MANIFEST.json";
/// The class names TorchServe's handlers read beside the model.
pub const INDEX_TO_NAME: &str = "index_to_name.json";
/// Small files (the manifest, the class names) are read whole up to this size.
const SMALL: u64 = 16 << 20;

/// The format of the archive's serialized model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    TorchScript,
    /// A `torch.export` program or an AOTInductor package.
    Pt2,
}

/// A TorchServe model archive, read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Archive {
    /// The `.mar` file.
    pub path: PathBuf,
    /// The manifest's `modelName`: TorchServe's `/predictions/{name}`.
    pub model_name: String,
    /// The manifest's `modelVersion`, when given.
    pub version: Option<String>,
    /// The manifest's `handler` as written.
    pub handler_name: String,
    pub handler: Handler,
    /// The serialized model's entry in the archive.
    pub serialized: String,
    pub format: Format,
    /// `index_to_name.json`'s class names, by index, when the archive has one.
    pub labels: Option<Vec<String>>,
    /// Settings of the store's `config.properties` for this model (`store.rs`).
    pub settings: store::Settings,
}

impl Archive {
    /// Reads the archive at `path`, or the one archive of the model store at `path` (a
    /// folder). `declared`: the metadata declares the model's `inputs`, which stand in for
    /// a handler vramfork does not run.
    pub fn open(path: &Path, declared: bool) -> Result<Archive, String> {
        if path.is_dir() {
            let (mar, settings) = store::one_archive(path)?;
            let mut a = Archive::open_file(&mar, declared)?;
            a.settings = settings.for_model(&a.model_name, &mar);
            return Ok(a);
        }
        Archive::open_file(path, declared)
    }

    fn open_file(path: &Path, declared: bool) -> Result<Archive, String> {
        let shown = path.display().to_string();
        let mut zip = zipped::Zipped::open(path)?;
        if !zip.has(MANIFEST) {
            return Err(format!(
                "the model archive {shown} has no {MANIFEST}: it is not a TorchServe archive (torch-model-archiver writes one)"
            ));
        }
        let manifest: Value = serde_json::from_slice(&zip.read(MANIFEST, SMALL)?)
            .map_err(|e| format!("{shown}: {MANIFEST} is not JSON: {e}"))?;
        let model = manifest
            .get("model")
            .and_then(Value::as_object)
            .ok_or_else(|| format!("{shown}: {MANIFEST} has no `model` object"))?;
        let text = |k: &str| model.get(k).and_then(Value::as_str).map(str::to_string);
        let model_name = text("modelName")
            .filter(|n| !n.is_empty() && !n.contains('/'))
            .ok_or_else(|| format!("{shown}: {MANIFEST} has no `model.modelName`"))?;
        let handler_name = text("handler").unwrap_or_default();
        let serialized = text("serializedFile");
        if let Some(file) = text("modelFile").filter(|f| !f.is_empty()) {
            return Err(eager(&shown, &file, serialized.as_deref()));
        }
        let serialized = serialized.filter(|s| !s.is_empty()).ok_or_else(|| {
            format!("{shown}: {MANIFEST} names no `model.serializedFile`: nothing to serve")
        })?;
        let format = match Path::new(&serialized).extension().and_then(|e| e.to_str()) {
            Some("pt" | "pth" | "ts" | "torchscript") => Format::TorchScript,
            Some("pt2") => Format::Pt2,
            _ => {
                return Err(format!(
                    "{shown}: the serialized model {serialized} is neither TorchScript (.pt) nor a torch.export program (.pt2): export the model with torch.jit.script or torch.export and archive that file"
                ))
            }
        };
        if !zip.has(&serialized) {
            return Err(format!(
                "{shown}: {MANIFEST} names {serialized}, which the archive does not hold"
            ));
        }
        let handler = Handler::of(&handler_name);
        if let (Handler::Custom, false) = (handler, declared) {
            return Err(handler::custom_refusal(&shown, &handler_name));
        }
        if (handler, format) == (Handler::ObjectDetector, Format::Pt2) {
            return Err(handler::detector_pt2(&shown, &serialized));
        }
        let labels = if zip.has(INDEX_TO_NAME) {
            let doc: Value = serde_json::from_slice(&zip.read(INDEX_TO_NAME, SMALL)?)
                .map_err(|e| format!("{shown}: {INDEX_TO_NAME} is not JSON: {e}"))?;
            Some(
                crate::labels::names_of(doc)
                    .map_err(|e| format!("{shown}: {INDEX_TO_NAME}: {e}"))?,
            )
        } else {
            None
        };
        Ok(Archive {
            path: path.to_path_buf(),
            model_name,
            version: text("modelVersion"),
            handler_name,
            handler,
            serialized,
            format,
            labels,
            settings: store::Settings::default(),
        })
    }

    /// Unpacks the serialized model into the folder `dir` (private, made by the caller),
    /// and returns the file's path: what the worker loads.
    pub fn unpack_model(&self, dir: &Path) -> Result<PathBuf, String> {
        let mut zip = zipped::Zipped::open(&self.path)?;
        let base = Path::new(&self.serialized)
            .file_name()
            .ok_or_else(|| format!("{}: no file name", self.serialized))?;
        let to = dir.join(base);
        let _ = std::fs::remove_file(&to);
        zip.extract(&self.serialized, &to)?;
        Ok(to)
    }
}

/// The refusal of an eager model (`model.py` with a state dict): vramfork runs no Python.
fn eager(shown: &str, file: &str, weights: Option<&str>) -> String {
    let weights = weights.unwrap_or("its weights");
    format!(
        "{shown} is an eager model ({file} with {weights}): vramfork runs no Python. Export it once, where the model's code is: `torch.jit.script(model).save(\"model.pt\")` (or `torch.export.save(torch.export.export(model, example), \"model.pt2\")`), and set the metadata's `model` to that file, or archive it again with `--serialized-file model.pt` and no `--model-file`"
    )
}

/// Whether a metadata's `model` names a TorchServe archive or model store: a `.mar` file,
/// or a folder.
pub fn is_archive(model: &Path) -> bool {
    model
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("mar"))
        || model.is_dir()
}
