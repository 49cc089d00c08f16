//! Outputs people can read: an output of the metadata may carry a `labels` block —
//! the class names of a classification output (a JSON file: an array of names, or an object
//! of index → name as Hugging Face's `id2label`), how many to give (`top_k`) and whether the
//! scores are the model's own or its softmax. `POST /` then answers each row's best classes
//! beside the outputs. This file owns the block and its checks; `worker/src/http/root.rs`
//! writes the answer.

use std::path::Path;

use serde_json::{Map, Value};

use crate::schema::kind;

/// A `labels` block, its file read.
#[derive(Debug, Clone, PartialEq)]
pub struct Labels {
    /// Class names by index.
    pub names: Vec<String>,
    /// Classes per row in the answer, best first.
    pub top_k: usize,
    /// Scores are the softmax of the row (for a model that returns logits), else as given.
    pub softmax: bool,
}

/// The `labels` block of `outputs[i]` (`at` names it), if it has one; `base` is the
/// metadata's folder; `classes` the declared size of the output's last dimension, if known.
pub fn parse(
    at: &str,
    o: &Map<String, Value>,
    base: &Path,
    classes: Option<i64>,
) -> Result<Option<Labels>, String> {
    let Some(v) = o.get("labels").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let at = format!("{at}.labels");
    let Value::Object(b) = v else {
        return Err(format!(
            "field `{at}` must be an object ({{\"file\": …, \"top_k\": …}}), found {}",
            kind(v)
        ));
    };
    let fields = ["file", "top_k", "softmax"];
    crate::near_miss::check(&at, b, &fields, &[])?;
    if let Some(k) = b.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(format!(
            "field `{at}.{k}` is not known; `{at}` takes file, top_k, softmax"
        ));
    }
    let file = match b.get("file") {
        Some(Value::String(s)) if !s.is_empty() => base.join(s),
        _ => {
            return Err(format!(
                "field `{at}.file` must be the path of a JSON file of class names"
            ))
        }
    };
    let names = class_names(&at, &file)?;
    if names.is_empty() {
        return Err(format!(
            "field `{at}.file`: {} names no class",
            file.display()
        ));
    }
    if let Some(c) = classes.filter(|c| *c >= 0) {
        if c as usize != names.len() {
            return Err(format!(
                "field `{at}.file`: {} names {} classes; the output's last dimension is {c}",
                file.display(),
                names.len()
            ));
        }
    }
    let top_k = match b.get("top_k") {
        None | Some(Value::Null) => names.len().min(5),
        Some(v) => v
            .as_u64()
            .filter(|k| *k >= 1)
            .map(|k| (k as usize).min(names.len()))
            .ok_or_else(|| format!("field `{at}.top_k` must be a whole number ≥ 1, found {v}"))?,
    };
    let softmax = match b.get("softmax") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(x)) => *x,
        Some(v) => {
            return Err(format!(
                "field `{at}.softmax` must be true or false, found {v}"
            ))
        }
    };
    Ok(Some(Labels {
        names,
        top_k,
        softmax,
    }))
}

