//! A `.pt2` file's records, read with libtorch's own archive reader (through
//! `worker/shim/export.cpp`), opened once per look at the file ([`Archive`]: its construction reads
//! the zip's central directory, so one per record made a package of many records quadratic to
//! load), their declared sizes and count bounded against the file's before any record is read (a 1
//! MB file can declare a 1 GiB record), and what they say it is: an ExportedProgram archive
//! (`torch.export.save`: the program as `models/<name>.json`, its weights under `data/`), or an
//! AOTInductor package (`torch._inductor.aoti_compile_and_package`: compiled code under
//! `data/aotinductor/`).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn vf_archive_open(path: *const c_char, out: *mut *mut c_void) -> c_int;
        pub fn vf_archive_close(archive: *mut c_void);
        pub fn vf_archive_records(
            archive: *mut c_void,
            max_records: usize,
            out: *mut *mut c_char,
            len: *mut usize,
        ) -> c_int;
        pub fn vf_archive_read(
            archive: *mut c_void,
            record: *const c_char,
            dst: *mut c_void,
            n: usize,
        ) -> c_int;
        pub fn vf_archive_extract(
            archive: *mut c_void,
            record: *const c_char,
            n: usize,
            chunk: usize,
            fd: c_int,
        ) -> c_int;
        pub fn vf_export_free_bytes(bytes: *mut c_void);
    }
}

/// More records than this is no model torch wrote: refused before any is read (each record
/// unpacked is a file, and a reader's work grows with the count).
pub const MAX_RECORDS: usize = 50_000;

/// What the records of an archive may unpack to in all: this many times the file's own size
/// (torch writes its archives' records stored, uncompressed: theirs add up to less than the
/// file; a deflated repack of text and weights stays well under this ratio), plus
/// [`SIZE_FLOOR`] for small files.
pub const SIZE_RATIO: u64 = 16;
pub const SIZE_FLOOR: u64 = 64 << 20;

/// Unpacked files are written in pieces of this size, never held whole.
const CHUNK: usize = 1 << 20;

/// Archive readers this process has opened (each reads the zip's central directory).
static OPENED: AtomicUsize = AtomicUsize::new(0);

/// How many archive readers this process has opened so far.
pub fn opened() -> usize {
    OPENED.load(Ordering::Relaxed)
}

/// One record: its name (without the archive's top folder) and the size it unpacks to, as
/// the archive's central directory declares it (what the reader is held to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub size: u64,
}

/// An archive opened once, for every look at it: its records listed and sized from the
/// central directory, the sizes checked against the file's before anything is read.
pub struct Archive {
    handle: NonNull<c_void>,
    records: Vec<Record>,
    /// Each record's place in `records`, by name.
    index: HashMap<String, usize>,
    /// What one record read whole into memory may take.
    in_memory: u64,
}

// SAFETY: the reader is owned by this value alone; PyTorchStreamReader serialises its reads
// with its own mutex, and the worker uses an archive from one thread at a time anyway.
unsafe impl Send for Archive {}

impl Archive {
    /// Opens the archive at `path`, lists its records and checks their count and declared
    /// sizes (see [`check_sizes`]).
    pub fn open(path: &str) -> Result<Archive, String> {
        let file_size = std::fs::metadata(path)
            .map_err(|e| format!("{path}: {e}"))?
            .len();
        let p = c_path(path)?;
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is NUL-terminated and alive for the call; `out` is a valid
        // out-pointer; the shim catches every C++ exception.
        let rc = unsafe { ffi::vf_archive_open(p.as_ptr(), &mut out) };
        let handle = match NonNull::new(out) {
            Some(h) if rc == 0 => h,
            _ => return Err(super::last_error()),
        };
        OPENED.fetch_add(1, Ordering::Relaxed);
        let mut archive = Archive {
            handle,
            records: Vec::new(),
            index: HashMap::new(),
            in_memory: 0,
        };
        let text = call(|out, len| {
            // SAFETY: a live reader; valid out-pointers; the shim catches every C++ exception.
            Ok(unsafe { ffi::vf_archive_records(handle.as_ptr(), MAX_RECORDS, out, len) })
        })?;
        archive.records = parse_records(&String::from_utf8_lossy(&text))?;
        archive.index = (archive.records.iter().enumerate())
            .map(|(i, r)| (r.name.clone(), i))
            .collect();
        let bound = size_bound(file_size);
        check_sizes(&archive.records, file_size, bound)?;
        archive.in_memory = bound.min(host_room());
        Ok(archive)
    }

    /// The record names.
    pub fn names(&self) -> Vec<String> {
        self.records.iter().map(|r| r.name.clone()).collect()
    }

    fn record(&self, name: &str) -> Result<&Record, String> {
        self.index
            .get(name)
            .map(|&i| &self.records[i])
            .ok_or_else(|| format!("the archive has no record {name}"))
    }

