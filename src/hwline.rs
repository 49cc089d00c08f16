//! hwFetch, the pure parts: parsing the `hwFetch` query parameter and
//! formatting the one-line hardware description. The worker gathers the numbers (NVML, the
//! CUDA allocator, `/proc`); this module only turns them into text, so it is unit-tested here.

use std::fmt;

/// Bytes in one GiB (2^30).
pub const GIB: f64 = (1u64 << 30) as f64;

/// What the answering worker runs on, in bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum HwInfo {
    /// A GPU: `name` as NVML reports it, its total and free memory, this worker's peak use.
    Gpu {
        name: String,
        total: u64,
        available: u64,
        peak_used: u64,
    },
    /// No GPU: the machine's memory (MemTotal, MemAvailable) and the worker's peak RSS (VmHWM).
    Cpu {
        total: u64,
        available: u64,
        peak_used: u64,
    },
}

impl HwInfo {
    /// The hwFetch line, e.g.
    /// `NVIDIA RTX 4090, 23.65 GiB total, 20.00 GiB available, 3.50 GiB peak used`.
    pub fn line(&self) -> String {
        let (name, total, available, peak) = match self {
            HwInfo::Gpu {
                name,
                total,
                available,
                peak_used,
            } => (name.as_str(), *total, *available, *peak_used),
            HwInfo::Cpu {
                total,
                available,
                peak_used,
            } => ("CPU only (no NVIDIA GPU)", *total, *available, *peak_used),
        };
        format!(
            "{name}, {} GiB total, {} GiB available, {} GiB peak used",
            gib(total),
            gib(available),
            gib(peak)
        )
    }
}

impl fmt::Display for HwInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

/// Bytes as GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / GIB)
}

/// The accepted spellings, for error messages.
pub const ACCEPTED: &str = "true, True, 1, yes, a bare `hwFetch` (on) or false, False, 0, no (off)";

/// A `hwFetch` value that is none of the accepted spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("query parameter `hwFetch` has value \"{0}\"; accepted: {ACCEPTED}")]
pub struct BadHwFetch(pub String);

/// Whether a request's query string asks for hwFetch. `query` is the part after `?`
/// (percent-encoding is decoded for the value). The last `hwFetch` occurrence wins.
pub fn wants_hw_fetch(query: Option<&str>) -> Result<bool, BadHwFetch> {
    let mut want = false;
    for pair in query.unwrap_or("").split('&') {
        let (key, value) = match pair.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (pair, None),
        };
        if key != "hwFetch" {
            continue;
        }
        want = match value {
            None => true,
            Some(raw) => {
                let v = percent_decode(raw);
                match v.as_str() {
                    "" | "true" | "True" | "TRUE" | "1" | "yes" | "Yes" => true,
                    "false" | "False" | "FALSE" | "0" | "no" | "No" => false,
                    _ => return Err(BadHwFetch(v)),
                }
            }
        };
    }
    Ok(want)
}

/// Minimal `application/x-www-form-urlencoded` value decoding (`+` and `%XX`); invalid
/// escapes are kept as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// `/proc/meminfo`'s MemTotal and MemAvailable, in bytes.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let total = kb_field(text, "MemTotal:")?;
    let available = kb_field(text, "MemAvailable:")?;
    Some((total, available))
}

/// `/proc/self/status`'s VmHWM (peak resident set size), in bytes.
pub fn parse_vm_hwm(text: &str) -> Option<u64> {
    kb_field(text, "VmHWM:")
}

/// A `Key:   1234 kB` line's value in bytes.
fn kb_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut parts = line[key.len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") | None => Some(n * 1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    #[test]
    fn gpu_line_matches_the_clams_format() {
        let hw = HwInfo::Gpu {
            name: "NVIDIA RTX 4090".into(),
            total: (23.65 * GIB) as u64 + 1,
            available: 20 * GB,
            peak_used: 3 * GB + GB / 2,
        };
        assert_eq!(
            hw.line(),
            "NVIDIA RTX 4090, 23.65 GiB total, 20.00 GiB available, 3.50 GiB peak used"
        );
    }

    #[test]
    fn cpu_line_names_the_cpu_and_rounds_to_two_decimals() {
        let hw = HwInfo::Cpu {
            total: 24_000_000_000,
            available: 0,
            peak_used: 440_000_000,
        };
        assert_eq!(
            hw.to_string(),
            "CPU only (no NVIDIA GPU), 22.35 GiB total, 0.00 GiB available, 0.41 GiB peak used"
        );
    }

    #[test]
    fn gpu_name_is_used_as_is() {
        let hw = HwInfo::Gpu {
            name: "NVIDIA H100 80GB HBM3".into(),
            total: 80 * GB,
            available: 0,
            peak_used: 0,
        };
        assert!(hw
            .line()
            .starts_with("NVIDIA H100 80GB HBM3, 80.00 GiB total"));
    }

    #[test]
    fn hw_fetch_query_values() {
        for q in [
            "hwFetch=true",
            "hwFetch=True",
            "hwFetch=1",
            "hwFetch=yes",
            "hwFetch",
            "a=b&hwFetch",
            "hwFetch=",
            "x=1&hwFetch=tru%65",
        ] {
            assert_eq!(wants_hw_fetch(Some(q)), Ok(true), "{q}");
        }
        for q in [
            "hwFetch=false",
            "hwFetch=0",
            "hwFetch=no",
            "hwFetch=False",
            "",
            "other=1",
        ] {
            assert_eq!(wants_hw_fetch(Some(q)), Ok(false), "{q}");
        }
        assert_eq!(wants_hw_fetch(None), Ok(false));
        // Parameter names are case-sensitive, as in the CLAMS API.
        assert_eq!(wants_hw_fetch(Some("hwfetch=maybe")), Ok(false));
    }

    #[test]
    fn bad_hw_fetch_names_the_parameter_and_the_accepted_values() {
        let e = wants_hw_fetch(Some("hwFetch=maybe")).unwrap_err();
        assert_eq!(e, BadHwFetch("maybe".into()));
        let msg = e.to_string();
        assert!(
            msg.contains("`hwFetch`") && msg.contains("\"maybe\""),
            "{msg}"
        );
        assert!(msg.contains("true") && msg.contains("false"), "{msg}");
        assert!(wants_hw_fetch(Some("hwFetch=2")).is_err());
        assert!(wants_hw_fetch(Some("hwFetch=%zz")).is_err());
    }

    #[test]
    fn proc_files_parse() {
        let meminfo =
            "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(
            parse_meminfo(meminfo),
            Some((24_576_000 * 1024, 20_480_000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        let status = "Name:\tapp-worker\nVmPeak:\t  9000 kB\nVmHWM:\t   431000 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(431_000 * 1024));
        assert_eq!(parse_vm_hwm("Name: x\n"), None);
    }
}