/// The class names in the labels file `file` (of the block at `at`): an array of names, or
/// an object of index → name naming every index from 0 once.
fn class_names(at: &str, file: &Path) -> Result<Vec<String>, String> {
    let text = crate::files::read_regular(file, 64 << 20)
        .and_then(|b| {
            String::from_utf8(b)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
        })
        .map_err(|e| format!("field `{at}.file`: cannot read {}: {e}", file.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| format!("field `{at}.file`: {} is not JSON: {e}", file.display()))?;
    names_of(doc).map_err(|e| format!("field `{at}.file`: {} {e}", file.display()))
}

/// The class names a labels document holds: an array of names, or an object of index →
/// name naming every index from 0 once, a name given as a list meaning its last item
/// (TorchServe's `index_to_name.json`: `{"0": ["n01440764", "tench"]}`).
pub fn names_of(doc: Value) -> Result<Vec<String>, String> {
    let bad = || "must hold an array of class names or an object of index → name".to_string();
    let name = |v: Value| match v {
        Value::String(s) => Some(s),
        Value::Array(mut items) => match items.pop() {
            Some(Value::String(s)) => Some(s),
            _ => None,
        },
        _ => None,
    };
    let names: Vec<String> = match doc {
        Value::Array(items) => items
            .into_iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Value::Object(map) => {
            let mut pairs = map
                .into_iter()
                .map(|(k, v)| match (k.parse::<usize>(), name(v)) {
                    (Ok(i), Some(s)) => Ok((i, s)),
                    _ => Err(bad()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            pairs.sort();
            if pairs.iter().enumerate().any(|(i, (k, _))| i != *k) {
                return Err("must name every index from 0 once".into());
            }
            pairs.into_iter().map(|(_, s)| s).collect()
        }
        _ => return Err(bad()),
    };
    Ok(names)
}

impl Labels {
    /// A row's best `top_k` classes, best first: `[name, score]`. `Err` when the row has
    /// another number of classes than the file names.
    pub fn top(&self, row: &[f64]) -> Result<Vec<(String, f64)>, String> {
        if row.len() != self.names.len() {
            return Err(format!(
                "the labelled output has {} classes per row; the labels file names {}",
                row.len(),
                self.names.len()
            ));
        }
        let scores: Vec<f64> = if self.softmax {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let exp: Vec<f64> = row.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = exp.iter().sum();
            exp.into_iter().map(|e| e / sum).collect()
        } else {
            row.to_vec()
        };
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
        Ok(order
            .into_iter()
            .take(self.top_k)
            .map(|i| (self.names[i].clone(), scores[i]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(file: &str, json: &str, classes: Option<i64>) -> Result<Option<Labels>, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("l.json"), file).unwrap();
        let v: Value = serde_json::from_str(json).unwrap();
        parse("outputs[0]", v.as_object().unwrap(), dir.path(), classes)
    }

    #[test]
    fn labels_read_names_and_rank_rows() {
        let l = block(
            r#"["neg", "neu", "pos"]"#,
            r#"{"labels": {"file": "l.json", "top_k": 2, "softmax": true}}"#,
            Some(3),
        )
        .unwrap()
        .unwrap();
        let top = l.top(&[0.0, 1.0, 2.0]).unwrap();
        assert_eq!(top[0].0, "pos");
        assert_eq!(top[1].0, "neu");
        assert!((top[0].1 - 0.665_240_955_7).abs() < 1e-9, "{top:?}");
        assert!(l.top(&[1.0]).unwrap_err().contains("1 classes per row"));
        // id2label form; top_k defaults to at most 5, scores as given.
        let l = block(
            r#"{"1": "b", "0": "a"}"#,
            r#"{"labels": {"file": "l.json"}}"#,
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (l.names.clone(), l.top_k, l.softmax),
            (vec!["a".into(), "b".into()], 2, false)
        );
        assert_eq!(l.top(&[0.3, 0.1]).unwrap()[0], ("a".to_string(), 0.3));
        // TorchServe's index_to_name.json as it is: a name given as [id, name].
        let l = block(
            r#"{"0": ["n01440764", "tench"], "1": ["n01443537", "goldfish"]}"#,
            r#"{"labels": {"file": "l.json"}}"#,
            Some(2),
        )
        .unwrap()
        .unwrap();
        assert_eq!(l.names, vec!["tench".to_string(), "goldfish".into()]);
        for (file, json, classes, want) in [
            (
                "[1, 2]",
                r#"{"labels": {"file": "l.json"}}"#,
                None,
                "array of class names",
            ),
            (
                r#"{"0": "a", "2": "c"}"#,
                r#"{"labels": {"file": "l.json"}}"#,
                None,
                "every index from 0 once",
            ),
            (
                r#"["a"]"#,
                r#"{"labels": {"file": "l.json"}}"#,
                Some(3),
                "names 1 classes; the output's last dimension is 3",
            ),
            (
                r#"["a"]"#,
                r#"{"labels": {"file": "l.json", "top_k": 0}}"#,
                None,
                "`outputs[0].labels.top_k`",
            ),
            (
                r#"["a"]"#,
                r#"{"labels": {"file": "nope.json"}}"#,
                None,
                "cannot read",
            ),
            (
                r#"["a"]"#,
                r#"{"labels": {"file": "l.json", "k": 1}}"#,
                None,
                "`outputs[0].labels.k` is not known",
            ),
            (
                "[]",
                r#"{"labels": {"file": "l.json"}}"#,
                None,
                "names no class",
            ),
        ] {
            let e = block(file, json, classes).unwrap_err();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }
}
