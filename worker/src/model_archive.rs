//! A TorchServe archive's serialized model unpacked where this process loads it from: the
//! server's unpack directory (`vramfork::unpacked`), in a folder of this process's own
//! (`mar-<pid>/`, beside an AOTInductor package's `<pid>/`, which that package's load
//! empties first), and removed once the model is loaded ([`loaded`]): a recycled worker
//! leaves no copy behind.

use std::path::Path;

use vramfork::torchserve::{is_archive, Archive};

/// The file to load in place of `model_path` when it names the metadata's archive (a `.mar`
/// or a model store), unpacked; `None` when it names a model file itself.
pub fn unpacked(model_path: &str, archive: Option<&Archive>) -> Result<Option<String>, String> {
    let Some(archive) = archive.filter(|_| is_archive(Path::new(model_path))) else {
        return Ok(None);
    };
    let root = crate::exported::aoti::unpack_root();
    vramfork::unpacked::private_dir(&root)?;
    let dir = root.join(format!("mar-{}", std::process::id()));
    vramfork::unpacked::private_dir(&dir)?;
    let file = archive.unpack_model(&dir)?;
    tracing::info!(
        event = "archive_unpacked",
        archive = %archive.path.display(),
        model = %file.display(),
        handler = %archive.handler_name,
        "TorchServe archive {}: {} unpacked (handler {})",
        archive.path.display(),
        archive.serialized,
        archive.handler_name
    );
    Ok(Some(file.display().to_string()))
}

/// The model at `model_path` is loaded: its unpacked copy, when it is one, is removed (the
/// loaded model holds what it needs; an AOTInductor package keeps its own files).
pub fn loaded(model_path: &str) {
    let own = format!("mar-{}", std::process::id());
    let dir = Path::new(model_path).parent();
    if let Some(dir) = dir.filter(|d| d.file_name().is_some_and(|n| *n == *own)) {
        let _ = std::fs::remove_dir_all(dir);
    }
}
