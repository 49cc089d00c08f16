//! The metadata of a TorchServe archive served without one written for it: `--model` naming a
//! `.mar` or a model store (the metadata's `model` becomes it, so that the archive's handler
//! and class names are read as for a `model` written in the file), or no metadata file at
//! all beside a model store (a KServe `storageUri` holding TorchServe's layout, mounted at
//! `/mnt/models`): the metadata is then `{"name": <the archive's modelName>, "model": <the
//! store>}`.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::ConfigError;
use crate::master::cli::Cli;
use crate::metadata::AppMetadata;
use crate::torchserve::{is_archive, Archive};

/// The metadata at `path`, with `model` (`--model`, when it names an archive) in it; or, when
/// the file is missing and its folder is a model store, the store's own.
pub(super) fn metadata(path: &Path, model: Option<&Path>) -> Result<AppMetadata, ConfigError> {
    let err = |e: String| ConfigError(e);
    let archive = model.filter(|m| is_archive(m));
    let folder = path.parent().unwrap_or(Path::new("."));
    if !path.exists() {
        let store = archive.or_else(|| is_store(folder).then_some(folder));
        if let Some(store) = store {
            let name = Archive::open(store, true).map_err(err)?.model_name;
            let doc = json!({"name": name, "model": store});
            return AppMetadata::parse(path, &doc.to_string()).map_err(|e| err(e.to_string()));
        }
    }
    let metadata = AppMetadata::load(path).map_err(|e| err(e.to_string()))?;
    let Some(archive) = archive else {
        return Ok(metadata);
    };
    let mut raw: Map<String, Value> = metadata.raw;
    raw.insert("model".into(), json!(archive));
    AppMetadata::parse(path, &Value::Object(raw).to_string()).map_err(|e| err(e.to_string()))
}

/// Whether `dir` is laid out as a TorchServe model store: `model-store/`, or `.mar` files.
fn is_store(dir: &Path) -> bool {
    dir.join("model-store").is_dir()
        || std::fs::read_dir(dir).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "mar")))
        })
}

/// A model store's `maxBatchDelay` and `responseTimeout` as `--batch-timeout-ms` and
/// `--request-timeout` where neither the command line nor the environment gives them.
pub(super) fn defaults(cli: &mut Cli, metadata: &AppMetadata) {
    let Some(s) = metadata.archive.as_ref().map(|a| &a.settings) else {
        return;
    };
    if cli.batch_timeout_ms.is_none() {
        cli.batch_timeout_ms = s.batch_delay_ms.map(|ms| ms.to_string());
    }
    if cli.request_timeout.is_none() {
        cli.request_timeout = s.response_timeout_s.map(|t| t.to_string());
    }
}
