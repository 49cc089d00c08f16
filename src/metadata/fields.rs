//! The top-level fields of the app metadata vramfork reads (besides the model's
//! signature, `signature.rs`, and the shapes of passes, `shapes.rs`): which fields there
//! are, `name`, `description`/`version`, `model`, `op_libraries`, the GPU estimates and
//! `max_batch_size`. Each check returns the message for `MetadataError::Field`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{kind, MAX_BATCH_SIZE_LIMIT};

/// The fields vramfork reads from the metadata.
pub(super) const KNOWN_FIELDS: [&str; 18] = [
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
    "max_batch_tokens",
    "profile_input",
    "warmup_inputs",
    "embeddings",
    "rerank",
    "classify",
    "pin",
];
/// Fields other apps' metadata carries on purpose that are close to one vramfork reads
/// (CLAMS app metadata's `output`, its versions and licences).
pub(super) const FOREIGN_FIELDS: [&str; 9] = [
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

/// `name`: a non-empty string, required.
pub(super) fn name(raw: &Map<String, Value>) -> Result<String, String> {
    Ok(match raw.get("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => return Err("field `name` must not be empty".into()),
        Some(v) => return Err(format!("field `name` must be a string, found {}", kind(v))),
        None => return Err("required field `name` is missing".into()),
    })
}

/// `description` and `version`: strings when given.
pub(super) fn strings(raw: &Map<String, Value>) -> Result<(), String> {
    for key in ["description", "version"] {
        if let Some(v) = raw.get(key) {
            if !v.is_string() {
                return Err(format!("field `{key}` must be a string, found {}", kind(v)));
            }
        }
    }
    Ok(())
}

/// `model`: a path relative to the metadata file (`path`), when given.
pub(super) fn model(raw: &Map<String, Value>, path: &Path) -> Result<Option<PathBuf>, String> {
    Ok(match raw.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => {
            let base = path.parent().unwrap_or(Path::new("."));
            Some(base.join(s))
        }
        Some(v) => {
            return Err(format!(
                "field `model` must be a non-empty string (a path relative to the metadata file), found {}",
                kind(v)
            ))
        }
    })
}

/// `op_libraries`: paths of shared libraries, relative to the metadata file (`path`).
pub(super) fn op_libraries(raw: &Map<String, Value>, path: &Path) -> Result<Vec<PathBuf>, String> {
    Ok(match raw.get("op_libraries") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let base = path.parent().unwrap_or(Path::new("."));
            let mut libs = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) if !s.is_empty() => libs.push(base.join(s)),
                    v => {
                        return Err(format!(
                            "field `op_libraries[{i}]` must be a non-empty string (the path of a shared library, relative to the metadata file), found {}",
                            kind(v)
                        ))
                    }
                }
            }
            libs
        }
        Some(v) => {
            return Err(format!(
                "field `op_libraries` must be a list of paths of shared libraries of TorchScript operators, found {}",
                kind(v)
            ))
        }
    })
}

/// `est_gpu_mem_min` and `est_gpu_mem_typ` (MB, 0 when absent), the typical at least the
/// minimum.
pub(super) fn estimates(raw: &Map<String, Value>) -> Result<(u64, u64), String> {
    let mb = |key: &str| -> Result<u64, String> {
        match raw.get(key) {
            None | Some(Value::Null) => Ok(0),
            Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
                format!("field `{key}` must be a whole number of MB ≥ 0, found {n}")
            }),
            Some(v) => Err(format!(
                "field `{key}` must be a whole number of MB ≥ 0, found {}",
                kind(v)
            )),
        }
    };
    let (min, typ) = (mb("est_gpu_mem_min")?, mb("est_gpu_mem_typ")?);
    if typ == 0 && min > 0 {
        return Err(format!(
            "field `est_gpu_mem_typ` is 0 (the app uses no GPU) but `est_gpu_mem_min` is {min} MB: for a CPU-only app set both to 0 (or leave both out); for a GPU app set `est_gpu_mem_typ` to what one worker typically takes, at least `est_gpu_mem_min` (`app plan --measure` prints both)"
        ));
    }
    if typ < min {
        return Err(format!(
            "field `est_gpu_mem_typ` ({typ} MB) must be at least `est_gpu_mem_min` ({min} MB)"
        ));
    }
    Ok((min, typ))
}

/// `max_batch_size`: 0 (no batching) to [`MAX_BATCH_SIZE_LIMIT`].
pub(super) fn max_batch_size(raw: &Map<String, Value>) -> Result<u32, String> {
    Ok(match raw.get("max_batch_size") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|n| *n <= u64::from(MAX_BATCH_SIZE_LIMIT))
            .ok_or_else(|| {
                format!(
                    "field `max_batch_size` must be a whole number 0..={MAX_BATCH_SIZE_LIMIT} (0 = no batching), found {n}"
                )
            })? as u32,
        Some(v) => {
            return Err(format!(
                "field `max_batch_size` must be a whole number 0..={MAX_BATCH_SIZE_LIMIT} (0 = no batching), found {}",
                kind(v)
            ))
        }
    })
}

/// `pin`: `true` keeps the server's GPU room whatever its neighbours need (as `--pin`).
pub(super) fn pin(raw: &Map<String, Value>) -> Result<bool, String> {
    match raw.get("pin") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(format!("\"pin\" must be true or false, found {}", kind(v))),
    }
}