    /// One record, whole, into memory: refused, naming it, when its declared size is more
    /// than one record may take there (the archive's bound, or a quarter of the memory the
    /// host has available).
    pub fn read(&self, name: &str) -> Result<Vec<u8>, String> {
        let size = self.record(name)?.size;
        if size > self.in_memory {
            return Err(format!(
                "its record {name} unpacks to {size} bytes, more than the {} bytes a record read into memory may take: refused before reading it (a zip bomb, or a file torch did not write)",
                self.in_memory
            ));
        }
        let n = usize::try_from(size).map_err(|_| format!("record {name}: too large"))?;
        let mut buf = vec![0u8; n];
        let r = CString::new(name).map_err(|_| "a record name with a NUL byte".to_string())?;
        // SAFETY: a live reader; `r` is NUL-terminated; `buf` is valid for `n` bytes; the
        // shim writes at most `n` bytes and catches every C++ exception.
        let rc = unsafe {
            ffi::vf_archive_read(self.handle.as_ptr(), r.as_ptr(), buf.as_mut_ptr().cast(), n)
        };
        if rc != 0 {
            return Err(super::last_error());
        }
        Ok(buf)
    }

    /// Writes one record to a new file `to` (created here, never an existing one or through
    /// a symbolic link, readable by this user alone), in pieces; returns its size.
    pub fn extract(&self, name: &str, to: &Path) -> Result<u64, String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let size = self.record(name)?.size;
        let n = usize::try_from(size).map_err(|_| format!("record {name}: too large"))?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(to)
            .map_err(|e| format!("cannot unpack {name} into {}: {e}", to.display()))?;
        let r = CString::new(name).map_err(|_| "a record name with a NUL byte".to_string())?;
        // SAFETY: a live reader; `r` is NUL-terminated; `file` stays open for the call; the
        // shim writes to the descriptor only and catches every C++ exception.
        let rc = unsafe {
            ffi::vf_archive_extract(self.handle.as_ptr(), r.as_ptr(), n, CHUNK, file.as_raw_fd())
        };
        if rc != 0 {
            return Err(format!("cannot unpack {name}: {}", super::last_error()));
        }
        Ok(size)
    }

    /// What the archive is, from its records.
    pub fn kind(&self) -> Result<Kind, String> {
        kind_of(&self.names())
    }
}

impl Drop for Archive {
    fn drop(&mut self) {
        // SAFETY: the handle came from vf_archive_open and is closed once, here.
        unsafe { ffi::vf_archive_close(self.handle.as_ptr()) };
    }
}

/// The records' sizes may add up to this for a file of `file_size` bytes.
pub fn size_bound(file_size: u64) -> u64 {
    file_size
        .saturating_mul(SIZE_RATIO)
        .saturating_add(SIZE_FLOOR)
}

/// `size<TAB>name` lines (or the count alone, past [`MAX_RECORDS`]) as records.
fn parse_records(text: &str) -> Result<Vec<Record>, String> {
    let mut lines = text.lines().peekable();
    if let Some(first) = lines.peek() {
        if !first.contains('\t') {
            return Err(format!(
                "the archive holds {first} records, more than the {MAX_RECORDS} a model file may hold: refused before reading any (not an archive torch wrote for one model)"
            ));
        }
    }
    lines
        .map(|l| {
            let (size, name) = l.split_once('\t').ok_or("an unreadable record list")?;
            let size = size.parse().map_err(|_| "an unreadable record size")?;
            Ok(Record {
                name: name.to_string(),
                size,
            })
        })
        .collect()
}

/// The records' declared sizes against `bound` (what a file of `file_size` bytes may
/// unpack to): the first record past it alone is named, else the total past it with the
/// largest record.
pub fn check_sizes(records: &[Record], file_size: u64, bound: u64) -> Result<(), String> {
    let how = format!(
        "the {bound} bytes a {file_size}-byte file may unpack to ({SIZE_RATIO} times its size, plus {} MiB): refused before reading it (a zip bomb, or a file torch did not write)",
        SIZE_FLOOR >> 20
    );
    if let Some(r) = records.iter().find(|r| r.size > bound) {
        return Err(format!(
            "its record {} unpacks to {} bytes, more than {how}",
            r.name, r.size
        ));
    }
    let total: u64 = records.iter().map(|r| r.size).fold(0, u64::saturating_add);
    if total > bound {
        let largest = records.iter().max_by_key(|r| r.size).expect("records");
        return Err(format!(
            "its {} records unpack to {total} bytes in all (the largest, {}, to {}), more than {how}",
            records.len(),
            largest.name,
            largest.size
        ));
    }
    Ok(())
}

/// A quarter of the memory the host has available now (`MemAvailable`), or no bound when
/// it cannot be read.
fn host_room() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return u64::MAX;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(u64::MAX, |kb| kb.saturating_mul(1024) / 4)
}

/// What a `.pt2` file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A `torch.export.save` archive; its one program is `models/<name>.json`.
    Program { name: String },
    /// An AOTInductor package (compiled code: `aoti.rs`).
    Aoti,
}

/// What the archive at `path` is, from its records; an error for a file that is neither.
pub fn kind(path: &str) -> Result<Kind, String> {
    Archive::open(path)?.kind()
}

