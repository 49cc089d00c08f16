//! Dynamic batching's data work on the model thread: which queued requests may share a
//! forward pass (the same arguments, dtypes and non-batch dimensions), their inputs stacked
//! along dimension 0, and a batched output cut back into each request's rows.
//!
//! The model's side of the contract (`max_batch_size` in the metadata): it takes a leading
//! batch dimension and returns outputs with the same leading dimension. An output that does
//! not have it cannot be cut; the caller then runs the requests one by one.

use std::time::Duration;

use tch::{IValue, Kind, Tensor};

use crate::args::{Arg, Inputs};

/// Batching as configured: rows per pass, and how long to wait to fill a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    pub max_rows: usize,
    pub timeout: Duration,
}

/// What one argument of a request must share with the others' to be stacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgKey {
    /// A tensor's dtype and its dimensions after the first.
    Tensor(Kind, Vec<i64>),
    /// A `List[str]` (stacked by concatenation).
    Strings,
    /// A tokenized text tensor of this dtype: its rows may have any length (padded to the
    /// longest when stacked).
    Padded(Kind),
}

/// A request's stacking key and its rows; `None` when it cannot be stacked (no arguments, a
/// scalar tensor, arguments with different row counts, no rows): it runs alone.
pub fn key_of(input: &Inputs) -> Option<(Vec<ArgKey>, usize)> {
    let mut rows = None;
    let mut key = Vec::with_capacity(input.args.len());
    for arg in &input.args {
        let (k, r) = match arg {
            Arg::Tensor(t) => {
                let size = t.size();
                let (&r, rest) = size.split_first()?;
                (
                    ArgKey::Tensor(t.kind(), rest.to_vec()),
                    usize::try_from(r).ok()?,
                )
            }
            Arg::Strings(s) => (ArgKey::Strings, s.len()),
            Arg::Padded { tensor, .. } => {
                let size = tensor.size();
                let (&r, _) = size.split_first()?;
                (ArgKey::Padded(tensor.kind()), usize::try_from(r).ok()?)
            }
            Arg::Blobs(_) => return None,
        };
        if *rows.get_or_insert(r) != r {
            return None;
        }
        key.push(k);
    }
    let rows = rows?;
    (rows > 0).then_some((key, rows))
}

/// The arguments of several requests of one key, stacked: tensors concatenated along
/// dimension 0, string lists joined.
pub fn stack(inputs: &[&Inputs]) -> Result<Vec<Arg>, String> {
    let Some(first) = inputs.first() else {
        return Ok(Vec::new());
    };
    (0..first.args.len())
        .map(|i| match &first.args[i] {
            Arg::Tensor(_) => {
                let parts = inputs
                    .iter()
                    .map(|inp| match inp.args.get(i) {
                        Some(Arg::Tensor(t)) => Ok(t),
                        _ => Err(format!("argument {i} differs between batched requests")),
                    })
                    .collect::<Result<Vec<&Tensor>, String>>()?;
                Tensor::f_cat(&parts, 0)
                    .map(Arg::Tensor)
                    .map_err(|e| crate::runner::useful_line(&e.to_string()))
            }
            Arg::Strings(_) => {
                let mut all = Vec::new();
                for inp in inputs {
                    match inp.args.get(i) {
                        Some(Arg::Strings(s)) => all.extend(s.iter().cloned()),
                        _ => return Err(format!("argument {i} differs between batched requests")),
                    }
                }
                Ok(Arg::Strings(all))
            }
            Arg::Padded { pad, .. } => {
                let parts = inputs
                    .iter()
                    .map(|inp| match inp.args.get(i) {
                        Some(Arg::Padded { tensor, .. }) => Ok(tensor),
                        _ => Err(format!("argument {i} differs between batched requests")),
                    })
                    .collect::<Result<Vec<&Tensor>, String>>()?;
                let longest = parts.iter().map(|t| t.size()[1]).max().unwrap_or(0);
                let padded: Vec<Tensor> = parts
                    .iter()
                    .map(|t| match longest - t.size()[1] {
                        0 => t.shallow_clone(),
                        n => {
                            let tail = Tensor::full([t.size()[0], n], *pad, (t.kind(), t.device()));
                            Tensor::cat(&[t.shallow_clone(), tail], 1)
                        }
                    })
                    .collect();
                Tensor::f_cat(&padded, 0)
                    .map(|tensor| Arg::Padded { tensor, pad: *pad })
                    .map_err(|e| crate::runner::useful_line(&e.to_string()))
            }
            Arg::Blobs(_) => Err("raw document bytes cannot be batched".into()),
        })
        .collect()
}

