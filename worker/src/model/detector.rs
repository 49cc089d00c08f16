//! TorchServe's `object_detector` model: a scripted torchvision detector, whose `forward`
//! takes a list of `[3, H, W]` images (`List[Tensor]`) and returns `(losses, detections)`,
//! one dict of `boxes` (`[n, 4]`), `labels` (`[n]`) and `scores` (`[n]`) per image. The
//! rest of the worker passes tensors with a leading row per image: a pass's `[N, 3, H, W]`
//! images are unbound into the list, and the detections come back as rows too, padded to
//! the pass's most detections — `boxes` `[N, m, 4]`, `labels` `[N, m]`, `scores`
//! `[N, m]` — with each image's count in `detections` (`[N]`), so that a batched pass is
//! cut per request like any other output.

use tch::{CModule, IValue, Kind, Tensor};

use vramfork::torchserve::handler::DETECTIONS;

use super::Failure;

/// One pass of the detector over a pass's images.
pub fn forward(module: &CModule, args: &[IValue]) -> Result<IValue, Failure> {
    let [IValue::Tensor(images)] = args else {
        return Err(Failure::Input(format!(
            "object_detector's model takes one input, the images; this pass has {} arguments",
            args.len()
        )));
    };
    let list = images
        .f_unbind(0)
        .map_err(|e| Failure::Torch(e.to_string()))?;
    let out = module
        .forward_is(&[IValue::TensorList(list)])
        .map_err(|e| not_a_detector(&e.to_string()))?;
    per_image(&out).map_err(|why| {
        Failure::Torch(format!(
            "object_detector reads the model's output as a scripted torchvision detector returns it, `(losses, detections)` with `boxes`, `labels` and `scores` per image: {why}"
        ))
    })
}

/// libtorch's refusal of the arguments named as what the model must take; other failures
/// (the model's own, out of memory) kept as they are.
fn not_a_detector(message: &str) -> Failure {
    let first = message.lines().next().unwrap_or(message);
    let first = first
        .trim_start_matches("Internal torch error: ")
        .trim_end_matches('.');
    // How libtorch refuses a call's arguments before the model runs (its schema check).
    let refused_arguments = [
        "Expected a value of type",
        "expected at most",
        "Expected at most",
    ]
    .iter()
    .any(|m| first.contains(m));
    if !refused_arguments {
        return Failure::Torch(message.to_string());
    }
    Failure::Torch(format!(
        "object_detector calls the model's forward with a list of [3, H, W] images, as a scripted torchvision detector takes them (`forward(images: List[Tensor])`, returning `(losses, detections)`); this model does not take that: {first}. Archive `torch.jit.script(detector)` of a torchvision detection model"
    ))
}

