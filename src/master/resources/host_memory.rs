//! The host memory the server may use, and the kernel's count of OOM kills.
//!
//! **Where the limit comes from**: the memory cgroup this process is in — cgroup v2's
//! `memory.max` (the smallest on the way up to the root of the hierarchy this process
//! sees), or cgroup v1's effective limit (`memory.stat`'s `hierarchical_memory_limit`,
//! else `memory.limit_in_bytes`) — found from `/proc/self/cgroup` and
//! `/proc/self/mountinfo` the way container runtimes lay them out. `--memory-cgroup DIR`
//! (or `VRAMFORK_MEMORY_CGROUP`) names the directory instead: any directory holding a
//! v2 `memory.max` or a v1 `memory.limit_in_bytes` (and whatever else of the files below
//! it has), read as it is, without walking up — for a cgroup the automatic search cannot
//! see, and for tests, which write such files themselves.
//!
//! **What the server may still use** ([`Budget`]): with a limit, the limit less the
//! cgroup's working set now — its charge (`memory.current`, v1 `memory.usage_in_bytes`)
//! less the page cache the kernel takes back first (`inactive_file`, v1
//! `total_inactive_file`), as the kubelet counts a container's working set — and never
//! more than `/proc/meminfo`'s `MemAvailable`; without one, `MemAvailable`.
//!
//! And the cgroup's count of OOM kills ([`Cgroup::oom_kills`]: v2 `memory.events`, v1
//! `memory.oom_control`), which `master::oom` tells an OOM kill by.

use std::path::{Path, PathBuf};

const MB: u64 = 1 << 20;
/// A limit this large is cgroup v1's "no limit" (`PAGE_COUNTER_MAX` pages, rounded).
const NO_LIMIT: u64 = 1 << 60;

/// Which cgroup interface a directory speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// A memory cgroup's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    pub dir: PathBuf,
    pub version: Version,
    /// Named by `--memory-cgroup` (read as it is, no walking up).
    pub given: bool,
    /// Where walking up stops (the hierarchy's mount point); the directory itself when given.
    root: PathBuf,
}

impl Cgroup {
    /// `--memory-cgroup DIR`: the version from the files it holds.
    pub fn given(dir: &Path) -> Result<Cgroup, String> {
        let version = if dir.join("memory.max").is_file() {
            Version::V2
        } else if dir.join("memory.limit_in_bytes").is_file() {
            Version::V1
        } else {
            return Err(format!(
                "{} holds neither memory.max (cgroup v2) nor memory.limit_in_bytes (cgroup v1)",
                dir.display()
            ));
        };
        Ok(Cgroup {
            dir: dir.to_path_buf(),
            version,
            given: true,
            root: dir.to_path_buf(),
        })
    }

    /// `--memory-cgroup` when given (config checked it), else this process's own.
    pub fn of(given: Option<&Path>) -> Option<Cgroup> {
        match given {
            Some(dir) => Cgroup::given(dir).ok(),
            None => Cgroup::find(),
        }
    }

    /// This process's memory cgroup, when the machine has one it can read.
    pub fn find() -> Option<Cgroup> {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        locate(&cgroup, &mountinfo)
    }

    /// What the kernel's files are called here.
    pub fn file(&self, v1: &str, v2: &str) -> PathBuf {
        self.dir.join(match self.version {
            Version::V1 => v1,
            Version::V2 => v2,
        })
    }

    /// The file the limit is read from (for messages).
    pub fn limit_file(&self) -> PathBuf {
        self.file("memory.limit_in_bytes", "memory.max")
    }

    /// The effective limit in bytes; `None`: no limit.
    pub fn limit(&self) -> Option<u64> {
        let own = read_limit(&self.limit_file());
        let effective = match self.version {
            Version::V1 => read(&self.dir.join("memory.stat"))
                .and_then(|s| stat_field(&s, "hierarchical_memory_limit"))
                .or(own),
            Version::V2 => {
                let mut least = own;
                let mut dir = self.dir.as_path();
                while let Some(up) = dir.parent().filter(|_| dir != self.root) {
                    if !up.starts_with(&self.root) {
                        break;
                    }
                    if let Some(l) = read_limit(&up.join("memory.max")) {
                        least = Some(least.map_or(l, |m| m.min(l)));
                    }
                    dir = up;
                }
                least
            }
        };
        effective.filter(|l| *l < NO_LIMIT)
    }

    /// The cgroup's working set in bytes: its charge less its inactive page cache.
    pub fn working_set(&self) -> Option<u64> {
        let usage: u64 = read(&self.file("memory.usage_in_bytes", "memory.current"))?
            .trim()
            .parse()
            .ok()?;
        let key = match self.version {
            Version::V1 => "total_inactive_file",
            Version::V2 => "inactive_file",
        };
        let inactive = read(&self.dir.join("memory.stat"))
            .and_then(|s| stat_field(&s, key))
            .unwrap_or(0);
        Some(usage.saturating_sub(inactive))
    }