/// Cuts a batched output into the requests' parts, `rows[i]` rows for request `i`, in
/// order. Every tensor (and list) in the output must have `sum(rows)` rows; tuples are cut
/// element by element. `Err` says what has no batch dimension.
pub fn split(out: &IValue, rows: &[usize]) -> Result<Vec<IValue>, String> {
    let total: usize = rows.iter().sum();
    match out {
        IValue::Tensor(t) => split_tensor(t, rows, total)
            .map(|parts| parts.into_iter().map(IValue::Tensor).collect()),
        IValue::Tuple(items) => {
            transpose(items, rows).map(|p| p.into_iter().map(IValue::Tuple).collect())
        }
        // A dict of named outputs: each value cut, the keys kept.
        IValue::GenericDict(pairs) => {
            let values: Vec<IValue> = pairs
                .iter()
                .map(|(_, v)| shallow(v).ok_or_else(|| no_batch_dimension(v)))
                .collect::<Result<_, _>>()?;
            let keys: Vec<IValue> = pairs
                .iter()
                .map(|(k, _)| shallow(k).ok_or_else(|| no_batch_dimension(k)))
                .collect::<Result<_, _>>()?;
            Ok(transpose(&values, rows)?
                .into_iter()
                .map(|parts| {
                    let keys = keys.iter().filter_map(shallow);
                    IValue::GenericDict(keys.zip(parts).collect())
                })
                .collect())
        }
        // A list of outputs (each cut), or else a list of one element per row (TorchScript's
        // `List[str]` can arrive as a list of strings).
        IValue::GenericList(items) => match transpose(items, rows) {
            Ok(p) => Ok(p.into_iter().map(IValue::GenericList).collect()),
            Err(e) if items.len() != total => Err(e),
            Err(e) => cut_list(items, rows)
                .into_iter()
                .map(|p| {
                    p.iter()
                        .map(shallow)
                        .collect::<Option<Vec<IValue>>>()
                        .map(IValue::GenericList)
                        .ok_or(e.clone())
                })
                .collect(),
        },
        IValue::TensorList(ts) => {
            // One tensor per output (each cut), or else one tensor per row.
            let per_output: Result<Vec<Vec<Tensor>>, String> =
                ts.iter().map(|t| split_tensor(t, rows, total)).collect();
            match per_output {
                Ok(cut) => Ok((0..rows.len())
                    .map(|i| IValue::TensorList(cut.iter().map(|c| c[i].shallow_clone()).collect()))
                    .collect()),
                Err(e) if ts.len() != total => Err(e),
                Err(_) => Ok(cut_list(ts, rows)
                    .into_iter()
                    .map(|p| IValue::TensorList(p.iter().map(Tensor::shallow_clone).collect()))
                    .collect()),
            }
        }
        IValue::StringList(v) => list(v, rows, total, "List[str]", IValue::StringList),
        IValue::IntList(v) => list(v, rows, total, "List[int]", IValue::IntList),
        IValue::DoubleList(v) => list(v, rows, total, "List[float]", IValue::DoubleList),
        IValue::BoolList(v) => list(v, rows, total, "List[bool]", IValue::BoolList),
        IValue::Int(_) => Err("an int output has no batch dimension".into()),
        IValue::Double(_) => Err("a float output has no batch dimension".into()),
        IValue::Bool(_) => Err("a bool output has no batch dimension".into()),
        other => Err(no_batch_dimension(other)),
    }
}

fn no_batch_dimension(v: &IValue) -> String {
    format!(
        "a {} output has no batch dimension",
        super::tensors::type_name(v)
    )
}

