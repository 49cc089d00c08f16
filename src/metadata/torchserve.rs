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
