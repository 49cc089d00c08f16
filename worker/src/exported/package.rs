//! What an AOTInductor package (`torch._inductor.aoti_compile_and_package`) says of itself,
//! read from its records before anything of it is loaded: its metadata
//! (`<wrapper>_metadata.json`: `AOTI_DEVICE_KEY`, `AOTI_CPU_ISA`, `AOTI_COMPUTE_CAPABILITY`),
//! its generated C++ (the kernels' OpenMP teams; the wrapper's `check_input_<k>` functions,
//! the only record of each input's dtype and bounds), and the checks made with them at boot.
//!
//! torch 2.11 records no torch version in a package (the archive's `.data/version` is the
//! archive format's); a package lowered by another torch is caught, if at all, by the load
//! itself (the runtime's own message).

use std::collections::BTreeMap;

use serde_json::Value;
use vramfork::metadata::Dtype;

use super::placement::{capability_mismatch, Placement};
use super::signature::{Dim, Input, Signature};

/// The records of one model of a package (`data/aotinductor/<model>/…`), by file name.
#[derive(Debug, Clone)]
pub struct Contents {
    /// `data/aotinductor/<model>/`.
    pub prefix: String,
    /// The file names under it.
    pub files: Vec<String>,
}

/// The one model of a package, from its record names: every name under the model's folder
/// must be a plain relative path ([`safe_relative`]), or the package is refused naming it —
/// the library loaded is one of these names, so none may lead outside the folder it is
/// unpacked into.
pub fn contents(records: &[String]) -> Result<Contents, String> {
    let mut models: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in records {
        let Some(rest) = r.strip_prefix("data/aotinductor/") else {
            continue;
        };
        if let Some((model, file)) = rest.split_once('/') {
            if !safe_relative(model) || !safe_relative(file) {
                return Err(format!(
                    "its record {r} names a path outside the package's folder (a `..`, `.` or empty part, or a hidden name): refused, as a package torch wrote never holds one"
                ));
            }
            models.entry(model).or_default().push(file.to_string());
        }
    }
    match models.len() {
        1 => {
            let (model, files) = models.into_iter().next().expect("one model");
            Ok(Contents {
                prefix: format!("data/aotinductor/{model}/"),
                files,
            })
        }
        0 => Err("an AOTInductor package with no model under data/aotinductor/".into()),
        n => Err(format!(
            "the package holds {n} models ({}); vramfork serves one: package one model per file",
            models.keys().copied().collect::<Vec<_>>().join(", ")
        )),
    }
}

/// A record path that stays inside the directory it is unpacked into: relative, no `..`,
/// no empty or hidden component.
pub fn safe_relative(file: &str) -> bool {
    !file.is_empty()
        && !file.starts_with('/')
        && file
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.'))
}

/// Whether the wrapper was compiled with its weights in the CUDA caching allocator
/// (`aot_inductor.weight_use_caching_allocator`, which Inductor passes as the macro
/// `AOT_INDUCTOR_USE_CACHING_ALLOCATOR`): read from the compile command Inductor writes
/// after `// Compile cmd` at the wrapper's end. Without it the weights are `cudaMalloc`ed,
/// outside the allocator and its cap.
pub fn weights_in_allocator(wrapper: &str) -> bool {
    let Some((_, tail)) = wrapper.rsplit_once("// Compile cmd") else {
        return false;
    };
    tail.lines()
        .take_while(|l| !l.starts_with("// Link cmd"))
        .any(|l| l.starts_with("//") && l.contains("AOT_INDUCTOR_USE_CACHING_ALLOCATOR"))
}