    /// The cgroup's count of processes the OOM killer took.
    pub fn oom_kills(&self) -> Option<u64> {
        read(&self.file("memory.oom_control", "memory.events"))
            .and_then(|s| stat_field(&s, "oom_kill"))
    }

    /// `cgroup v1` or `cgroup v2`.
    pub fn version_name(&self) -> &'static str {
        match self.version {
            Version::V1 => "cgroup v1",
            Version::V2 => "cgroup v2",
        }
    }
}

/// This process's memory cgroup from `/proc/self/cgroup` and `/proc/self/mountinfo`: v1's
/// `memory` controller when one is listed, else v2's unified hierarchy when it has the
/// memory controller.
pub fn locate(cgroup: &str, mountinfo: &str) -> Option<Cgroup> {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let m = mounts.iter().find(|m| m.v1_memory)?;
            return m.cgroup(path, Version::V1);
        }
    }
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let m = mounts.iter().find(|m| m.v2)?;
    let found = m.cgroup(path, Version::V2)?;
    let controllers = read(&m.point.join("cgroup.controllers")).unwrap_or_default();
    controllers
        .split_whitespace()
        .any(|c| c == "memory")
        .then_some(found)
}

/// One line of `mountinfo` that is a cgroup hierarchy.
struct Mount {
    /// The directory of the hierarchy mounted (field 4).
    root: String,
    /// Where (field 5).
    point: PathBuf,
    v1_memory: bool,
    v2: bool,
}

impl Mount {
    fn parse(line: &str) -> Option<Mount> {
        let (left, right) = line.split_once(" - ")?;
        let l: Vec<&str> = left.split_whitespace().collect();
        let r: Vec<&str> = right.split_whitespace().collect();
        let (root, point, fstype) = (*l.get(3)?, *l.get(4)?, *r.first()?);
        let options = r.get(2).copied().unwrap_or_default();
        Some(Mount {
            root: root.to_string(),
            point: PathBuf::from(unescape(point)),
            v1_memory: fstype == "cgroup" && options.split(',').any(|o| o == "memory"),
            v2: fstype == "cgroup2",
        })
    }

    /// The directory of `path` (as `/proc/self/cgroup` gives it) in this mount.
    fn cgroup(&self, path: &str, version: Version) -> Option<Cgroup> {
        let rel = path
            .strip_prefix(self.root.as_str())
            .filter(|_| self.root != "/")
            .unwrap_or(path)
            .trim_start_matches('/');
        let dir = self.point.join(rel);
        // Inside a cgroup namespace the path may not be under the mount: the mount is the
        // namespace's root, then.
        let dir = if dir.is_dir() {
            dir
        } else {
            self.point.clone()
        };
        Some(Cgroup {
            dir,
            version,
            given: false,
            root: self.point.clone(),
        })
    }
}

/// `mountinfo` escapes spaces and a few others as `\040`-style octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let n = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// A limit file's value: bytes, or `max` (none).
fn read_limit(p: &Path) -> Option<u64> {
    let text = read(p)?;
    text.trim().parse::<u64>().ok()
}

/// `key value` lines (`memory.stat`, `memory.events`, `memory.oom_control`, `/proc/vmstat`).
pub fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// `/proc/meminfo`'s `MemAvailable`, bytes.
pub fn mem_available() -> Option<u64> {
    let text = read(Path::new("/proc/meminfo"))?;
    crate::hwline::parse_meminfo(&text).map(|(_, available)| available)
}

/// What the server may still use, and where that comes from (MB).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Budget {
    /// What more processes of the server may take now.
    pub room_mb: u64,
    /// The cgroup's limit, when there is one.
    pub limit_mb: Option<u64>,
    /// The cgroup's working set now (with a limit).
    pub in_use_mb: Option<u64>,
    /// `MemAvailable` now.
    pub available_mb: Option<u64>,
    /// In words: `cgroup v1 limit 486 MB (/sys/fs/…/memory.limit_in_bytes), 250 MB in
    /// use` or `MemAvailable`.
    pub source: String,
}

impl Budget {
    /// The budget now (`None`: neither a cgroup limit nor `/proc/meminfo` could be read).
    pub fn now(cgroup: Option<&Cgroup>) -> Option<Budget> {
        let available = mem_available();
        let limited = cgroup.and_then(|c| Some((c, c.limit()?)));
        Budget::from_figures(limited.map(|(c, l)| (c, l, c.working_set())), available)
    }

