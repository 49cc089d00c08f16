//! What is served: the app metadata (`--metadata`; a TorchServe archive's own,
//! `archive.rs`), the model file (`--model`, over the metadata's `model`) and the model's v2
//! name (`--model-name`).

use std::path::{Path, PathBuf};

use super::checker::{absolute, Checker};
use super::{ConfigError, Mode};
use crate::master::cli::Cli;
use crate::metadata::AppMetadata;

/// This group's defaults (rendered into `--help` by `config::command`).
pub(super) const DEFAULTS: &[(&str, &str)] = &[("--metadata", "app-metadata.json")];

/// The longest `--model-name`: Kubernetes object names (an InferenceService's) have at most
/// 253 characters.
const MODEL_NAME_MAX: usize = 253;

/// The app metadata and the model it serves.
#[derive(Debug, Clone)]
pub struct App {
    pub metadata: AppMetadata,
    /// Absolute path of the model file (`--model`, else the metadata's `model`).
    pub model_path: Option<PathBuf>,
    /// `--model`, when given: a reload keeps it instead of the metadata's `model`.
    pub model_override: Option<PathBuf>,
    /// `--model-name`: the model's v2 name, instead of the metadata's `name`.
    pub model_name: Option<String>,
}

impl App {
    /// The metadata and the model to serve: `--model` (kept by a reload), else the
    /// metadata's `model`; none is an error unless only the plan is printed.
    pub(super) fn check(cli: &Cli, mode: Mode, c: &Checker<'_>) -> Result<App, ConfigError> {
        let metadata_path = match &cli.metadata {
            Some(m) => absolute(Path::new(m)),
            None => absolute(Path::new(c.value("--metadata", None))),
        };
        let model_override = cli.model.as_deref().map(|m| absolute(Path::new(m)));
        let metadata = super::archive::metadata(&metadata_path, model_override.as_deref())?;
        let model_path = model_override.clone().or_else(|| metadata.model.clone());
        if model_path.is_none() && !matches!(mode, Mode::Plan { measure: false, .. }) {
            return Err(ConfigError(format!(
                "no model to serve: set `model` in {} or pass --model FILE",
                metadata_path.display()
            )));
        }
        Ok(App {
            metadata,
            model_path,
            model_override,
            model_name: model_name(cli.model_name.clone(), c)?,
        })
    }

    /// This app with the metadata read again (SIGHUP); `--model` still wins.
    pub(super) fn reloaded(&self) -> Result<App, ConfigError> {
        let metadata =
            super::archive::metadata(&self.metadata.path, self.model_override.as_deref())?;
        let model_path = self
            .model_override
            .clone()
            .or_else(|| metadata.model.clone());
        if model_path.is_none() {
            return Err(ConfigError(format!(
                "no model to serve: {} has no `model`",
                self.metadata.path.display()
            )));
        }
        Ok(App {
            metadata,
            model_path,
            ..self.clone()
        })
    }

    /// The model's path as text (empty when there is none), for messages and workers.
    pub fn model_display(&self) -> String {
        self.model_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }
}

/// `--model-name`: a v2 path segment (`/v2/models/NAME`), so no `/`, no control characters,
/// not blank, at most [`MODEL_NAME_MAX`] characters.
fn model_name(v: Option<String>, c: &Checker<'_>) -> Result<Option<String>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let ok = !v.trim().is_empty()
        && v.chars().count() <= MODEL_NAME_MAX
        && !v.chars().any(|ch| ch == '/' || ch.is_control());
    if !ok {
        return Err(c.bad(
            "--model-name",
            &v,
            &format!("expected a name of 1 to {MODEL_NAME_MAX} characters without '/' or control characters (such as an InferenceService's name)"),
        ));
    }
    Ok(Some(v))
}