impl Contents {
    fn ending(&self, suffix: &str) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .files
            .iter()
            .filter(|f| f.ends_with(suffix))
            .map(String::as_str)
            .collect();
        v.sort();
        v
    }

    /// The compiled model (`<hash>.wrapper.so`, or the one `.so`).
    pub fn library(&self) -> Result<&str, String> {
        let wrapper = self.ending(".wrapper.so");
        let any = self.ending(".so");
        wrapper.first().or(any.first()).copied().ok_or_else(|| {
            "the package holds C++ sources but no compiled model (.so): it was packaged with aot_inductor.package_cpp_only, which needs a compiler at load; package it with the default (compiled) settings"
                .to_string()
        })
    }

    /// The wrapper's C++ (`<hash>.wrapper.cpp`).
    pub fn wrapper_source(&self) -> Result<&str, String> {
        self.ending(".wrapper.cpp").first().copied().ok_or_else(|| {
            "the package holds no wrapper source (<hash>.wrapper.cpp), from which vramfork reads the model's inputs and checks its kernels' threads: package it with torch._inductor.aoti_compile_and_package's defaults"
                .to_string()
        })
    }

    /// Every generated C++ file (the wrapper's and the kernels').
    pub fn sources(&self) -> Vec<&str> {
        self.ending(".cpp")
    }

    /// The metadata beside the wrapper (`<hash>.wrapper_metadata.json`), else any.
    pub fn metadata(&self) -> Option<&str> {
        let wrapper = self.ending(".wrapper_metadata.json");
        let any = self.ending("_metadata.json");
        wrapper.first().or(any.first()).copied()
    }
}

/// The package's metadata (string values), from its JSON.
pub fn parse_metadata(json: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let doc: Value = serde_json::from_slice(json)
        .map_err(|e| format!("the package's metadata is not JSON: {e}"))?;
    let obj = doc
        .as_object()
        .ok_or("the package's metadata is not a JSON object")?;
    Ok(obj
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect())
}

/// The package against where the plan put this worker: compiled for its device, and for
/// an instruction set this CPU has (on the CPU) or its GPU's compute capability (on a GPU).
pub fn check_metadata(meta: &BTreeMap<String, String>, at: &Placement) -> Result<(), String> {
    let get = |k: &str| meta.get(k).map(String::as_str).unwrap_or("");
    match (get("AOTI_DEVICE_KEY"), at.gpu) {
        ("cpu", false) => {}
        ("cuda", false) => return Err(
            "it is an AOTInductor package compiled for CUDA (AOTI_DEVICE_KEY cuda), but this worker runs on the CPU: compile it with the model and example inputs on the CPU to serve it there, or serve it on a GPU".into(),
        ),
        ("cpu", true) => return Err(
            "it is an AOTInductor package compiled for the CPU (AOTI_DEVICE_KEY cpu), but this worker runs on a GPU: serve it with --device cpu, or compile it on the GPU (the model and example inputs on cuda)".into(),
        ),
        ("cuda", true) => {
            let cc = get("AOTI_COMPUTE_CAPABILITY");
            if let Some(why) = at.capability.as_deref().and_then(|g| capability_mismatch(cc, g)) {
                return Err(why);
            }
            if !at.cuda {
                return Err(
                    "it is an AOTInductor package compiled for CUDA, and --simulated-gpus runs the model on the CPU: serve it on a real GPU".into(),
                );
            }
            return Ok(());
        }
        (other, _) => return Err(format!(
            "it is an AOTInductor package for the device {other:?} (AOTI_DEVICE_KEY); vramfork serves CPU and CUDA packages"
        )),
    }
    let isa = meta.get("AOTI_CPU_ISA").map(String::as_str).unwrap_or("");
    match cpu_has(isa) {
        Some(true) | None => Ok(()),
        Some(false) => Err(format!(
            "its kernels were compiled for {isa} (AOTI_CPU_ISA, from -march=native on the machine that compiled it), which this CPU lacks: compile the package on a machine of this CPU's kind, or serve the ExportedProgram (torch.export.save), which compiles nothing"
        )),
    }
}

/// Whether this CPU runs code compiled for `isa` (torch's names: `AVX2`, `AVX512`, …;
/// `None`: a name this check does not know, or none, left to the load).
fn cpu_has(isa: &str) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        match isa {
            "AVX2" => Some(has!("avx2") && has!("fma")),
            "AVX512" => {
                Some(has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq"))
            }
            "NEON" | "SVE256" | "SVE128" | "ZVECTOR" | "VSX" => Some(false),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        None
    }
}

