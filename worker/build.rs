//! Links the worker against libtorch: an rpath to `$LIBTORCH/lib` (so it runs without
//! `LD_LIBRARY_PATH`), libtorch's CUDA libraries kept even though no Rust symbol needs them
//! (so CUDA is available on GPU machines), the C++ shims of `shim/` as one library (the
//! allocator's, the `torch.export` one's and their error channel); and the KServe v2 gRPC
//! messages from `proto/inference.proto` (parsed by `protox`, written by `prost-build`: no
//! system `protoc`), included by `src/grpc/pb.rs`.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    println!("cargo:rerun-if-changed=shim");

    let libtorch = PathBuf::from(env::var("LIBTORCH").unwrap_or_else(|_| {
        panic!("LIBTORCH is not set: run `source scripts/env.sh` first (it installs libtorch)")
    }));
    let lib = libtorch.join("lib");
    let abi = env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    let has_cuda = lib.join("libtorch_cuda.so").exists();
    if has_cuda {
        for arg in [
            "-Wl,--no-as-needed",
            "-ltorch_cuda",
            "-ltorch",
            "-lc10_cuda",
            "-Wl,--as-needed",
        ] {
            println!("cargo:rustc-link-arg={arg}");
        }
    }
    build_shim(&libtorch, &abi, has_cuda);
    check_cuda_version(&libtorch);
    build_proto();
}

/// `proto/inference.proto` → `$OUT_DIR/inference.rs` (the messages; the service is routed by
/// hand in `src/grpc/`).
fn build_proto() {
    println!("cargo:rerun-if-changed=proto/inference.proto");
    let fds = protox::compile(["proto/inference.proto"], ["proto"])
        .unwrap_or_else(|e| panic!("proto/inference.proto: {e}"));
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the gRPC messages: {e}"));
}

/// The CUDA version `vramfork::protocol::CUDA_BUILD_VERSION` states (13.0 = 13000); the
/// master plans and refuses old drivers by it, so the libtorch linked here must say the same.
const CUDA_BUILD: &str = "13.0";

/// Fails the build when the libtorch's `version.py` names another CUDA version than
/// [`CUDA_BUILD`] (a CPU-only libtorch, `cuda = None`, is allowed: it never uses a GPU).
fn check_cuda_version(libtorch: &Path) {
    let file = libtorch.join("version.py");
    println!("cargo:rerun-if-changed={}", file.display());
    let Ok(text) = std::fs::read_to_string(&file) else {
        return;
    };
    let cuda = text
        .lines()
        .find(|l| l.starts_with("cuda"))
        .and_then(|l| l.split('\'').nth(1));
    if let Some(v) = cuda {
        assert!(
            v == CUDA_BUILD,
            "{} says libtorch is built with CUDA {v}, but vramfork states CUDA {CUDA_BUILD} \
             (protocol::CUDA_BUILD_VERSION and worker/build.rs): update both",
            file.display()
        );
    }
}

/// The shims in `shim/`, one C++17 library against libtorch's headers with its ABI: the
/// allocator's (`cuda.cpp`, over c10's CUDA caching allocator, which tch does not expose),
/// the `torch.export` one (`export.cpp`, libtorch_cpu's archive reader, Native Runtime and
/// AOTInductor runner, which tch does not reach) and their one error channel (`error.cpp`).
fn build_shim(libtorch: &Path, abi: &str, has_cuda: bool) {
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++17")
        .files(["shim/error.cpp", "shim/cuda.cpp", "shim/export.cpp"])
        .include(libtorch.join("include"))
        .include(libtorch.join("include/torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", abi)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    let site = libtorch.parent().unwrap_or(libtorch);
    for dir in [
        site.join("nvidia/cu13/include"),
        site.join("triton/backends/nvidia/include"),
    ] {
        if dir.exists() {
            b.include(dir);
        }
    }
    if !has_cuda {
        // A CPU-only libtorch has no c10_cuda: the allocator's shim then reports "no CUDA"
        // for everything.
        b.define("VF_NO_CUDA_BUILD", "1");
    }
    b.compile("vf_shim");
    if has_cuda {
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
