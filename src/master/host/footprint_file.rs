//! `--footprint-file`: what a server learned of a model's GPU footprint, kept across
//! restarts. One JSON object, keyed by the SHA-256 of the model file (so a changed model
//! starts afresh), each entry the highest footprint seen (measured before planning or
//! observed while serving):
//!
//! ```json
//! {"3f5a…": {"high_water_mb": 5120, "context_mb": 520, "model": "/srv/app/model.pt", "updated": 1795420800}}
//! ```
//!
//! `context_mb`, when profiling measured it, is what a worker held beside its allocator
//! (its CUDA context): a plan made from the file takes it, as a profiled one does, rather
//! than the 500 MB constant.
//!
//! Written atomically (a temporary file renamed over it); other entries are kept.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// What the file holds for one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The highest footprint seen, MB.
    pub high_water_mb: u64,
    /// What a worker held beside its allocator when profiling measured it, MB.
    pub context_mb: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct FootprintFile {
    pub path: PathBuf,
    /// Hex SHA-256 of the model file.
    pub key: String,
    pub model: PathBuf,
}

impl FootprintFile {
    /// The file for `model` (hashed now).
    pub fn new(path: &Path, model: &Path) -> Result<FootprintFile, String> {
        Ok(FootprintFile {
            path: path.to_path_buf(),
            key: sha256_file(model)?,
            model: model.to_path_buf(),
        })
    }

    /// What is recorded for this model, if anything. A file that does not exist is no
    /// record; one that cannot be read or parsed is an error (so it is not overwritten
    /// unnoticed).
    pub fn recorded(&self) -> Result<Option<Recorded>, String> {
        let Some(doc) = self.read()? else {
            return Ok(None);
        };
        let entry = doc.get(&self.key);
        let field = |k: &str| entry.and_then(|e| e.get(k)).and_then(Value::as_u64);
        Ok(field("high_water_mb").map(|high_water_mb| Recorded {
            high_water_mb,
            context_mb: field("context_mb"),
        }))
    }

    /// The high-water mark recorded for this model, if any ([`FootprintFile::recorded`]).
    pub fn recorded_mb(&self) -> Result<Option<u64>, String> {
        Ok(self.recorded()?.map(|r| r.high_water_mb))
    }

    /// Records `mb` for this model unless a higher figure is recorded already, and the
    /// context profiling measured with it (`context_mb`, the latest measurement), in one
    /// write. Other fields of the entry are kept. Servers sharing the file take turns (an
    /// exclusive `flock` on `FILE.lock`).
    pub fn record(&self, mb: u64, context_mb: Option<u64>) -> Result<(), String> {
        let _lock = self.lock()?;
        let mut doc = self.read()?.unwrap_or_default();
        let mut entry = match doc.remove(&self.key) {
            Some(Value::Object(e)) => e,
            _ => Map::new(),
        };
        let old = |k: &str| entry.get(k).and_then(Value::as_u64);
        let higher = old("high_water_mb").is_none_or(|o| mb > o);
        let context = context_mb.filter(|c| old("context_mb") != Some(*c));
        if !higher && context.is_none() {
            return Ok(());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if higher {
            entry.insert("high_water_mb".into(), mb.into());
        }
        if let Some(c) = context {
            entry.insert("context_mb".into(), c.into());
        }
        entry.insert("model".into(), self.model.display().to_string().into());
        entry.insert("updated".into(), now.into());
        doc.insert(self.key.clone(), Value::Object(entry));
        self.write(doc)
    }

    /// Writes `doc` atomically (a temporary file renamed over the file).
    fn write(&self, doc: Map<String, Value>) -> Result<(), String> {
        let text = serde_json::to_string_pretty(&Value::Object(doc)).expect("a map serializes");
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, text + "\n")
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }

    /// An exclusive lock on `FILE.lock`, held until the guard is dropped.
    fn lock(&self) -> Result<std::fs::File, String> {
        let mut p = self.path.clone().into_os_string();
        p.push(".lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| format!("cannot open {}: {e}", PathBuf::from(&p).display()))?;
        // SAFETY: flock on an open descriptor we own; released when the file is closed.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) } != 0 {
            return Err(format!(
                "cannot lock {}: {}",
                PathBuf::from(&p).display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(f)
    }

    fn read(&self) -> Result<Option<Map<String, Value>>, String> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", self.path.display())),
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(m)) => Ok(Some(m)),
            Ok(_) => Err(format!(
                "{} is not a JSON object of footprints by model hash",
                self.path.display()
            )),
            Err(e) => Err(format!("{} is not valid JSON: {e}", self.path.display())),
        }
    }
}

fn sha256_file(path: &Path) -> Result<String, String> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| format!("cannot read the model {}: {e}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("cannot read the model {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_the_highest_figure_per_model() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.pt"), dir.path().join("b.pt"));
        std::fs::write(&a, b"model a").unwrap();
        std::fs::write(&b, b"model b").unwrap();
        let path = dir.path().join("footprints.json");
        let fa = FootprintFile::new(&path, &a).unwrap();
        let fb = FootprintFile::new(&path, &b).unwrap();
        assert_eq!(fa.recorded_mb().unwrap(), None);
        fa.record(3000, None).unwrap();
        fa.record(2000, None).unwrap();
        fb.record(700, None).unwrap();
        assert_eq!(fa.recorded_mb().unwrap(), Some(3000));
        assert_eq!(fb.recorded_mb().unwrap(), Some(700));
        fa.record(3500, None).unwrap();
        assert_eq!(fa.recorded_mb().unwrap(), Some(3500));
        // The context profiling measured is kept beside the footprint,
        // through later records of a higher footprint.
        let context = |f: &FootprintFile| f.recorded().unwrap().and_then(|r| r.context_mb);
        assert_eq!(context(&fa), None);
        // A lower footprint with a context keeps the higher footprint, and the context.
        fa.record(3000, Some(610)).unwrap();
        assert_eq!(fa.recorded_mb().unwrap(), Some(3500));
        assert_eq!(context(&fa), Some(610));
        fa.record(3600, None).unwrap();
        assert_eq!(context(&fa), Some(610));
        assert_eq!(context(&fb), None);
        assert_eq!(
            fa.recorded().unwrap(),
            Some(Recorded {
                high_water_mb: 3600,
                context_mb: Some(610)
            })
        );
        // The key is the content's SHA-256: the same bytes elsewhere share the record.
        let c = dir.path().join("c.pt");
        std::fs::write(&c, b"model a").unwrap();
        assert_eq!(
            FootprintFile::new(&path, &c)
                .unwrap()
                .recorded_mb()
                .unwrap(),
            Some(3600)
        );
        std::fs::write(&path, "[1]").unwrap();
        assert!(fa.recorded_mb().unwrap_err().contains("not a JSON object"));
    }
}