/// A kernel that fixed its OpenMP team at compile time (`#pragma omp parallel
/// num_threads(N)`: Inductor's default, the compiling machine's core count) ignores
/// `--torch-threads` and oversubscribes every worker.
pub fn check_threads(file: &str, source: &str) -> Result<(), String> {
    for line in source.lines() {
        let line = line.trim_start();
        if !(line.starts_with("#pragma omp") && line.contains("parallel")) {
            continue;
        }
        if let Some(rest) = line.split("num_threads(").nth(1) {
            let n = rest.split(')').next().unwrap_or("?");
            return Err(format!(
                "its CPU kernels fix their thread count at {n} ({file}: \"#pragma omp parallel num_threads({n})\", the compiling machine's cores), which would ignore --torch-threads and oversubscribe every worker: compile it with TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1 set"
            ));
        }
    }
    Ok(())
}

/// The dtype the wrapper names (`aoti_torch_dtype_float32()`).
fn dtype_named(name: &str) -> Option<Dtype> {
    Some(match name {
        "uint8" => Dtype::UInt8,
        "int8" => Dtype::Int8,
        "int16" => Dtype::Int16,
        "int32" => Dtype::Int32,
        "int64" => Dtype::Int64,
        "float16" => Dtype::Float16,
        "float32" => Dtype::Float32,
        "float64" => Dtype::Float64,
        "bool" => Dtype::Bool,
        "bfloat16" => Dtype::BFloat16,
        _ => return None,
    })
}

