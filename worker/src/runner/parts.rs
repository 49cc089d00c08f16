//! A request whose text rows are more tokens than one pass may hold (`max_batch_tokens`,
//! rows × padded length) runs in parts: its rows cut into consecutive parts of at most the
//! budget, each part a forward pass, the outputs joined along the rows again — so the
//! largest pass a client can cause is the one the warm-up ran (`warmup.rs`), whatever door
//! it came through. Every part keeps the request's padded length, so the joined outputs are
//! exactly one pass's (per-token outputs keep their width). The doors that run a request's
//! texts themselves (`/v1/embeddings`, rerank, classify: `infer::text_passes`) cut them
//! shortest first instead, within the same budget, before they reach the model thread.
//!
//! The budget is the worker's own (the model thread is its one reader): set at boot from
//! the metadata, and lowered by the warm-up when the default one ran out of GPU memory.

use std::sync::atomic::{AtomicUsize, Ordering};

use tch::{Device, IValue, Tensor};

use super::pass_tokens::text_rows;
use super::RunError;
use crate::args::Arg;
use crate::model::Model;

/// Tokens one pass of a text input may hold (0: no budget).
static TOKENS: AtomicUsize = AtomicUsize::new(0);
/// What a warm-up could run, when it lowered the budget (`usize::MAX`: it did not). Set
/// in the template before it forks, so a forked worker's [`configure`] keeps it.
static LOWERED: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The budget of this worker's text passes (the text arguments are `pass_tokens`').
pub fn configure(tokens: usize) {
    TOKENS.store(
        tokens.min(LOWERED.load(Ordering::Relaxed)),
        Ordering::Relaxed,
    );
}

/// The budget now, when there is one.
pub fn token_budget() -> Option<usize> {
    Some(TOKENS.load(Ordering::Relaxed)).filter(|&t| t > 0)
}

/// Lowers the budget to `tokens` (what the warm-up could run).
pub(super) fn lower(tokens: usize) {
    LOWERED.fetch_min(tokens.max(1), Ordering::Relaxed);
    let _ = TOKENS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
        (t > 0).then_some(t.min(tokens.max(1)))
    });
}

/// Rows per part for `args`, when their text rows are over the budget (`None`: one pass).
fn rows_per_part(args: &[Arg]) -> Option<(usize, usize)> {
    let tokens = token_budget()?;
    let (rows, width) = text_rows(args)?;
    (rows > 1 && rows * width > tokens).then(|| ((tokens / width.max(1)).max(1), rows))
}

/// The model's forward pass on `args` ([`super::pass`]), in parts when their text rows are
/// over the budget, the parts' outputs joined.
pub(super) fn pass(module: &Model, device: Device, args: &[Arg]) -> Result<IValue, RunError> {
    let Some((per, rows)) = rows_per_part(args) else {
        return super::pass(module, device, args);
    };
    let (mut outs, mut sizes, mut start) = (Vec::new(), Vec::new(), 0);
    while start < rows {
        let n = per.min(rows - start);
        outs.push(super::pass(module, device, &cut(args, rows, start, n))?);
        sizes.push(n);
        start += n;
    }
    join(outs, &sizes).map_err(|why| {
        RunError::Unsupported(format!(
            "the request's {rows} documents are more tokens than one pass holds (`max_batch_tokens` {}), so they ran in passes of {per}, but the model's outputs cannot be joined again: {why}. Send fewer documents a request",
            token_budget().unwrap_or(0)
        ))
    })
}

/// Rows `start..start + n` of every argument with `rows` rows (the others as they are).
fn cut(args: &[Arg], rows: usize, start: usize, n: usize) -> Vec<Arg> {
    let narrow = |t: &Tensor| match t.size().first() {
        Some(&r) if r as usize == rows => t.narrow(0, start as i64, n as i64),
        _ => t.shallow_clone(),
    };
    args.iter()
        .map(|a| match a {
            Arg::Tensor(t) => Arg::Tensor(narrow(t)),
            Arg::Padded { tensor, pad } => Arg::Padded {
                tensor: narrow(tensor),
                pad: *pad,
            },
            Arg::Strings(s) if s.len() == rows => Arg::Strings(s[start..start + n].to_vec()),
            Arg::Strings(s) => Arg::Strings(s.clone()),
            Arg::Blobs(b) => Arg::Blobs(b.clone()),
        })
        .collect()
}

