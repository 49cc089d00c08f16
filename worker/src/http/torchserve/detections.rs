//! `object_detector`'s post-processing, as TorchServe's `ObjectDetector.postprocess` does
//! it: of each image's detections, the rows scoring at least 0.5, each as
//! `{label: [x1, y1, x2, y2], "score": score}` — the label named by `index_to_name.json`,
//! else its index as a string — in the model's order. The model's pass gives them as padded
//! rows with each image's count (`model/detector.rs`): `boxes`, `labels`, `scores`,
//! `detections`.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{Map, Value};
use vramfork::metadata::{Datatype, Dtype};
use vramfork::torchserve::handler::{DETECTIONS, DETECTION_THRESHOLD};

use crate::app::App;
use crate::error::ApiError;
use crate::http::answer::{json_bytes, Answer};
use crate::infer::{Done, Encoding, OutTensor, RunError, RunOutput, Wanted};

/// The detector's outputs, as every door that post-processes for `object_detector` asks
/// for them.
pub fn detector_outputs(app: &App) -> Encoding {
    Encoding::Tensors(Wanted {
        outputs: Some(DETECTIONS.iter().map(|s| s.to_string()).collect()),
        declared: app.metadata.outputs.clone(),
    })
}

/// Each image's list of kept detections, from a pass's outputs.
pub fn detections(app: &App, out: RunOutput) -> Result<Vec<Value>, ApiError> {
    let tensors = out.outputs.tensors().map_err(ApiError::Run)?;
    let names = app
        .metadata
        .archive
        .as_ref()
        .and_then(|a| a.labels.as_deref());
    kept(&tensors, names).map_err(|e| ApiError::Run(RunError::Unsupported(e)))
}

/// `object_detector`'s prediction: for one image its list of detections, for several a
/// list of them.
pub async fn detect(req: Request<Incoming>, app: &App) -> Result<Answer, ApiError> {
    let Done {
        out,
        extra: (),
        last,
    } = crate::http::root::run(req, app, detector_outputs(app)).await?;
    let timing = out.preprocess.map(|p| (p, out.forward));
    let mut images = detections(app, out)?;
    let body = match images.len() {
        1 => images.remove(0),
        _ => Value::Array(images),
    };
    let mut answer = Answer::with(StatusCode::OK, json_bytes(&body));
    answer.timing = timing;
    answer.close = last;
    Ok(answer)
}

/// The kept detections of each image (see the module's doc).
fn kept(tensors: &[OutTensor], names: Option<&[String]>) -> Result<Vec<Value>, String> {
    let [boxes, labels, scores, counts] = tensors else {
        return Err(format!(
            "object_detector reads the detector's {} outputs; the pass gave {}",
            DETECTIONS.len(),
            tensors.len()
        ));
    };
    let (boxes, scores) = (floats(boxes)?, floats(scores)?);
    let (labels, counts) = (ints(labels)?, ints(counts)?);
    let most = scores.len() / counts.len().max(1);
    if boxes.len() != 4 * scores.len() || labels.len() != scores.len() {
        return Err("the detector's outputs disagree in their number of detections".into());
    }
    let name = |label: i64| {
        usize::try_from(label)
            .ok()
            .and_then(|i| names.and_then(|n| n.get(i)))
            .cloned()
            .unwrap_or_else(|| label.to_string())
    };
    let images = counts.iter().enumerate().map(|(i, &n)| {
        let rows = (i * most)..(i * most + usize::try_from(n).unwrap_or(0).min(most));
        let found = rows.filter(|&r| scores[r] >= DETECTION_THRESHOLD).map(|r| {
            let corners: Vec<Value> = boxes[4 * r..4 * r + 4].iter().map(|&x| number(x)).collect();
            let mut o = Map::new();
            o.insert(name(labels[r]), Value::Array(corners));
            o.insert("score".into(), number(scores[r]));
            Value::Object(o)
        });
        Value::Array(found.collect())
    });
    Ok(images.collect())
}

/// A float32 as Python's `tolist()` gives it (the double it widens to); NaN and ±Inf as
/// `null`, JSON having no such numbers.
fn number(x: f32) -> Value {
    serde_json::Number::from_f64(f64::from(x)).map_or(Value::Null, Value::Number)
}

fn floats(t: &OutTensor) -> Result<Vec<f32>, String> {
    let values = t
        .floats_or_half()
        .map_err(|other| format!("the detector's `{}` are {other}, not floats", t.name))?;
    Ok(values.into_iter().map(|x| x as f32).collect())
}

fn ints(t: &OutTensor) -> Result<Vec<i64>, String> {
    Ok(match t.datatype {
        Datatype::Tensor(Dtype::Int64) => t
            .data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()))
            .collect(),
        Datatype::Tensor(Dtype::Int32) => t
            .data
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        other => {
            return Err(format!(
                "the detector's `{}` are {other}, not integers",
                t.name
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, dtype: Dtype, shape: Vec<i64>, data: Vec<u8>) -> OutTensor {
        OutTensor {
            name: name.into(),
            datatype: Datatype::Tensor(dtype),
            shape,
            data,
        }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn i64s(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn rows_from_half_up_named_by_the_mapping_else_by_index() {
        // Two images, two rows each; the second image has one real row.
        let boxes: Vec<f32> = (0..16).map(|i| i as f32 + 0.5).collect();
        let outs = [
            tensor("boxes", Dtype::Float32, vec![2, 2, 4], f32s(&boxes)),
            tensor("labels", Dtype::Int64, vec![2, 2], i64s(&[1, 9, 0, 0])),
            tensor(
                "scores",
                Dtype::Float32,
                vec![2, 2],
                f32s(&[0.5, 0.49, 0.75, 0.9]),
            ),
            tensor("detections", Dtype::Int64, vec![2], i64s(&[2, 1])),
        ];
        let names = ["background".to_string(), "cat".to_string()];
        let got = kept(&outs, Some(&names)).unwrap();
        assert_eq!(
            Value::Array(got),
            serde_json::json!([
                [{"cat": [0.5, 1.5, 2.5, 3.5], "score": 0.5}],
                [{"background": [8.5, 9.5, 10.5, 11.5], "score": 0.75}]
            ])
        );
        let got = kept(&outs, None).unwrap();
        assert_eq!(got[0][0]["1"], serde_json::json!([0.5, 1.5, 2.5, 3.5]));
        assert!(kept(&outs[..3], None).unwrap_err().contains("4 outputs"));
    }
}
