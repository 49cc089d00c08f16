//! A TorchServe model store as KServe mounts one (`/mnt/models`): `config/config.properties`
//! (or `config.properties`) beside `model-store/*.mar` (or the archives in the folder
//! itself). One server serves one archive: a store of several is refused naming them (each
//! gets its own server, and the host's ledger shares the GPU between them). Of
//! `config.properties`, the model's `batchSize` becomes `max_batch_size`, its
//! `maxBatchDelay` and `responseTimeout` the values of `--batch-timeout-ms` and
//! `--request-timeout` when those are not given; the other settings are named at start with
//! the option that does the same here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// `config.properties` is a short text file; a bigger one is no configuration.
const MAX_PROPERTIES: u64 = 1 << 20;

/// The settings of `config.properties` that apply to the served model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// The model's `batchSize` (TorchServe's 1 is no batching).
    pub batch_size: Option<u32>,
    /// The model's `maxBatchDelay` (ms): `--batch-timeout-ms` unless that is given.
    pub batch_delay_ms: Option<u64>,
    /// The model's `responseTimeout` (s): `--request-timeout` unless that is given.
    pub response_timeout_s: Option<u64>,
    /// Settings that have an option of vramfork's, or none: named at start, not applied.
    pub not_applied: Vec<String>,
}

/// The store's one archive and its `config.properties` (empty when it has none).
pub fn one_archive(dir: &Path) -> Result<(PathBuf, Properties), String> {
    let store = dir.join("model-store");
    let folder = if store.is_dir() {
        store
    } else {
        dir.to_path_buf()
    };
    let mut mars: Vec<PathBuf> = std::fs::read_dir(&folder)
        .map_err(|e| format!("cannot read the model store {}: {e}", folder.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "mar") && p.is_file())
        .collect();
    mars.sort();
    let mar = match mars.as_slice() {
        [one] => one.clone(),
        [] => {
            return Err(format!(
                "the model store {} holds no .mar archive (looked in {})",
                dir.display(),
                folder.display()
            ))
        }
        many => {
            let names: Vec<String> = many
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            return Err(format!(
                "the model store {} holds {} archives ({}): one server serves one archive. Start one server per archive, each with its metadata's `model` set to that .mar (the servers of one host share its GPUs through the ledger)",
                dir.display(),
                names.len(),
                names.join(", ")
            ));
        }
    };
    let props = [
        dir.join("config").join("config.properties"),
        dir.join("config.properties"),
    ]
    .into_iter()
    .find(|p| p.is_file());
    let props = match props {
        Some(p) => Properties::read(&p)?,
        None => Properties::default(),
    };
    Ok((mar, props))
}

/// `config.properties`, read as Java reads properties: `key=value` (or `key: value`)
/// lines, `#` and `!` comments, a line ending in `\` continued on the next.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    pub path: PathBuf,
    pub values: BTreeMap<String, String>,
}

impl Properties {
    pub fn read(path: &Path) -> Result<Properties, String> {
        let text = crate::files::read_regular(path, MAX_PROPERTIES)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&text);
        Ok(Properties {
            path: path.to_path_buf(),
            values: parse(&text),
        })
    }

    /// The settings for the model `name` (archive `mar`): its entry in `models` (or the
    /// older `model_snapshot`'s `models`), the default version's or the first.
    pub fn for_model(&self, name: &str, mar: &Path) -> Settings {
        let mut s = Settings::default();
        let shown = self.path.display();
        let mar_name = mar.file_name().map(|n| n.to_string_lossy().into_owned());
        let models = self.models();
        let entry = models.as_ref().and_then(|m| {
            m.get(name)
                .or_else(|| {
                    m.values().find(|v| {
                        v.as_object().into_iter().flat_map(|o| o.values()).any(|e| {
                            e.get("marName").and_then(Value::as_str) == mar_name.as_deref()
                        })
                    })
                })
                .and_then(Value::as_object)
                .and_then(|versions| {
                    versions
                        .values()
                        .find(|e| e.get("defaultVersion") == Some(&Value::Bool(true)))
                        .or_else(|| versions.values().next())
                })
        });
        if let Some(Value::Object(e)) = entry {
            s.batch_size = e
                .get("batchSize")
                .and_then(Value::as_u64)
                .filter(|b| *b >= 1)
                .map(|b| b.min(u64::from(crate::metadata::MAX_BATCH_SIZE_LIMIT)) as u32);
            s.batch_delay_ms = e.get("maxBatchDelay").and_then(Value::as_u64);
            s.response_timeout_s = e
                .get("responseTimeout")
                .and_then(Value::as_u64)
                .filter(|t| *t > 0);
            for (key, option) in MODEL_SETTINGS {
                if let Some(v) = e.get(*key) {
                    s.not_applied
                        .push(format!("{shown}: `{key}` {v} is not applied: {option}"));
                }
            }
        }
        for (key, v) in &self.values {
            if matches!(
                key.as_str(),
                "models" | "model_snapshot" | "model_store" | "load_models"
            ) {
                continue;
            }
            let option = SERVER_SETTINGS
                .iter()
                .find(|(k, _)| k == key)
                .map_or("vramfork has no such setting", |(_, o)| o);
            s.not_applied
                .push(format!("{shown}: `{key}={v}` is not applied: {option}"));
        }
        s
    }

    /// The `models` object (`models=` or `model_snapshot=`'s `models`), when it is JSON.
    fn models(&self) -> Option<serde_json::Map<String, Value>> {
        if let Some(Ok(Value::Object(m))) =
            self.values.get("models").map(|v| serde_json::from_str(v))
        {
            return Some(m);
        }
        let snap: Value = serde_json::from_str(self.values.get("model_snapshot")?).ok()?;
        snap.get("models")?.as_object().cloned()
    }
}