/// The detections of each image, as padded rows (see the module's doc).
fn per_image(out: &IValue) -> Result<IValue, String> {
    let detections = match out {
        IValue::Tuple(items) if items.len() == 2 => &items[1],
        IValue::GenericList(_) => out,
        _ => return Err("it returned something else".into()),
    };
    let IValue::GenericList(images) = detections else {
        return Err("its detections are not a list".into());
    };
    let rows = images
        .iter()
        .map(|d| {
            let [b, l, s] = ["boxes", "labels", "scores"].map(|k| field(d, k));
            Ok::<_, String>((b?, l?, s?))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let most = rows.iter().map(|(b, _, _)| b.size()[0]).max().unwrap_or(0);
    let device = rows
        .first()
        .map_or(tch::Device::Cpu, |(b, _, _)| b.device());
    let mut boxes = Vec::with_capacity(rows.len());
    let (mut labels, mut scores, mut counts) = (vec![], vec![], vec![]);
    for (b, l, s) in rows {
        let n = b.size()[0];
        if b.size() != [n, 4] || l.size() != [n] || s.size() != [n] {
            return Err(format!(
                "an image's boxes are {:?}, its labels {:?} and its scores {:?} (want [n, 4], [n], [n])",
                b.size(),
                l.size(),
                s.size()
            ));
        }
        let pad = most - n;
        boxes.push(b.constant_pad_nd([0, 0, 0, pad]));
        labels.push(l.constant_pad_nd([0, pad]));
        scores.push(s.constant_pad_nd([0, pad]));
        counts.push(n);
    }
    let stack = |v: &[Tensor], name: &str| {
        Tensor::f_stack(v, 0).map_err(|e| format!("the images' {name} do not stack: {e}"))
    };
    let named = [
        stack(&boxes, "boxes")?,
        stack(&labels, "labels")?,
        stack(&scores, "scores")?,
        Tensor::from_slice(&counts)
            .to_kind(Kind::Int64)
            .to_device(device),
    ];
    Ok(IValue::GenericDict(
        DETECTIONS
            .iter()
            .zip(named)
            .map(|(k, t)| (IValue::String((*k).into()), IValue::Tensor(t)))
            .collect(),
    ))
}

/// The tensor `key` of one image's detections dict.
fn field(dict: &IValue, key: &str) -> Result<Tensor, String> {
    let IValue::GenericDict(pairs) = dict else {
        return Err("an image's detections are not a dict".into());
    };
    pairs
        .iter()
        .find_map(|(k, v)| match (k, v) {
            (IValue::String(name), IValue::Tensor(t)) if name == key => Some(t.shallow_clone()),
            _ => None,
        })
        .ok_or_else(|| format!("an image's detections have no `{key}` tensor"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(n: i64, label: i64, score: f32) -> IValue {
        let boxes = Tensor::arange(n * 4, (Kind::Float, tch::Device::Cpu)).reshape([n, 4]);
        IValue::GenericDict(vec![
            (IValue::String("boxes".into()), IValue::Tensor(boxes)),
            (
                IValue::String("labels".into()),
                IValue::Tensor(Tensor::full([n], label, (Kind::Int64, tch::Device::Cpu))),
            ),
            (
                IValue::String("scores".into()),
                IValue::Tensor(Tensor::full(
                    [n],
                    f64::from(score),
                    (Kind::Float, tch::Device::Cpu),
                )),
            ),
        ])
    }

    #[test]
    fn only_a_refusal_of_the_arguments_is_named_as_not_a_detector() {
        let refused = "Internal torch error: forward() Expected a value of type 'Tensor' for argument 'x' but instead found type 'List[Tensor]'.\nPosition: 1";
        let Failure::Torch(m) = not_a_detector(refused) else {
            panic!("not a torch failure")
        };
        assert!(
            m.contains("with a list of [3, H, W] images") && m.contains("for argument 'x'"),
            "{m}"
        );
        assert!(!m.contains("Position"), "{m}");
        // The model's own failure, whatever its traceback says, is kept as it is.
        let own = "The following operation failed in the TorchScript interpreter.\nTraceback: argument 'input' …";
        assert_eq!(not_a_detector(own), Failure::Torch(own.into()));
    }

    #[test]
    fn detections_become_rows_padded_to_the_most_with_each_images_count() {
        let losses = IValue::GenericDict(vec![]);
        let out = IValue::Tuple(vec![
            losses,
            IValue::GenericList(vec![image(2, 3, 0.9), image(0, 0, 0.0), image(1, 7, 0.4)]),
        ]);
        let IValue::GenericDict(pairs) = per_image(&out).unwrap() else {
            panic!("not a dict")
        };
        let t = |i: usize| match &pairs[i].1 {
            IValue::Tensor(t) => t.shallow_clone(),
            _ => panic!("not a tensor"),
        };
        assert_eq!(t(0).size(), [3, 2, 4]);
        assert_eq!(t(1).size(), [3, 2]);
        assert_eq!(Vec::<i64>::try_from(t(3)).unwrap(), [2, 0, 1]);
        assert_eq!(
            Vec::<i64>::try_from(t(1).reshape([-1])).unwrap(),
            [3, 3, 0, 0, 7, 0]
        );
        assert_eq!(f32::try_from(t(0).get(0).get(1).get(3)).unwrap(), 7.0);
        let e = per_image(&IValue::Tensor(Tensor::from(1.0f32))).unwrap_err();
        assert!(e.contains("something else"), "{e}");
        let bare = IValue::GenericList(vec![IValue::GenericDict(vec![])]);
        assert!(per_image(&bare).unwrap_err().contains("no `boxes`"));
    }
}
