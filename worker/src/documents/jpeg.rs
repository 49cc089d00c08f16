//! Whether a JPEG's bytes hold its whole image, read before it is decoded: the decoder
//! would fill a cut-short JPEG's missing part with grey and say nothing.

/// Whether a JPEG's bytes hold its whole image: its segments walked from the start-of-image
/// marker (each skipped by its length, so a thumbnail inside an EXIF block is never read as
/// markers), each scan's entropy-coded data read to the marker after it (inside it a `FF`
/// byte is always followed by `00` or a restart marker `D0`–`D7`), up to the end-of-image
/// marker (`FF D9`). What follows that marker — a motion photo's video, padding — is not
/// looked at. Bytes between segments that are not a marker are skipped, as libjpeg does.
pub fn jpeg_complete(b: &[u8]) -> bool {
    if !b.starts_with(&[0xFF, 0xD8]) {
        return false;
    }
    let mut i = 2;
    loop {
        // The next marker: `FF`, any fill `FF`s, then its code.
        let Some(ff) = next_ff(b, i) else {
            return false;
        };
        i = ff;
        while b.get(i) == Some(&0xFF) {
            i += 1;
        }
        let Some(&marker) = b.get(i) else {
            return false;
        };
        i += 1;
        match marker {
            0xD9 => return true,
            // No length: restart markers, TEM, and a stray `FF 00`.
            0xD0..=0xD7 | 0x01 | 0x00 => continue,
            _ => {}
        }
        let Some(&[hi, lo]) = b.get(i..i + 2) else {
            return false;
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len < 2 {
            return false;
        }
        i += len;
        if marker != 0xDA {
            continue;
        }
        // A scan's entropy-coded data: up to a `FF` that starts a marker.
        loop {
            let Some(ff) = next_ff(b, i) else {
                return false;
            };
            i = ff;
            match b.get(i + 1) {
                None => return false,
                Some(0x00 | 0xD0..=0xD7) => i += 2,
                Some(_) => break,
            }
        }
    }
}

/// Where the next `FF` byte is, from `from` on.
fn next_ff(b: &[u8], from: usize) -> Option<usize> {
    let at = b.get(from..)?.iter().position(|&x| x == 0xFF)?;
    Some(from + at)
}