/// A model's settings and the option that does the same here.
const MODEL_SETTINGS: &[(&str, &str)] = &[
    (
        "minWorkers",
        "use --workers (or let the plan size the pool)",
    ),
    (
        "maxWorkers",
        "use --workers (or let the plan size the pool)",
    ),
];

/// Server settings and the option that does the same here.
const SERVER_SETTINGS: &[(&str, &str)] = &[
    (
        "inference_address",
        "use --host and --port (one port serves every API)",
    ),
    (
        "management_address",
        "use --host and --port (the read-only GET /models is on the same port)",
    ),
    ("metrics_address", "use --metrics-port"),
    ("default_workers_per_model", "use --workers"),
    ("default_response_timeout", "use --request-timeout"),
    ("max_request_size", "use --max-body-mb"),
    ("max_response_size", "answers are not bounded separately"),
    (
        "job_queue_size",
        "requests wait in the listening socket's queue",
    ),
    ("number_of_netty_threads", "each worker has one event loop"),
    (
        "enable_envvars_config",
        "options read their VRAMFORK_ variables always",
    ),
    ("install_py_dep_per_model", "vramfork runs no Python"),
];

/// Java's properties format, enough of it for TorchServe's files.
fn parse(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim_start();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!'))
        {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        let whole = std::mem::take(&mut pending);
        let cut = whole.find(['=', ':']);
        let (k, v) = match cut {
            Some(i) => (&whole[..i], &whole[i + 1..]),
            None => (whole.as_str(), ""),
        };
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_as_kserve_writes_them() {
        let text = "inference_address=http://0.0.0.0:8085\n# a comment\nenable_envvars_config=true\nmodel_snapshot={\"name\":\"startup.cfg\",\"modelCount\":1,\"models\":{\"mnist\":{\"1.0\":{\"defaultVersion\":true,\"marName\":\"mnist.mar\",\"minWorkers\":1,\"maxWorkers\":5,\"batchSize\":4,\\\n\"maxBatchDelay\":10,\"responseTimeout\":120}}}}\n";
        let p = Properties {
            path: PathBuf::from("config.properties"),
            values: parse(text),
        };
        assert_eq!(p.values["inference_address"], "http://0.0.0.0:8085");
        let s = p.for_model("mnist", Path::new("/m/mnist.mar"));
        assert_eq!(s.batch_size, Some(4));
        assert_eq!(
            (s.batch_delay_ms, s.response_timeout_s),
            (Some(10), Some(120))
        );
        let all = s.not_applied.join("\n");
        for want in [
            "`minWorkers` 1 is not applied: use --workers",
            "`inference_address=http://0.0.0.0:8085` is not applied: use --host and --port",
        ] {
            assert!(all.contains(want), "{want}: {all}");
        }
        // Found by its archive's name too.
        assert_eq!(
            p.for_model("other", Path::new("/m/mnist.mar")).batch_size,
            Some(4)
        );
    }
}
