//! Test support: a minimal zip writer (stored records, no compression) for archives in the
//! layout torch's reader opens (one top folder, a `.data/version` record), so that the
//! package checks and the unpack can be tested on files made here, without torch's Python.

use std::path::Path;

/// CRC-32 (IEEE), bit by bit: the zip's checksum of each record.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Writes a zip at `path` of `records` (names under the top folder `top/`) and the version
/// record torch's reader requires.
pub fn write(path: &Path, top: &str, records: &[(&str, &[u8])]) {
    let mut all: Vec<(String, &[u8])> = vec![(format!("{top}/.data/version"), b"3\n")];
    all.extend(records.iter().map(|(n, d)| (format!("{top}/{n}"), *d)));
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in &all {
        let offset = out.len() as u32;
        let (crc, size, len) = (crc32(data), data.len() as u32, name.len() as u16);
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        for v in [20u16, 0, 0, 0, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [crc, size, size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        for v in [20u16, 20, 0, 0, 0, 0] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        for v in [crc, size, size] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        for v in [len, 0, 0, 0, 0] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        central.extend_from_slice(&0u32.to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let (start, n) = (out.len() as u32, all.len() as u16);
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    for v in [0u16, 0, n, n] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    std::fs::write(path, out).unwrap();
}

#[test]
fn crc32_is_the_zip_checksum() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
}