/// A copy of a value sharing its tensors' storage (`IValue` is not `Clone`); `None` for the
/// kinds an output cannot be written as anyway (objects).
fn shallow(v: &IValue) -> Option<IValue> {
    Some(match v {
        IValue::None => IValue::None,
        IValue::Tensor(t) => IValue::Tensor(t.shallow_clone()),
        IValue::Double(f) => IValue::Double(*f),
        IValue::Int(i) => IValue::Int(*i),
        IValue::Bool(b) => IValue::Bool(*b),
        IValue::String(s) => IValue::String(s.clone()),
        IValue::StringList(v) => IValue::StringList(v.clone()),
        IValue::IntList(v) => IValue::IntList(v.clone()),
        IValue::DoubleList(v) => IValue::DoubleList(v.clone()),
        IValue::BoolList(v) => IValue::BoolList(v.clone()),
        IValue::TensorList(ts) => {
            IValue::TensorList(ts.iter().map(Tensor::shallow_clone).collect())
        }
        IValue::Tuple(items) => IValue::Tuple(items.iter().map(shallow).collect::<Option<_>>()?),
        IValue::GenericList(items) => {
            IValue::GenericList(items.iter().map(shallow).collect::<Option<_>>()?)
        }
        IValue::GenericDict(pairs) => IValue::GenericDict(
            pairs
                .iter()
                .map(|(k, v)| Some((shallow(k)?, shallow(v)?)))
                .collect::<Option<_>>()?,
        ),
        _ => return None,
    })
}

fn split_tensor(t: &Tensor, rows: &[usize], total: usize) -> Result<Vec<Tensor>, String> {
    let size = t.size();
    match size.first() {
        Some(&n) if n as usize == total => {}
        Some(&n) => {
            return Err(format!(
                "an output of shape {size:?} has {n} rows where the batch had {total}"
            ))
        }
        None => return Err("a scalar tensor output has no batch dimension".into()),
    }
    let mut at = 0i64;
    Ok(rows
        .iter()
        .map(|&r| {
            let part = t.narrow(0, at, r as i64);
            at += r as i64;
            part
        })
        .collect())
}

/// Each element of a tuple cut, then regrouped per request.
fn transpose(items: &[IValue], rows: &[usize]) -> Result<Vec<Vec<IValue>>, String> {
    let mut per_request: Vec<Vec<IValue>> = (0..rows.len())
        .map(|_| Vec::with_capacity(items.len()))
        .collect();
    for item in items {
        for (dst, part) in per_request.iter_mut().zip(split(item, rows)?) {
            dst.push(part);
        }
    }
    Ok(per_request)
}

fn list<T: Clone>(
    v: &[T],
    rows: &[usize],
    total: usize,
    what: &str,
    make: fn(Vec<T>) -> IValue,
) -> Result<Vec<IValue>, String> {
    if v.len() != total {
        return Err(format!(
            "a {what} output has {} elements where the batch had {total} rows",
            v.len()
        ));
    }
    Ok(cut_list(v, rows)
        .into_iter()
        .map(|p| make(p.to_vec()))
        .collect())
}

