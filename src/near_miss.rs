//! Misspelt field names in the app metadata. A field vramfork does not read
//! is kept as written (CLAMS metadata carries many), so one misspelt by a letter or two —
//! `est_gpu_mem_type`, `inputs[0].tokeniser`, `outputs[0].label` — would be ignored in
//! silence and the field it was meant to be would take its default. One rule, used at every
//! level of the metadata (the top level, `input`, each `inputs[]` and `outputs[]` entry, and
//! the `tokenizer`, `image` and `labels` blocks): a key that is not a field of its level but
//! is within [`limit`] edits of one (ignoring case; a swap of two neighbouring letters is one
//! edit) is refused, naming its path and the field it resembles.

use serde_json::{Map, Value};

/// The edits a key may be from `known` to count as a misspelling of it: none but case for
/// names under 4 letters, one for names under 8, two for longer ones.
fn limit(known: &str) -> usize {
    match known.len() {
        0..=3 => 0,
        4..=7 => 1,
        _ => 2,
    }
}

/// The field of `known` that `key` is a likely misspelling of; `None` when `key` is a field
/// of `known` or of `foreign` (fields other apps' metadata carries on purpose, such as
/// CLAMS's `output`), or is not close to any.
pub fn near_miss<'k>(key: &str, known: &[&'k str], foreign: &[&str]) -> Option<&'k str> {
    if known.contains(&key) || foreign.contains(&key) {
        return None;
    }
    let lower = key.to_ascii_lowercase();
    known
        .iter()
        .copied()
        .find(|k| lower == *k || (key.len() >= 4 && edit_distance(&lower, k) <= limit(k)))
}

/// Refuses the first key of `o` (the object at `at`: `""` for the top level, else a path such
/// as `inputs[0]`) that is a near miss of one of `known`, with a message naming both paths.
pub fn check(
    at: &str,
    o: &Map<String, Value>,
    known: &[&str],
    foreign: &[&str],
) -> Result<(), String> {
    match o
        .keys()
        .find_map(|key| near_miss(key, known, foreign).map(|k| (key, k)))
    {
        Some((key, k)) => Err(refusal(at, key, k)),
        None => Ok(()),
    }
}

/// The refusal of `key` at `at`, a near miss of the field `known`.
pub fn refusal(at: &str, key: &str, known: &str) -> String {
    let path = |name: &str| match at {
        "" => name.to_string(),
        at => format!("{at}.{name}"),
    };
    format!(
        "field `{}` is so close to `{}` that it looks like a typo of it (did you mean `{known}`?); rename it to `{known}`: vramfork does not read `{key}`, so as written it is as if `{known}` were not given",
        path(key),
        path(known)
    )
}

/// The optimal-string-alignment distance between two strings, by chars: insertions,
/// deletions, substitutions and swaps of two neighbouring chars count one edit each.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back, one back, this one.
    let mut two: Vec<usize> = vec![0; b.len() + 1];
    let mut one: Vec<usize> = (0..=b.len()).collect();
    let mut row = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (one[j - 1] + cost).min(one[j] + 1).min(row[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(two[j - 2] + 1);
            }
        }
        std::mem::swap(&mut two, &mut one);
        std::mem::swap(&mut one, &mut row);
    }
    one[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_count_swaps_as_one_edit() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("shpae", "shape"), 1);
        assert_eq!(edit_distance("lables", "labels"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("tokeniser", "tokenizer"), 1);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn near_misses_within_a_letter_or_two_and_case() {
        let known = ["name", "datatype", "shape", "tokenizer", "image", "labels"];
        for (key, want) in [
            ("tokeniser", Some("tokenizer")),
            ("Tokenizer", Some("tokenizer")),
            ("label", Some("labels")),
            ("lables", Some("labels")),
            ("images", Some("image")),
            ("data_type", Some("datatype")),
            ("dattype", Some("datatype")),
            ("shap", Some("shape")),
            ("Name", Some("name")),
            // Fields of the level, and keys further away, are not near misses.
            ("labels", None),
            ("description", None),
            ("reshape", None),
            ("dims", None),
            ("format", None),
            ("dtype", None),
            ("nam", None),
        ] {
            assert_eq!(near_miss(key, &known, &[]), want, "{key}");
        }
        // A field other apps use on purpose is kept.
        assert_eq!(near_miss("output", &["outputs"], &["output"]), None);
        assert_eq!(near_miss("output", &["outputs"], &[]), Some("outputs"));
    }

    #[test]
    fn the_refusal_names_the_path_and_the_field() {
        let o: Map<String, Value> =
            serde_json::from_str(r#"{"name": "t", "tokeniser": {}, "note": 1}"#).unwrap();
        let e = check("inputs[0]", &o, &["name", "tokenizer"], &[]).unwrap_err();
        assert!(
            e.contains("field `inputs[0].tokeniser` is so close to `inputs[0].tokenizer`")
                && e.contains("did you mean `tokenizer`?"),
            "{e}"
        );
        let e = refusal("", "est_gpu_mem_type", "est_gpu_mem_typ");
        assert!(
            e.starts_with("field `est_gpu_mem_type` is so close to `est_gpu_mem_typ`"),
            "{e}"
        );
        let o: Map<String, Value> = serde_json::from_str(r#"{"name": "t", "note": 1}"#).unwrap();
        assert!(check("inputs[0]", &o, &["name", "tokenizer"], &[]).is_ok());
    }
}
