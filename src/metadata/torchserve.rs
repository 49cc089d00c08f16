//! The metadata of a model served from a TorchServe archive (`model` a `.mar`, or a model
//! store's folder): the archive read and checked at load, and the document the rest of the
//! checks read — the handler's inputs and outputs where the metadata declares none, the
//! store's `batchSize` where it sets no `max_batch_size` (`crate::torchserve`).

use std::path::Path;

use serde_json::{Map, Value};

use crate::torchserve::{is_archive, Archive};

/// The archive `model` names, when it names one.
pub(super) fn archive(
    raw: &Map<String, Value>,
    model: Option<&Path>,
) -> Result<Option<Archive>, String> {
    let Some(model) = model.filter(|m| is_archive(m)) else {
        return Ok(None);
    };
    let declared = ["input", "inputs"].iter().any(|k| raw.contains_key(*k));
    Archive::open(model, declared).map(Some)
}

/// The document the checks read: as written, or with what the archive amounts to.
pub(super) fn view(
    raw: &Map<String, Value>,
    archive: Option<&Archive>,
) -> Option<Map<String, Value>> {
    let archive = archive?;
    let mut view = archive.filled(raw);
    if let Some(b) = archive.settings.batch_size.filter(|b| *b > 1) {
        view.entry("max_batch_size").or_insert(Value::from(b));
    }
    Some(view)
}

/// TorchServe's model settings, as its users write them into a metadata file, and what does
/// the same here: kept silently they would leave batching off and the handler unread.
const SETTINGS: [(&str, &str); 8] = [
    ("handler", "vramfork runs no Python handler: set `model` to the .mar (its default handler is read from it), or declare the handler's work as `inputs` and `outputs`"),
    ("batchSize", "write `max_batch_size`"),
    ("maxBatchDelay", "pass --batch-timeout-ms"),
    ("minWorkers", "pass --workers (or let the plan size the pool)"),
    ("maxWorkers", "pass --workers (or let the plan size the pool)"),
    ("responseTimeout", "pass --request-timeout"),
    ("serializedFile", "write `model`"),
    ("modelFile", "vramfork runs no Python model: export it (torch.jit.script or torch.export) and set `model` to that file"),
];

/// A TorchServe setting at the metadata's top level, refused naming what does the same here.
pub(super) fn settings(raw: &Map<String, Value>) -> Result<(), String> {
    match SETTINGS.iter().find(|(k, _)| raw.contains_key(*k)) {
        Some((key, instead)) => Err(format!(
            "field `{key}` is TorchServe's, which vramfork does not read: {instead}"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::metadata::AppMetadata;

    #[test]
    fn torchserves_settings_in_the_metadata_are_refused_naming_ours() {
        for (field, want) in [
            ("\"batchSize\": 8", "field `batchSize` is TorchServe's, which vramfork does not read: write `max_batch_size`"),
            ("\"maxBatchDelay\": 10", "pass --batch-timeout-ms"),
            ("\"handler\": \"image_classifier\"", "set `model` to the .mar"),
        ] {
            let text = format!(r#"{{"name": "a", {field}}}"#);
            let e = AppMetadata::parse(Path::new("/m/app-metadata.json"), &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{field}: {e}");
        }
    }
}
