//! TorchServe's default handlers, as the metadata blocks they amount to. `image_classifier`
//! is torchvision's `Resize(256)`, `CenterCrop(224)`, `ToTensor()` and ImageNet's
//! `Normalize` (an `image` block with `center_crop`, `shorter_side` 256), then a softmax
//! and the top 5 classes (a `labels` block). `image_segmenter` takes the same image; its
//! model returns a dict whose `out` (`[N, K, H, W]` scores) becomes, per pixel, the best
//! class and its softmax probability (`[H, W, 2]` per image: what TorchServe's
//! `ImageSegmenter.postprocess` returns; written by the serving doors from the `out`
//! output). `object_detector` takes each image at its own size, `ToTensor()` only (an
//! `image` block with `"resize": "none"`); its TorchScript model (a scripted torchvision
//! detector) is called with the list of images and returns `(losses, detections)`, each
//! image's `boxes`, `labels` and `scores`, of which the serving doors keep the rows scoring
//! at least [`DETECTION_THRESHOLD`], named by `index_to_name.json`. Any other handler is
//! Python code vramfork does not run: the metadata's `inputs` stand in for it, or the start
//! is refused ([`custom_refusal`]).

use serde_json::{json, Map, Value};

use super::Archive;
use crate::labels::Labels;

/// The output of the segmentation model's dict that `image_segmenter` reads.
pub const SEGMENTS: &str = "out";
/// The score from which `object_detector` keeps a detection (its `threshold`).
pub const DETECTION_THRESHOLD: f32 = 0.5;
/// The outputs of `object_detector`'s pass, each image's detections as rows padded to the
/// pass's most: `boxes` `[N, m, 4]`, `labels` `[N, m]`, `scores` `[N, m]`, and each
/// image's count `detections` `[N]`.
pub const DETECTIONS: [&str; 4] = ["boxes", "labels", "scores", "detections"];
/// The size of the image `object_detector`'s warm-up pass runs (requests keep their own).
pub const DETECTOR_WARMUP: [u32; 2] = [320, 320];
/// The classes `image_classifier` answers (its `topk`).
pub const TOP_K: usize = 5;
/// ImageNet's statistics, as `image_classifier` normalises with them.
pub const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const STD: [f32; 3] = [0.229, 0.224, 0.225];

/// An archive's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// `image_classifier`: served without Python.
    ImageClassifier,
    /// `image_segmenter`: served without Python.
    ImageSegmenter,
    /// `object_detector`: served without Python, its model a scripted torchvision detector.
    ObjectDetector,
    /// Any other: its model is served with the pre-processing the metadata declares.
    Custom,
}

impl Handler {
    /// The handler the manifest names (`image_classifier`, `image_segmenter`, or the
    /// module path TorchServe accepts for it).
    pub fn of(name: &str) -> Handler {
        let module = name.split(':').next().unwrap_or(name);
        match module.trim_start_matches("ts.torch_handler.") {
            "image_classifier" => Handler::ImageClassifier,
            "image_segmenter" => Handler::ImageSegmenter,
            "object_detector" => Handler::ObjectDetector,
            _ => Handler::Custom,
        }
    }
}

impl Archive {
    /// The metadata document with what the handler amounts to filled in where the metadata
    /// declares nothing: the image input of `image_classifier`, `image_segmenter` and
    /// `object_detector` (at its own size), and
    /// the classifier's scores output (its labels are [`Archive::labels_block`]; the
    /// segmenter's model names its outputs itself, a dict).
    pub fn filled(&self, raw: &Map<String, Value>) -> Map<String, Value> {
        let mut view = raw.clone();
        let declared = ["input", "inputs"].iter().any(|k| raw.contains_key(*k));
        if self.handler == Handler::Custom || declared {
            return view;
        }
        if self.handler == Handler::ObjectDetector {
            let image = json!({"size": DETECTOR_WARMUP, "resize": "none"});
            let input = json!({"name": "data", "datatype": "BYTES", "shape": [-1], "image": image});
            view.insert("inputs".into(), json!([input]));
            return view;
        }
        view.insert(
            "inputs".into(),
            json!([{
                "name": "data",
                "datatype": "BYTES",
                "shape": [-1],
                "image": {
                    "size": [224, 224],
                    "resize": "center_crop",
                    "shorter_side": 256,
                    "mean": MEAN,
                    "std": STD,
                }
            }]),
        );
        if self.handler == Handler::ImageClassifier && !raw.contains_key("outputs") {
            let classes = self.labels.as_ref().map_or(-1, |l| l.len() as i64);
            view.insert(
                "outputs".into(),
                json!([{"name": "output__0", "datatype": "FP32", "shape": [-1, classes]}]),
            );
        }
        view
    }

    /// `image_classifier`'s post-processing as a `labels` block of the first output: the
    /// softmax's top 5, named by `index_to_name.json`; without one, TorchServe names the
    /// classes by index ([`by_index`], made once the output's width is known).
    pub fn labels_block(&self) -> Option<Labels> {
        if self.handler != Handler::ImageClassifier {
            return None;
        }
        self.labels.clone().map(|names| Labels {
            top_k: names.len().min(TOP_K),
            names,
            softmax: true,
        })
    }
}

/// `image_classifier`'s post-processing for an archive without class names: `classes`
/// named by their index.
pub fn by_index(classes: usize) -> Labels {
    Labels {
        names: (0..classes).map(|i| i.to_string()).collect(),
        top_k: classes.min(TOP_K),
        softmax: true,
    }
}

/// The refusal of an archive whose handler is Python vramfork does not run, naming what
/// to write in the metadata instead.
pub fn custom_refusal(shown: &str, handler: &str) -> String {
    let handler = if handler.is_empty() { "none" } else { handler };
    format!(
        "{shown}: its handler ({handler}) is Python code vramfork does not run (only `image_classifier`, `image_segmenter` and `object_detector` are served as they are). Declare what the handler's preprocess did as the model's `inputs` in the metadata — an `image` block for images (size, resize, mean, std), a `tokenizer` block for text, plain tensors otherwise — and its postprocess as `outputs` (a `labels` block for class names); the archive's model is then served with them (docs/migrating.md, \"Coming from TorchServe\", has the common handlers written out)"
    )
}

/// The refusal of an `object_detector` archive whose model is a `.pt2`: a program takes
/// tensors, not the list of images a torchvision detector's `forward` takes.
pub fn detector_pt2(shown: &str, file: &str) -> String {
    format!(
        "{shown}: object_detector's model {file} is a torch.export program, which takes tensors, not the list of images a torchvision detector takes: script the detector (`torch.jit.script(model).save(\"model.pt\")`, its `forward(images: List[Tensor])` returning `(losses, detections)`) and archive that file with `--serialized-file model.pt`"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_names_as_torchserve_takes_them() {
        assert_eq!(Handler::of("image_classifier"), Handler::ImageClassifier);
        assert_eq!(
            Handler::of("ts.torch_handler.image_classifier"),
            Handler::ImageClassifier
        );
        assert_eq!(
            Handler::of("image_classifier:handle"),
            Handler::ImageClassifier
        );
        assert_eq!(
            Handler::of("ts.torch_handler.image_segmenter"),
            Handler::ImageSegmenter
        );
        assert_eq!(
            Handler::of("ts.torch_handler.object_detector"),
            Handler::ObjectDetector
        );
        assert_eq!(Handler::of("object_detector"), Handler::ObjectDetector);
        assert_eq!(Handler::of("handler.py"), Handler::Custom);
        assert_eq!(Handler::of("text_classifier"), Handler::Custom);
        assert_eq!(Handler::of(""), Handler::Custom);
    }
}
