//! A `torch.export` program (a `.pt2` of `torch.export.save`): its signature read and checked
//! against the metadata, then loaded with libtorch's Native Runtime (`crate::exported`) on the
//! device it was exported on.

use tch::Device;

use super::declared::Declared;
use super::load_error::{first_line, LoadError};
use super::Model;
use crate::exported;

/// A `torch.export` archive: its signature read and checked against the metadata, then its
/// program loaded with the Native Runtime, on the device it was exported on.
pub fn load(path: &str, device: Device, declared: &Declared) -> Result<Model, LoadError> {
    let fail = |reason: String| LoadError::Model {
        path: path.into(),
        reason,
    };
    let (name, signature, out_spec) = exported::open(path).map_err(|e| fail(exported_line(&e)))?;
    let on_gpu = signature.device == "cuda";
    if let (Device::Cuda(_), Some(i @ 1..)) = (device, signature.device_index) {
        // torch::nativert::ModelRunner applies an empty Placement (no device map) and
        // ModelRunnerHandle takes no device: weights and graph stay where they were saved.
        return Err(fail(format!(
            "it was exported on cuda:{i}, and the Native Runtime runs it on the device it was exported on (ModelRunnerHandle takes no device), while a worker sees its own GPU as cuda:0: export it with the model and example inputs on cuda:0"
        )));
    }
    match (device, on_gpu) {
        (Device::Cuda(_), false) => return Err(fail(
            "it was exported on the CPU (its inputs and weights are CPU tensors), but this worker runs on a GPU: export the model and its example inputs on the GPU to serve it there, or serve it with --device cpu".into(),
        )),
        (Device::Cpu, true) => return Err(fail(
            "it was exported on a GPU (its inputs and weights are CUDA tensors), but this worker runs on the CPU: export it on the CPU to serve it there".into(),
        )),
        _ => {}
    }
    signature
        .check_declared(declared.inputs.as_deref(), declared.max_batch_size)
        .map_err(fail)?;
    exported::Program::load(path, &name, signature, out_spec.as_deref())
        .map(Model::Exported)
        .map_err(|e| fail(exported_line(&e)))
}

/// The archive reader's or the Native Runtime's message, on one line, with the way out for
/// a file that is no archive at all.
fn exported_line(msg: &str) -> String {
    let line = first_line(msg);
    if line.contains("PytorchStreamReader failed") || line.contains("not a TorchScript archive") {
        let detail = msg.lines().next().unwrap_or(msg);
        let detail = detail.split(". ").next().unwrap_or(detail);
        return format!(
            "not a torch.export archive ({detail}); save the model with torch.export.save(torch.export.export(model, example_inputs), path)"
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::load::load;

    /// A `.pt2` runs where it was exported: a CPU export on a worker placed on a GPU is
    /// refused before anything touches CUDA, naming the way out.
    #[test]
    fn a_program_exported_on_the_cpu_is_refused_on_a_gpu_worker() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/mlp.pt2");
        let declared = Declared::default();
        let Err(e) = load(path, Device::Cuda(0), None, &declared) else {
            panic!("a CPU export loaded for a GPU worker");
        };
        let msg = e.to_string();
        assert!(
            msg.contains("it was exported on the CPU")
                && msg.contains("or serve it with --device cpu"),
            "{msg}"
        );
        assert_eq!(e.exit_code(), vramfork::protocol::worker_exit::MODEL_LOAD);
        assert!(load(path, Device::Cpu, None, &declared).is_ok());
    }
}
