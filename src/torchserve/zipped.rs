//! A model archive's zip read with the same hardening as an exported program's records:
//! the entry count and the sizes the central directory declares are bounded against the
//! file's own size before anything is inflated (a 1 MB archive can declare a 1 GiB entry),
//! no entry is read past what it declared (a header that lies is caught), and a name that
//! would leave the folder it is unpacked into (`../`, an absolute path) refuses the whole
//! archive.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use zip::ZipArchive;

/// More entries than this is no archive TorchServe's archiver wrote.
pub const MAX_ENTRIES: usize = 50_000;
/// What the entries may unpack to in all: this many times the file's size, plus
/// [`SIZE_FLOOR`] (the bound exported programs are held to).
pub const SIZE_RATIO: u64 = 16;
pub const SIZE_FLOOR: u64 = 64 << 20;

/// An archive opened and its central directory checked.
pub struct Zipped {
    path: PathBuf,
    zip: ZipArchive<File>,
}

impl Zipped {
    /// Opens `path` (a regular file only: a FIFO would make the start wait) and checks its
    /// entries' names, count and declared sizes.
    pub fn open(path: &Path) -> Result<Zipped, String> {
        let shown = path.display();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| format!("cannot open the model archive {shown}: {e}"))?;
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot open the model archive {shown}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("the model archive {shown} is not a regular file"));
        }
        let zip = ZipArchive::new(file).map_err(|e| {
            format!("the model archive {shown} is not a zip file (a TorchServe .mar is one): {e}")
        })?;
        let mut z = Zipped {
            path: path.to_path_buf(),
            zip,
        };
        z.check(meta.len())?;
        Ok(z)
    }

    fn check(&mut self, file_size: u64) -> Result<(), String> {
        let shown = self.path.display().to_string();
        let n = self.zip.len();
        if n > MAX_ENTRIES {
            return Err(format!(
                "the model archive {shown} has {n} entries; at most {MAX_ENTRIES} are read"
            ));
        }
        let bound = file_size
            .saturating_mul(SIZE_RATIO)
            .saturating_add(SIZE_FLOOR);
        let mut total = 0u64;
        for i in 0..n {
            let entry = self
                .zip
                .by_index_raw(i)
                .map_err(|e| format!("the model archive {shown}: entry {i}: {e}"))?;
            if entry.enclosed_name().is_none() {
                return Err(format!(
                    "the model archive {shown} has an entry named {:?}, which would be unpacked outside its folder: refused",
                    entry.name()
                ));
            }
            total = total.saturating_add(entry.size());
        }
        if total > bound {
            return Err(format!(
                "the model archive {shown} declares {total} bytes unpacked, more than {SIZE_RATIO} times its own size ({file_size} bytes) allows: refused as a zip bomb"
            ));
        }
        Ok(())
    }

    /// Whether an entry of this name is in the archive.
    pub fn has(&self, name: &str) -> bool {
        self.zip.file_names().any(|n| n == name)
    }

    /// The entry `name` whole, when it declares at most `max` bytes.
    pub fn read(&mut self, name: &str, max: u64) -> Result<Vec<u8>, String> {
        let shown = self.path.display().to_string();
        let mut entry = self
            .zip
            .by_name(name)
            .map_err(|e| format!("the model archive {shown}: {name}: {e}"))?;
        let declared = entry.size();
        if declared > max {
            return Err(format!(
                "the model archive {shown}: {name} is {declared} bytes; at most {max} are read"
            ));
        }
        let mut out = Vec::with_capacity(declared as usize);
        (&mut entry)
            .take(declared + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("the model archive {shown}: {name}: {e}"))?;
        if out.len() as u64 != declared {
            return Err(format!(
                "the model archive {shown}: {name} unpacks to another size than it declares: refused"
            ));
        }
        Ok(out)
    }

    /// Writes the entry `name` into the file `to` (created; never one that exists), in
    /// pieces, held to the size it declares. Returns the bytes written.
    pub fn extract(&mut self, name: &str, to: &Path) -> Result<u64, String> {
        let shown = self.path.display().to_string();
        let mut entry = self
            .zip
            .by_name(name)
            .map_err(|e| format!("the model archive {shown}: {name}: {e}"))?;
        let declared = entry.size();
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)
            .map_err(|e| format!("cannot unpack {name} to {}: {e}", to.display()))?;
        let written = std::io::copy(&mut (&mut entry).take(declared + 1), &mut out)
            .map_err(|e| format!("cannot unpack {name} of {shown}: {e}"))?;
        if written != declared {
            let _ = std::fs::remove_file(to);
            return Err(format!(
                "the model archive {shown}: {name} unpacks to another size than it declares: refused"
            ));
        }
        out.flush()
            .map_err(|e| format!("cannot unpack {name} to {}: {e}", to.display()))?;
        Ok(written)
    }
}