fn cut_list<'a, T>(v: &'a [T], rows: &[usize]) -> Vec<&'a [T]> {
    let mut at = 0;
    rows.iter()
        .map(|&r| {
            let part = &v[at..at + r];
            at += r;
            part
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(rows: i64, cols: i64) -> Inputs {
        Inputs {
            args: vec![Arg::Tensor(
                Tensor::arange(rows * cols, (Kind::Float, tch::Device::Cpu)).reshape([rows, cols]),
            )],
        }
    }

    #[test]
    fn keys_tell_what_can_share_a_pass() {
        let (k1, r1) = key_of(&tensor(1, 4)).unwrap();
        let (k3, r3) = key_of(&tensor(3, 4)).unwrap();
        assert_eq!((k1 == k3, r1, r3), (true, 1, 3));
        assert_ne!(key_of(&tensor(1, 5)).unwrap().0, k1);
        let scalar = Inputs {
            args: vec![Arg::Tensor(Tensor::from(1.5f32))],
        };
        assert!(key_of(&scalar).is_none());
        assert!(key_of(&tensor(0, 4)).is_none());
        let uneven = Inputs {
            args: vec![
                Arg::Tensor(Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu))),
                Arg::Strings(vec!["a".into()]),
            ],
        };
        assert!(key_of(&uneven).is_none());
        let docs = Inputs {
            args: vec![Arg::Strings(vec!["a".into(), "b".into()])],
        };
        assert_eq!(key_of(&docs), Some((vec![ArgKey::Strings], 2)));
    }

    #[test]
    fn tokenized_rows_of_different_lengths_are_padded_to_the_longest() {
        let ids = |rows: &[&[i64]]| Inputs {
            args: vec![Arg::Padded {
                tensor: Tensor::from_slice2(rows),
                pad: 7,
            }],
        };
        let (a, b) = (ids(&[&[1, 2]]), ids(&[&[3, 4, 5, 6], &[8, 9, 10, 11]]));
        // Lengths differ, the key does not: they may share a pass.
        assert_eq!(key_of(&a).unwrap().0, key_of(&b).unwrap().0);
        assert_eq!(key_of(&b).unwrap().1, 2);
        let stacked = stack(&[&a, &b]).unwrap();
        let Arg::Padded { tensor, pad: 7 } = &stacked[0] else {
            panic!("{stacked:?}")
        };
        assert_eq!(tensor.size(), [3, 4]);
        assert_eq!(
            Vec::<i64>::try_from(tensor.flatten(0, -1)).unwrap(),
            [1, 2, 7, 7, 3, 4, 5, 6, 8, 9, 10, 11]
        );
        // A tokenized tensor and a plain one of the same shape do not share a key.
        let plain = Inputs {
            args: vec![Arg::Tensor(Tensor::from_slice2(&[[1i64, 2]]))],
        };
        assert_ne!(key_of(&plain).unwrap().0, key_of(&a).unwrap().0);
    }

    #[test]
    fn stacked_outputs_are_cut_back_per_request() {
        let (a, b) = (tensor(1, 2), tensor(3, 2));
        let stacked = stack(&[&a, &b]).unwrap();
        let Arg::Tensor(t) = &stacked[0] else {
            panic!("not a tensor")
        };
        assert_eq!(t.size(), vec![4, 2]);
        let out = IValue::Tuple(vec![
            IValue::Tensor(t * 2),
            IValue::StringList(vec!["w".into(), "x".into(), "y".into(), "z".into()]),
        ]);
        let parts = split(&out, &[1, 3]).unwrap();
        let IValue::Tuple(p1) = &parts[1] else {
            panic!("not a tuple")
        };
        let IValue::Tensor(t1) = &p1[0] else {
            panic!("not a tensor")
        };
        assert_eq!(
            Vec::<f32>::try_from(t1.flatten(0, -1)).unwrap(),
            vec![0., 2., 4., 6., 8., 10.]
        );
        assert!(matches!(&p1[1], IValue::StringList(s) if s == &["x", "y", "z"]));
    }

    #[test]
    fn a_dict_of_outputs_is_cut_value_by_value() {
        let out = IValue::GenericDict(vec![
            (
                IValue::String("out".into()),
                IValue::Tensor(Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).reshape([3, 2])),
            ),
            (
                IValue::String("aux".into()),
                IValue::Tensor(Tensor::from_slice(&[7i64, 8, 9])),
            ),
        ]);
        let parts = split(&out, &[1, 2]).unwrap();
        let IValue::GenericDict(second) = &parts[1] else {
            panic!("not a dict")
        };
        assert!(matches!(&second[0].0, IValue::String(k) if k == "out"));
        assert!(
            matches!(&second[1].1, IValue::Tensor(t) if Vec::<i64>::try_from(t).unwrap() == [8, 9])
        );
        let scalar = IValue::GenericDict(vec![(IValue::String("n".into()), IValue::Int(1))]);
        assert!(split(&scalar, &[1, 2]).unwrap_err().contains("int output"));
    }

    #[test]
    fn outputs_without_a_batch_dimension_are_refused() {
        let rows = [1, 2];
        let e = split(&IValue::Tensor(Tensor::from(1.0f32)), &rows).unwrap_err();
        assert!(e.contains("scalar"), "{e}");
        let e = split(
            &IValue::Tensor(Tensor::zeros([2, 2], (Kind::Float, tch::Device::Cpu))),
            &rows,
        )
        .unwrap_err();
        assert!(e.contains("has 2 rows where the batch had 3"), "{e}");
        let e = split(&IValue::Tuple(vec![IValue::Int(3)]), &rows).unwrap_err();
        assert!(e.contains("int output"), "{e}");
        // A list of one tensor per row is cut by rows.
        let per_row = IValue::TensorList((0..3).map(|i| Tensor::from(i as f32)).collect());
        assert_eq!(split(&per_row, &rows).unwrap().len(), 2);
        // So is a generic list of one string per row.
        let words = IValue::GenericList(
            ["a", "b", "c"]
                .into_iter()
                .map(|w| IValue::String(w.into()))
                .collect(),
        );
        let parts = split(&words, &rows).unwrap();
        assert!(matches!(&parts[1], IValue::GenericList(v) if v.len() == 2));
    }
}
