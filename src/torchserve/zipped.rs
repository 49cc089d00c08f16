//! A model archive's zip read with the same hardening as an exported program's records:
//! the entry count is read from the end-of-central-directory record (or its ZIP64 form)
//! before the zip reader sees the file — the reader reserves memory for as many entries as
//! the record declares (up to the file's size: a sparse 4 GiB file could ask for hundreds
//! of GB), so a count over [`MAX_ENTRIES`] is refused first — and the sizes the central
//! directory declares are bounded against the file's own size before anything is inflated (a 1 MB archive can declare a 1 GiB entry),
//! no entry is read past what it declared (a header that lies is caught), and a name that
//! would leave the folder it is unpacked into (`../`, an absolute path) refuses the whole
//! archive.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
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
        let mut file = file;
        let declared = declared_entries(&mut file, meta.len())
            .map_err(|e| format!("cannot read the model archive {shown}: {e}"))?;
        if declared > MAX_ENTRIES as u64 {
            return Err(format!(
                "the model archive {shown} declares {declared} entries in its central directory; at most {MAX_ENTRIES} are read"
            ));
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
        let mut out = Vec::new();
        self.copy(name, max, &mut out)?;
        Ok(out)
    }

    /// Writes the entry `name` into the file `to` (created; never one that exists), in
    /// pieces, held to the size it declares. Returns the bytes written.
    pub fn extract(&mut self, name: &str, to: &Path) -> Result<u64, String> {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)
            .map_err(|e| format!("cannot unpack {name} to {}: {e}", to.display()))?;
        let written = self.copy(name, u64::MAX, &mut out).inspect_err(|_| {
            let _ = std::fs::remove_file(to);
        })?;
        out.flush()
            .map_err(|e| format!("cannot unpack {name} to {}: {e}", to.display()))?;
        Ok(written)
    }

    /// Copies the entry `name` into `out` when it declares at most `max` bytes, never past
    /// what it declares (a header that lies is refused). Returns the bytes copied.
    fn copy(&mut self, name: &str, max: u64, out: &mut impl Write) -> Result<u64, String> {
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
        let copied = std::io::copy(&mut (&mut entry).take(declared + 1), out)
            .map_err(|e| format!("cannot unpack {name} of {shown}: {e}"))?;
        if copied != declared {
            return Err(format!(
                "the model archive {shown}: {name} unpacks to another size than it declares: refused"
            ));
        }
        Ok(copied)
    }
}

/// The classic end-of-central-directory record: its signature and size without a comment.
const EOCD: u32 = 0x0605_4b50;
const EOCD_LEN: u64 = 22;
/// The ZIP64 locator (20 bytes, just before the classic record) and the ZIP64 record.
const LOCATOR: u32 = 0x0706_4b50;
const LOCATOR_LEN: u64 = 20;
const EOCD64: u32 = 0x0606_4b50;
const EOCD64_LEN: usize = 56;

/// The entry count the zip reader will take from the archive, found as it finds it: the
/// last classic end record within the final 64 KiB (its comment's greatest length), and the
/// ZIP64 record when a locator stands where that record's comment length puts it. A ZIP64
/// record that is not where its locator says (the reader would search the file for it) is
/// refused: archivers write it there. 0 when there is no end record (the reader's error
/// then names it).
fn declared_entries(file: &mut File, len: u64) -> Result<u64, String> {
    if len < EOCD_LEN {
        return Ok(0);
    }
    let start = len.saturating_sub(EOCD_LEN + u64::from(u16::MAX));
    let tail = read_at(file, start, (len - start) as usize)?;
    let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let Some(at) = (0..=tail.len() - EOCD_LEN as usize)
        .rev()
        .find(|&i| u32_at(&tail, i) == EOCD)
    else {
        return Ok(0);
    };
    let end = &tail[at..];
    let classic = u64::from(u16_at(end, 8).max(u16_at(end, 10)));
    let comment = u64::from(u16_at(end, 20));
    let Some(locator_at) = len.checked_sub(LOCATOR_LEN + EOCD_LEN + comment) else {
        return Ok(classic);
    };
    let locator = read_at(file, locator_at, LOCATOR_LEN as usize)?;
    if u32_at(&locator, 0) != LOCATOR {
        return Ok(classic);
    }
    let nominal = u64_at(&locator, 8);
    let record = match nominal.checked_add(EOCD64_LEN as u64) {
        Some(e) if e <= len => read_at(file, nominal, EOCD64_LEN)?,
        _ => Vec::new(),
    };
    if record.len() != EOCD64_LEN || u32_at(&record, 0) != EOCD64 {
        return Err(format!(
            "its ZIP64 end record is not at offset {nominal}, where its locator says (an archiver writes it there)"
        ));
    }
    Ok(u64_at(&record, 24).max(u64_at(&record, 32)))
}

/// `n` bytes of `file` from `at`.
fn read_at(file: &mut File, at: u64, n: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0; n];
    file.seek(SeekFrom::Start(at))
        .and_then(|_| file.read_exact(&mut out))
        .map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive of one stored entry of ten bytes whose central directory says `size`.
    fn lying(dir: &Path, size: u32) -> PathBuf {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let stored =
            zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Stored);
        w.start_file("model.pt", stored).unwrap();
        w.write_all(b"0123456789").unwrap();
        let mut bytes = w.finish().unwrap().into_inner();
        let cd = (0..bytes.len() - 4)
            .find(|&i| bytes[i..i + 4] == [0x50, 0x4b, 0x01, 0x02])
            .unwrap();
        bytes[cd + 24..cd + 28].copy_from_slice(&size.to_le_bytes());
        let path = dir.join("x.mar");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn an_entry_is_read_and_unpacked_only_at_the_size_it_declares() {
        let dir = tempfile::tempdir().unwrap();
        let mut z = Zipped::open(&lying(dir.path(), 10)).unwrap();
        assert_eq!(z.read("model.pt", 10).unwrap(), b"0123456789");
        let e = z.read("model.pt", 9).unwrap_err();
        assert!(
            e.ends_with("model.pt is 10 bytes; at most 9 are read"),
            "{e}"
        );
        assert_eq!(z.extract("model.pt", &dir.path().join("m.pt")), Ok(10));
        // A header that says 3 bytes of an entry of 10: refused, nothing left unpacked.
        let mut z = Zipped::open(&lying(dir.path(), 3)).unwrap();
        let e = z.read("model.pt", 100).unwrap_err();
        assert!(
            e.contains("unpacks to another size than it declares"),
            "{e}"
        );
        let to = dir.path().join("lied.pt");
        let e = z.extract("model.pt", &to).unwrap_err();
        assert!(
            e.contains("unpacks to another size than it declares"),
            "{e}"
        );
        assert!(!to.exists());
    }
}