/// The outputs of the parts (`rows[i]` rows each), joined along the rows: tensors
/// concatenated, tuples, lists and dicts joined element by element, lists of one element a
/// row concatenated. `Err` names what has no row dimension.
fn join(parts: Vec<IValue>, rows: &[usize]) -> Result<IValue, String> {
    let first = parts.first().ok_or("no part ran")?;
    Ok(match first {
        IValue::Tensor(_) => IValue::Tensor(tensors(&parts, rows)?),
        IValue::Tuple(items) => IValue::Tuple(each(&parts, items.len(), rows)?),
        IValue::GenericList(items) => IValue::GenericList(each(&parts, items.len(), rows)?),
        IValue::TensorList(ts) => {
            let n = ts.len();
            let mut joined = Vec::with_capacity(n);
            for k in 0..n {
                let col: Vec<IValue> = parts
                    .iter()
                    .map(|p| match p {
                        IValue::TensorList(ts) if ts.len() == n => {
                            Ok(IValue::Tensor(ts[k].shallow_clone()))
                        }
                        _ => Err("the parts' outputs differ in shape".to_string()),
                    })
                    .collect::<Result<_, _>>()?;
                joined.push(tensors(&col, rows)?);
            }
            IValue::TensorList(joined)
        }
        IValue::GenericDict(entries) => {
            let keys = entries
                .iter()
                .map(|(k, _)| same(k))
                .collect::<Result<Vec<_>, _>>()?;
            let mut joined = Vec::with_capacity(keys.len());
            for (k, key) in keys.into_iter().enumerate() {
                let col = parts
                    .iter()
                    .map(|p| match p {
                        IValue::GenericDict(e) if e.len() == entries.len() => same(&e[k].1),
                        _ => Err("the parts' outputs differ in shape".to_string()),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                joined.push((key, join(col, rows)?));
            }
            IValue::GenericDict(joined)
        }
        IValue::StringList(_) => IValue::StringList(lists(parts, rows, |v| match v {
            IValue::StringList(s) => Some(s),
            _ => None,
        })?),
        IValue::IntList(_) => IValue::IntList(lists(parts, rows, |v| match v {
            IValue::IntList(s) => Some(s),
            _ => None,
        })?),
        IValue::DoubleList(_) => IValue::DoubleList(lists(parts, rows, |v| match v {
            IValue::DoubleList(s) => Some(s),
            _ => None,
        })?),
        IValue::BoolList(_) => IValue::BoolList(lists(parts, rows, |v| match v {
            IValue::BoolList(s) => Some(s),
            _ => None,
        })?),
        other => {
            return Err(format!(
                "a {} output has no row dimension",
                super::tensors::type_name(other)
            ))
        }
    })
}

/// Element `k` of every part's tuple or list, each joined.
fn each(parts: &[IValue], n: usize, rows: &[usize]) -> Result<Vec<IValue>, String> {
    (0..n)
        .map(|k| {
            let col = parts
                .iter()
                .map(|p| match p {
                    IValue::Tuple(items) | IValue::GenericList(items) if items.len() == n => {
                        same(&items[k])
                    }
                    _ => Err("the parts' outputs differ in shape".to_string()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            join(col, rows)
        })
        .collect()
}

/// The parts' tensors concatenated along dimension 0; each must have its part's rows.
fn tensors(parts: &[IValue], rows: &[usize]) -> Result<Tensor, String> {
    let mut ts = Vec::with_capacity(parts.len());
    for (p, &r) in parts.iter().zip(rows) {
        let IValue::Tensor(t) = p else {
            return Err("the parts' outputs differ in kind".into());
        };
        match t.size().first() {
            Some(&n) if n as usize == r => ts.push(t),
            _ => {
                return Err(format!(
                    "an output of shape {:?} has no row dimension of {r} rows",
                    t.size()
                ))
            }
        }
    }
    Tensor::f_cat(&ts, 0).map_err(|e| super::useful_line(&e.to_string()))
}

/// Lists of one element a row, concatenated.
fn lists<T: Clone>(
    parts: Vec<IValue>,
    rows: &[usize],
    of: fn(&IValue) -> Option<&Vec<T>>,
) -> Result<Vec<T>, String> {
    let mut all = Vec::new();
    for (p, &r) in parts.iter().zip(rows) {
        match of(p) {
            Some(v) if v.len() == r => all.extend(v.iter().cloned()),
            _ => return Err("a list output has not one element a row".into()),
        }
    }
    Ok(all)
}

/// A copy of `v` sharing its tensors (`IValue` is not `Clone`); objects cannot be joined.
fn same(v: &IValue) -> Result<IValue, String> {
    super::batch::shallow(v).ok_or_else(|| "an object output cannot be joined".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cut_and_join_back_to_one_pass() {
        let t = Tensor::arange(12, (tch::Kind::Int64, tch::Device::Cpu)).reshape([6, 2]);
        let args = vec![
            Arg::Padded {
                tensor: t.shallow_clone(),
                pad: 0,
            },
            Arg::Tensor(Tensor::zeros([1, 3], (tch::Kind::Float, tch::Device::Cpu))),
        ];
        let a = cut(&args, 6, 0, 4);
        let b = cut(&args, 6, 4, 2);
        let rows_of = |a: &[Arg]| match &a[0] {
            Arg::Padded { tensor, .. } => tensor.size(),
            _ => panic!(),
        };
        assert_eq!((rows_of(&a), rows_of(&b)), (vec![4, 2], vec![2, 2]));
        // An argument of another row count is passed whole.
        assert!(matches!(&b[1], Arg::Tensor(x) if x.size() == vec![1, 3]));
        let out = |a: &[Arg]| match &a[0] {
            Arg::Padded { tensor, .. } => IValue::Tuple(vec![
                IValue::Tensor(tensor.shallow_clone()),
                IValue::StringList(vec!["x".into(); tensor.size()[0] as usize]),
            ]),
            _ => panic!(),
        };
        let joined = join(vec![out(&a), out(&b)], &[4, 2]).unwrap();
        let IValue::Tuple(items) = joined else {
            panic!()
        };
        match &items[..] {
            [IValue::Tensor(j), IValue::StringList(s)] => {
                assert!(j.equal(&t));
                assert_eq!(s.len(), 6);
            }
            other => panic!("{other:?}"),
        }
        // An output without the parts' rows cannot be joined.
        let pooled =
            |_: &[Arg]| IValue::Tensor(Tensor::zeros([3], (tch::Kind::Float, tch::Device::Cpu)));
        let e = join(vec![pooled(&a), pooled(&b)], &[4, 2]).unwrap_err();
        assert!(e.contains("no row dimension"), "{e}");
        assert!(join(vec![IValue::Int(1), IValue::Int(2)], &[4, 2]).is_err());
    }
}