    /// The budget from the figures read (pure).
    pub fn from_figures(
        limited: Option<(&Cgroup, u64, Option<u64>)>,
        available: Option<u64>,
    ) -> Option<Budget> {
        let available_mb = available.map(|a| a / MB);
        match limited {
            Some((c, limit, in_use)) => {
                let in_use = in_use.unwrap_or(0);
                let cgroup_room = limit.saturating_sub(in_use) / MB;
                let room_mb = available_mb.map_or(cgroup_room, |a| a.min(cgroup_room));
                let host = if available_mb.is_some_and(|a| a < cgroup_room) {
                    format!(", capped by MemAvailable {} MB", available_mb.unwrap_or(0))
                } else {
                    String::new()
                };
                Some(Budget {
                    room_mb,
                    limit_mb: Some(limit / MB),
                    in_use_mb: Some(in_use / MB),
                    available_mb,
                    source: format!(
                        "{} limit {} MB ({}), {} MB in use{host}",
                        c.version_name(),
                        limit / MB,
                        c.limit_file().display(),
                        in_use / MB
                    ),
                })
            }
            None => Some(Budget {
                room_mb: available_mb?,
                limit_mb: None,
                in_use_mb: None,
                available_mb,
                source: "MemAvailable (/proc/meminfo), no cgroup memory limit".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS_V1: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_memory_cgroup_is_v1s_memory_controller_when_one_is_listed() {
        let cg = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n";
        let c = locate(cg, MOUNTS_V1).unwrap();
        assert_eq!(c.version, Version::V1);
        // Not a directory on the machine running the test: the mount point stands in.
        assert!(c.dir.starts_with("/sys/fs/cgroup/memory"), "{c:?}");
        assert_eq!(
            c.limit_file(),
            c.dir.join("memory.limit_in_bytes"),
            "v1 reads its own file"
        );
        // v2 only (no v1 memory line): the unified mount, when it has the controller.
        let m =
            Mount::parse("41 31 0:38 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw").unwrap();
        assert!(m.v2 && !m.v1_memory);
        let c = m.cgroup("/kubepods/pod1/c1", Version::V2).unwrap();
        assert_eq!(c.root, PathBuf::from("/sys/fs/cgroup"));
        assert!(Mount::parse("garbage").is_none());
        assert_eq!(unescape(r"/a\040b"), "/a b");
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(d.path().join(name), text).unwrap();
        }
        d
    }

    #[test]
    fn a_given_directory_is_read_as_it_is_v2_or_v1() {
        let v2 = dir_with(&[
            ("memory.max", "536870912\n"),
            ("memory.current", "209715200\n"),
            (
                "memory.stat",
                "anon 100\nfile 200\ninactive_file 52428800\n",
            ),
            ("memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n"),
        ]);
        let c = Cgroup::given(v2.path()).unwrap();
        assert_eq!(c.version, Version::V2);
        assert_eq!(c.limit(), Some(512 * MB));
        assert_eq!(c.working_set(), Some(150 * MB));
        assert_eq!(c.oom_kills(), Some(2));
        let b =
            Budget::from_figures(Some((&c, 512 * MB, Some(150 * MB))), Some(4096 * MB)).unwrap();
        assert_eq!(b.room_mb, 362);
        assert!(
            b.source.starts_with("cgroup v2 limit 512 MB ("),
            "{}",
            b.source
        );
        // MemAvailable below the cgroup's room caps it.
        let b = Budget::from_figures(Some((&c, 512 * MB, Some(0))), Some(100 * MB)).unwrap();
        assert_eq!(b.room_mb, 100);
        assert!(
            b.source.ends_with("capped by MemAvailable 100 MB"),
            "{}",
            b.source
        );
        // "max": no limit.
        std::fs::write(v2.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(c.limit(), None);

        let v1 = dir_with(&[
            ("memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory.usage_in_bytes", "104857600\n"),
            (
                "memory.stat",
                "cache 0\nhierarchical_memory_limit 509607936\ntotal_inactive_file 4194304\n",
            ),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
            ),
        ]);
        let c = Cgroup::given(v1.path()).unwrap();
        assert_eq!(c.version, Version::V1);
        // The effective (hierarchical) limit, below its own "unlimited".
        assert_eq!(c.limit(), Some(486 * MB));
        assert_eq!(c.working_set(), Some(96 * MB));
        assert_eq!(c.oom_kills(), Some(5));
        assert!(Cgroup::given(Path::new("/nonexistent")).is_err());
        // No limit: MemAvailable.
        let b = Budget::from_figures(None, Some(2048 * MB)).unwrap();
        assert_eq!((b.room_mb, b.limit_mb), (2048, None));
    }
}