fn kind_of(names: &[String]) -> Result<Kind, String> {
    if names.iter().any(|n| n.starts_with("data/aotinductor/")) {
        return Ok(Kind::Aoti);
    }
    let programs: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix("models/")?.strip_suffix(".json"))
        .filter(|n| !n.contains('/'))
        .collect();
    match programs[..] {
        [name] => Ok(Kind::Program { name: name.into() }),
        [] => Err(
            "a zip archive, but neither a torch.export program (no models/<name>.json) nor an AOTInductor package (no data/aotinductor/): save the model with torch.export.save(torch.export.export(model, example_inputs), path)"
                .into(),
        ),
        _ => Err(format!(
            "the archive holds {} programs ({}); vramfork serves one: save one ExportedProgram per file",
            programs.len(),
            programs.join(", ")
        )),
    }
}

fn c_path(path: &str) -> Result<CString, String> {
    CString::new(path).map_err(|_| "a path with a NUL byte".to_string())
}

/// Calls a shim function that hands back a malloc'ed buffer, and copies it out.
fn call(
    f: impl FnOnce(*mut *mut c_char, *mut usize) -> Result<c_int, String>,
) -> Result<Vec<u8>, String> {
    let mut out: *mut c_char = std::ptr::null_mut();
    let mut len = 0usize;
    let rc = f(&mut out, &mut len)?;
    if rc != 0 {
        return Err(super::last_error());
    }
    // SAFETY: on success the shim set `out` to a malloc'ed buffer of `len` bytes (plus a NUL).
    let bytes = unsafe { std::slice::from_raw_parts(out.cast::<u8>(), len) }.to_vec();
    // SAFETY: `out` came from the shim's malloc and is freed once, here.
    unsafe { ffi::vf_export_free_bytes(out.cast::<c_void>()) };
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Sizes come from the central directory, and a record is read, or unpacked, whole,
    /// through the one reader the archive holds.
    #[test]
    fn one_reader_lists_sizes_reads_and_unpacks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.pt2");
        super::super::testzip::write(
            &path,
            "top",
            &[("models/m.json", b"{}"), ("data/x.bin", &[7u8; 3000])],
        );
        let before = opened();
        let a = Archive::open(path.to_str().unwrap()).unwrap();
        assert_eq!(a.record("data/x.bin").unwrap().size, 3000);
        assert_eq!(a.read("models/m.json").unwrap(), b"{}");
        let to = dir.path().join("x.bin");
        assert_eq!(a.extract("data/x.bin", &to), Ok(3000));
        assert_eq!(std::fs::read(&to).unwrap(), vec![7u8; 3000]);
        let again = a.extract("data/x.bin", &to).unwrap_err();
        assert!(
            again.contains("File exists"),
            "never over an existing file: {again}"
        );
        assert_eq!(a.kind(), Ok(Kind::Program { name: "m".into() }));
        assert_eq!(opened() - before, 1);
    }

    /// Declared sizes past what the file may unpack to are refused before anything is
    /// read, naming the record (or the total and the largest), and past the count of
    /// records a model file may hold, naming the count.
    #[test]
    fn sizes_and_counts_past_the_bounds_are_refused_naming_them() {
        let r = |name: &str, size: u64| Record {
            name: name.into(),
            size,
        };
        let bound = size_bound(1 << 20);
        assert_eq!(bound, (16 << 20) + (64 << 20));
        let bomb = [r("models/model.json", 1 << 30), r("version", 2)];
        let e = check_sizes(&bomb, 1 << 20, bound).unwrap_err();
        assert!(
            e.starts_with("its record models/model.json unpacks to 1073741824 bytes, more than the 83886080 bytes a 1048576-byte file may unpack to"),
            "{e}"
        );
        let many = vec![r("data/w", 60 << 20); 2];
        let e = check_sizes(&many, 1 << 20, bound).unwrap_err();
        assert!(
            e.contains("its 2 records unpack to 125829120 bytes in all (the largest, data/w"),
            "{e}"
        );
        assert_eq!(
            check_sizes(&[r("data/w", 80 << 20)], 1 << 20, bound),
            Ok(())
        );
        let e = parse_records("50001\n").unwrap_err();
        assert!(
            e.contains("holds 50001 records, more than the 50000 a model file may hold"),
            "{e}"
        );
        assert_eq!(parse_records("2\tversion\n"), Ok(vec![r("version", 2)]));
    }

    #[test]
    fn an_archive_is_told_by_its_records() {
        let program = names(&[
            "data/weights/weight_0",
            "models/model.json",
            "archive_format",
        ]);
        assert_eq!(
            kind_of(&program),
            Ok(Kind::Program {
                name: "model".into()
            })
        );
        let aoti = names(&["data/aotinductor/model/x.wrapper.so", "archive_format"]);
        assert_eq!(kind_of(&aoti), Ok(Kind::Aoti));
        let neither = kind_of(&names(&["data.pkl", "code/__torch__.py"])).unwrap_err();
        assert!(neither.contains("torch.export.save"), "{neither}");
        let two = kind_of(&names(&["models/a.json", "models/b.json"])).unwrap_err();
        assert!(two.contains("holds 2 programs (a, b)"), "{two}");
    }
}
