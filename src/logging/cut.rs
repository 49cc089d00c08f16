//! The line-size rule: a line is at most [`PIPE_BUF`] bytes (4,096), the most a pipe takes in
//! one atomic write, so that lines from several processes sharing stderr never mix. A longer
//! line is shortened, never split: in a JSON line its longest strings (a long request path,
//! a long message) are cut to one length, the longest that makes the line fit, each keeping
//! its start and marked `[...N-bytes-cut]`, so that the line stays one valid JSON object;
//! any other line (text, or JSON too long without its strings) loses its end, marked the
//! same way. (A text access line has its request target cut instead: `access_log.rs`.)

/// The size up to which a write to a pipe is atomic (POSIX: at least 512; Linux: 4096).
pub const PIPE_BUF: usize = 4096;

/// Makes `line` end with one newline and fit in [`PIPE_BUF`] bytes.
pub fn fit(line: &mut Vec<u8>) {
    if line.last() != Some(&b'\n') {
        line.push(b'\n');
    }
    if line.len() <= PIPE_BUF {
        return;
    }
    if line.first() == Some(&b'{') {
        let mut json = line.clone();
        if shorten_json(&mut json) && serde_json::from_slice::<serde::de::IgnoredAny>(&json).is_ok()
        {
            *line = json;
            return;
        }
    }
    shorten_text(line);
}

/// What marks a cut: `[...N-bytes-cut]` (no space, so that a text line's fields stay
/// apart).
pub fn marker(cut: usize) -> String {
    format!("[...{cut}-bytes-cut]")
}

/// Cuts the end of a text line (at a character boundary) to fit, with the marker.
fn shorten_text(line: &mut Vec<u8>) {
    let total = line.len() - 1;
    // The marker's own length depends on the figure; the figure is at most `total`.
    let room = PIPE_BUF - 1 - 1 - marker(total).len();
    let mut keep = room;
    while keep > 0 && (line[keep] & 0xC0) == 0x80 {
        keep -= 1;
    }
    let tail = format!(" {}\n", marker(total - keep));
    line.truncate(keep);
    line.extend_from_slice(tail.as_bytes());
}

/// Caps every string of `line` (ending in `\n`) at the same length, the largest that makes
/// it fit, each cut string keeping its start and the marker; false when no cap does.
fn shorten_json(line: &mut Vec<u8>) -> bool {
    let spans = strings(line);
    // The line's size with every string capped at `cap` bytes, and the cuts that makes.
    let cuts = |cap: usize| -> (usize, Vec<(usize, usize, String)>) {
        let mut size = line.len();
        let mut cuts = Vec::new();
        for &(start, end) in &spans {
            let keep = boundary(&line[start..end], cap);
            let mark = marker(end - start - keep);
            if keep + mark.len() < end - start {
                size -= end - start - keep - mark.len();
                cuts.push((start + keep, end, mark));
            }
        }
        (size, cuts)
    };
    if cuts(0).0 > PIPE_BUF {
        return false;
    }
    let (mut fits, mut over) = (0, spans.iter().map(|(s, e)| e - s).max().unwrap_or(0));
    while fits + 1 < over {
        let mid = (fits + over) / 2;
        if cuts(mid).0 <= PIPE_BUF {
            fits = mid;
        } else {
            over = mid;
        }
    }
    for (from, to, mark) in cuts(fits).1.into_iter().rev() {
        line.splice(from..to, mark.into_bytes());
    }
    line.len() <= PIPE_BUF
}

/// The contents (between the quotes) of every string in a JSON text.
fn strings(json: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < json.len() {
        if json[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut j = start;
        while j < json.len() && json[j] != b'"' {
            j += if json[j] == b'\\' { 2 } else { 1 };
        }
        let end = j.min(json.len());
        out.push((start, end));
        i = end + 1;
    }
    out
}

/// The largest length ≤ `target` at which a JSON string's contents can be cut: not inside
/// an escape (`\n`, `\"`, `\u00e9`) nor inside a UTF-8 character.
fn boundary(s: &[u8], target: usize) -> usize {
    let mut at = 0;
    let mut i = 0;
    while i < s.len() {
        let step = match s[i] {
            b'\\' if s.get(i + 1) == Some(&b'u') => 6,
            b'\\' => 2,
            b if b < 0x80 => 1,
            b if b >= 0xF0 => 4,
            b if b >= 0xE0 => 3,
            _ => 2,
        };
        if i + step > target {
            break;
        }
        i += step;
        at = i;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fitted(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        fit(&mut v);
        assert!(v.len() <= PIPE_BUF, "{} bytes", v.len());
        assert_eq!(v.iter().filter(|b| **b == b'\n').count(), 1);
        String::from_utf8(v).expect("still UTF-8")
    }

    #[test]
    fn short_lines_are_left_whole_with_one_newline() {
        assert_eq!(fitted("hello"), "hello\n");
        assert_eq!(fitted("hello\n"), "hello\n");
        let exact = "x".repeat(PIPE_BUF - 1);
        assert_eq!(fitted(&exact).len(), PIPE_BUF);
    }

    #[test]
    fn a_long_json_line_stays_one_valid_object_keeping_the_start_of_its_longest_strings() {
        let path = format!("/nowhere/{}", "é\\\"\n".repeat(3000));
        let json = serde_json::json!({
            "timestamp": "2026-11-23T21:50:00.123456Z",
            "fields": {"message": "access", "path": path, "note": "ü".repeat(2000)},
            "target": "vramfork::access",
        });
        let text = serde_json::to_string(&json).unwrap();
        assert!(text.len() > 3 * PIPE_BUF);
        let out = fitted(&text);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        // Both long strings keep their start, about as much of each.
        let kept = v["fields"]["path"].as_str().unwrap();
        assert!(kept.starts_with("/nowhere/é\\\"\n"), "{kept:.40}");
        assert!(kept.ends_with("-bytes-cut]"), "{kept}");
        let note = v["fields"]["note"].as_str().unwrap();
        assert!(
            note.starts_with("üü") && note.ends_with("-bytes-cut]"),
            "{note}"
        );
        assert!(
            kept.len() > 1000 && note.len() > 1000,
            "{} {}",
            kept.len(),
            note.len()
        );
        assert_eq!(v["fields"]["message"], "access");
        assert_eq!(v["target"], "vramfork::access");
        // Every cut leaves the line valid, whatever the length.
        for n in (PIPE_BUF - 50..PIPE_BUF + 300).step_by(7) {
            let s = serde_json::to_string(
                &serde_json::json!({"a": "\\\u{1F600}é".repeat(n / 8), "b": 1}),
            )
            .unwrap();
            let out = fitted(&s);
            serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
    }

    #[test]
    fn a_long_text_line_loses_its_end_at_a_character() {
        let line = format!("2026 WARN {}", "é".repeat(5000));
        let out = fitted(&line);
        assert!(out.starts_with("2026 WARN éé"));
        assert!(
            out.ends_with("-bytes-cut]\n"),
            "{:?}",
            &out[out.len() - 40..]
        );
    }

    #[test]
    fn json_that_strings_cannot_shorten_enough_is_cut_as_text() {
        let numbers: Vec<u32> = (0..2000).collect();
        let out = fitted(&serde_json::to_string(&serde_json::json!({ "n": numbers })).unwrap());
        assert!(out.ends_with("-bytes-cut]\n"));
    }
}