/// The number after `prefix` in `s` (`size[0] > 64` → after `> `).
fn number_after(s: &str, prefix: &str) -> Option<i64> {
    let rest = s.split(prefix).nth(1)?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// The dimension index in `…size[<i>]…`.
fn index_in(s: &str, what: &str) -> Option<usize> {
    let rest = s.split(&format!("_{what}[")).nth(1)?;
    rest.split(']').next()?.parse().ok()
}

/// One `check_input_<k>` function of the wrapper: the input's dtype and each dimension.
fn parse_check(body: &str) -> Result<(Option<Dtype>, Vec<Dim>), String> {
    let mut dtype = None;
    let mut fixed: BTreeMap<usize, i64> = BTreeMap::new();
    let mut lows: BTreeMap<usize, i64> = BTreeMap::new();
    let mut highs: BTreeMap<usize, i64> = BTreeMap::new();
    let mut rank = 0;
    for line in body.lines().map(str::trim) {
        if line.contains("_expected_dtype = aoti_torch_dtype_") {
            let name = line
                .split("aoti_torch_dtype_")
                .nth(1)
                .and_then(|r| r.split('(').next())
                .unwrap_or("");
            dtype = dtype_named(name);
        }
        for what in ["size", "stride"] {
            if let Some(i) = index_in(line, what) {
                rank = rank.max(i + 1);
            }
        }
        if !line.starts_with("if (") {
            continue;
        }
        let Some(i) = index_in(line, "size") else {
            continue;
        };
        if line.contains("] < ") {
            lows.insert(i, number_after(line, "] < ").unwrap_or(0));
        } else if line.contains("] > ") {
            if let Some(n) = number_after(line, "] > ") {
                highs.insert(i, n);
            }
        } else if line.contains(" != ") {
            if let Some(n) = number_after(line, "if (") {
                fixed.insert(i, n);
            }
        }
    }
    let dims = (0..rank)
        .map(|i| match fixed.get(&i) {
            Some(&n) => Dim::Fixed(n),
            None => Dim::Dynamic {
                symbol: format!("d{i}"),
                min: lows.get(&i).copied().unwrap_or(0),
                max: highs.get(&i).copied(),
            },
        })
        .collect();
    Ok((dtype, dims))
}

/// The model's inputs as the wrapper's generated checks state them (`names`: what to call
/// them in messages, the metadata's declared names when it declares them).
pub fn parse_inputs(wrapper: &str, names: &[String]) -> Result<Signature, String> {
    let count = wrapper
        .lines()
        .filter(|l| l.trim_start().starts_with("inputs_info_[") && l.contains("].name ="))
        .count();
    let mut inputs = Vec::new();
    for k in 0..count {
        let head = format!("static void check_input_{k}(");
        let body = wrapper.split(&head).nth(1).ok_or_else(|| {
            format!("the package's wrapper has no check_input_{k}: vramfork reads each input's dtype and bounds from it")
        })?;
        let body = body.split("\n}\n").next().unwrap_or(body);
        let (dtype, dims) = parse_check(body)?;
        let name = names
            .get(k)
            .cloned()
            .unwrap_or_else(|| format!("input__{k}"));
        let dims = dims
            .into_iter()
            .map(|d| match d {
                Dim::Dynamic { symbol, min, max } => Dim::Dynamic {
                    symbol: format!("{name}.{symbol}"),
                    min,
                    max,
                },
                d => d,
            })
            .collect();
        inputs.push(Input {
            name,
            dtype,
            scalar: 0,
            dims,
        });
    }
    Ok(Signature {
        inputs,
        device: "cpu".into(),
        device_index: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What torch 2.11 generates for `x: [Dim("batch", max=64), 4]` float32.
    const WRAPPER: &str = r#"
    inputs_info_[0].name = "arg4_1";
    constants_info_[0].name = "l1_weight";
AOTI_NOINLINE static void check_input_0(
    AtenTensorHandle* input_handles
) {
    int32_t arg4_1_expected_dtype = aoti_torch_dtype_float32();
    auto arg4_1_size = arg4_1.sizes();

    if (arg4_1_size[0] < 2) {
        ss << "input_handles[0]: dim value is too small at 0, "
    }

    if (arg4_1_size[0] > 64) {
        ss << "input_handles[0]: dim value is too large at 0, "
    }

    if (4 != arg4_1_size[1]) {
        ss << "input_handles[0]: unmatched dim value at 1, "
    }
    auto arg4_1_stride = arg4_1.strides();

    if (4 != arg4_1_stride[0]) {
    }
}
"#;

    #[test]
    fn the_wrappers_input_checks_give_dtype_and_bounds() {
        let s = parse_inputs(WRAPPER, &["x".into()]).unwrap();
        assert_eq!(s.inputs.len(), 1);
        let x = &s.inputs[0];
        assert_eq!(x.name, "x");
        assert_eq!(x.dtype, Some(Dtype::Float32));
        assert_eq!(
            x.dims,
            vec![
                Dim::Dynamic {
                    symbol: "x.d0".into(),
                    min: 2,
                    max: Some(64)
                },
                Dim::Fixed(4)
            ]
        );
        let unnamed = parse_inputs(WRAPPER, &[]).unwrap();
        assert_eq!(unnamed.inputs[0].name, "input__0");
        let broken = WRAPPER.replace("check_input_0", "check_something");
        assert!(parse_inputs(&broken, &[])
            .unwrap_err()
            .contains("no check_input_0"));
    }

    #[test]
    fn a_hard_coded_team_is_refused_naming_the_variable() {
        let fixed = "void k() {\n    #pragma omp parallel num_threads(64)\n    {}\n}";
        let e = check_threads("k.cpp", fixed).unwrap_err();
        assert!(e.contains("fix their thread count at 64"), "{e}");
        assert!(e.contains("TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1"), "{e}");
        let dynamic = "void k() {\n    #pragma omp parallel\n    {\n    #pragma omp for\n    }\n}";
        assert_eq!(check_threads("k.cpp", dynamic), Ok(()));
    }

    fn meta(device: &str, isa: &str) -> BTreeMap<String, String> {
        [
            ("AOTI_DEVICE_KEY", device),
            ("AOTI_CPU_ISA", isa),
            ("AOTI_COMPUTE_CAPABILITY", "90"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn gpu(capability: Option<&str>, cuda: bool) -> Placement {
        Placement {
            gpu: true,
            capability: capability.map(str::to_string),
            cuda,
        }
    }

    #[test]
    fn a_package_for_another_device_or_cpu_is_refused() {
        let cpu = Placement::default();
        assert_eq!(check_metadata(&meta("cpu", ""), &cpu), Ok(()));
        let e = check_metadata(&meta("cuda", ""), &cpu).unwrap_err();
        assert!(
            e.contains("compiled for CUDA") && e.contains("on the CPU"),
            "{e}"
        );
        let e = check_metadata(&meta("cpu", ""), &gpu(None, true)).unwrap_err();
        assert!(e.contains("--device cpu"), "{e}");
        let e = check_metadata(&meta("cpu", "NEON"), &cpu).unwrap_err();
        assert!(e.contains("compiled for NEON (AOTI_CPU_ISA"), "{e}");
        let e = check_metadata(&meta("xpu", ""), &cpu).unwrap_err();
        assert!(e.contains("\"xpu\""), "{e}");
    }

    #[test]
    fn a_cuda_package_runs_on_its_gpu_kind() {
        let cuda = meta("cuda", "AVX512");
        assert_eq!(check_metadata(&cuda, &gpu(Some("9.0"), true)), Ok(()));
        assert_eq!(check_metadata(&cuda, &gpu(None, true)), Ok(()), "not told");
        let e = check_metadata(&cuda, &gpu(Some("8.0"), true)).unwrap_err();
        assert!(e.contains("AOTI_COMPUTE_CAPABILITY 90"), "{e}");
        let e = check_metadata(&cuda, &gpu(Some("9.0"), false)).unwrap_err();
        assert!(e.contains("--simulated-gpus"), "{e}");
    }

    #[test]
    fn one_model_per_package() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = contents(&names(&[
            "data/aotinductor/model/a.wrapper.so",
            "data/aotinductor/model/a.wrapper.cpp",
            "data/aotinductor/model/b.kernel.cpp",
            "data/aotinductor/model/a.wrapper_metadata.json",
        ]))
        .unwrap();
        assert_eq!(c.prefix, "data/aotinductor/model/");
        assert_eq!(c.library(), Ok("a.wrapper.so"));
        assert_eq!(c.sources(), vec!["a.wrapper.cpp", "b.kernel.cpp"]);
        assert_eq!(c.metadata(), Some("a.wrapper_metadata.json"));
        let cpp_only = contents(&names(&["data/aotinductor/model/a.wrapper.cpp"])).unwrap();
        assert!(cpp_only.library().unwrap_err().contains("package_cpp_only"));
        let two = contents(&names(&[
            "data/aotinductor/a/x.so",
            "data/aotinductor/b/y.so",
        ]));
        assert!(two.unwrap_err().contains("holds 2 models (a, b)"));
    }

    /// A name under the model's folder that climbs out (`../`), is absolute inside it, or
    /// hides a part is refused naming the record, before anything is unpacked or loaded.
    #[test]
    fn a_record_naming_a_path_outside_the_package_is_refused() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for bad in [
            "data/aotinductor/model/../../../../tmp/x/outside.wrapper.so",
            "data/aotinductor/model//etc/x.so",
            "data/aotinductor/model/sub/.hidden.so",
            "data/aotinductor/../model/a.so",
        ] {
            let e = contents(&names(&["data/aotinductor/model/a.wrapper.so", bad])).unwrap_err();
            assert!(
                e.contains(&format!("its record {bad} names a path outside")),
                "{e}"
            );
        }
        assert!(safe_relative("a.wrapper.so"));
        assert!(safe_relative("triton/k.cubin"));
        for bad in ["", "/etc/x", "../x", "a/../x", ".hidden", "a//b"] {
            assert!(!safe_relative(bad), "{bad}");
        }
    }

    /// Inductor's compile command names the macro when the weights were compiled into the
    /// caching allocator (`-D  AOT_INDUCTOR_USE_CACHING_ALLOCATOR`); the sources themselves
    /// never decide it.
    #[test]
    fn the_compile_command_says_where_the_weights_are_allocated() {
        let tail = |defs: &str| {
            format!("}} // namespace torch::aot_inductor\n\n// Compile cmd\n// g++ /tmp/x.wrapper.cpp -D TORCH_INDUCTOR_CPP_WRAPPER{defs} -O1 -c -o /tmp/x.wrapper.o\n// Link cmd\n// g++ /tmp/x.wrapper.o -D AOT_INDUCTOR_USE_CACHING_ALLOCATOR -shared\n")
        };
        assert!(weights_in_allocator(&tail(
            " -D  AOT_INDUCTOR_USE_CACHING_ALLOCATOR"
        )));
        assert!(
            !weights_in_allocator(&tail("")),
            "only the compile command counts"
        );
        assert!(!weights_in_allocator(
            "#ifdef AOT_INDUCTOR_USE_CACHING_ALLOCATOR\n#endif\n"
        ));
    }
}
