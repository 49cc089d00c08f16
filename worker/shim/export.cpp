// vramfork worker: a tiny C ABI over what tch does not reach for `torch.export` archives
// (`.pt2`): reading the archive's records (caffe2::serialize::PyTorchStreamReader, the reader
// libtorch itself opens them with) and running an ExportedProgram with libtorch's Native
// Runtime (torch::nativert::ModelRunnerHandle), and running an AOTInductor package's compiled
// model (torch::inductor::AOTIModelContainerRunner, from the runner registry
// AOTIModelPackageLoader itself uses, on a .so the worker unpacked into its own directory:
// the package loader unpacks into a fresh /tmp/XXXXXX it names itself). Tensors cross as
// `at::Tensor*`, the way tch's own C API passes them: inputs are borrowed, outputs are
// `new at::Tensor` the caller owns. Errors go through the shims' one channel (error.h):
// status 0 ok, 2 an error.

#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/nativert/ModelRunnerHandle.h>

#include <unistd.h>

#include "error.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using vf::guarded;

// `s` copied into a malloc'ed buffer the caller frees with vf_export_free_bytes.
void give(const std::string& s, char** out, size_t* len) {
  char* buf = static_cast<char*>(std::malloc(s.size() + 1));
  if (buf == nullptr) {
    throw std::bad_alloc();
  }
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  *out = buf;
  *len = s.size();
}

// The tensors of `v`, in its pytree's order (a tuple's or list's items, a dict's values in
// its keys' order: the order of the program's output spec, which the Native Runtime builds
// the dict in), nested containers included.
void leaves(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) {
      leaves(e, out);
    }
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) {
      leaves(e, out);
    }
  } else if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      leaves(e.value(), out);
    }
  } else {
    throw std::runtime_error("the program returned a " + v.tagKind() +
                             " among its outputs, which is not served (only tensors are)");
  }
}

// The output tensors of one pass: a tensor alone (`*single` 1), or the tensors of a tuple,
// list or dict (nested ones too), flat; the caller names them by the program's output spec.
void flatten(const c10::IValue& v, std::vector<at::Tensor>& out, int* single) {
  *single = v.isTensor() ? 1 : 0;
  leaves(v, out);
}

}  // namespace

extern "C" {

// Frees a buffer this shim malloc'ed (record bytes, names, an output array).
void vf_export_free_bytes(void* bytes) noexcept { std::free(bytes); }

// Opens the archive once: every later call on it (its records, their sizes, reading and
// unpacking them) shares this one reader, whose construction reads the zip's central
// directory.
int vf_archive_open(const char* path, void** out) noexcept {
  return guarded([&] {
    *out = new caffe2::serialize::PyTorchStreamReader{std::string(path)};
    return VF_OK;
  });
}

void vf_archive_close(void* archive) noexcept {
  try {
    delete static_cast<caffe2::serialize::PyTorchStreamReader*>(archive);
  } catch (...) {
  }
}

// The archive's record names (without the archive's top folder), one per line, each after
// the size it unpacks to (as its central-directory entry declares it) and a tab. Nothing of
// a record's data is read.
int vf_archive_records(void* archive, size_t max_records, char** out, size_t* len) noexcept {
  return guarded([&] {
    auto* reader = static_cast<caffe2::serialize::PyTorchStreamReader*>(archive);
    auto names = reader->getAllRecords();
    std::string text;
    if (names.size() > max_records) {
      // Too many to be worth sizing: the count alone, for the caller's refusal.
      text = std::to_string(names.size()) + "\n";
      give(text, out, len);
      return VF_OK;
    }
    for (const auto& r : names) {
      text += std::to_string(reader->getRecordSize(r));
      text += '\t';
      text += r;
      text += '\n';
    }
    give(text, out, len);
    return VF_OK;
  });
}

// One record, whole, into `dst` (`n` bytes: the size its entry declares, which the caller
// checked and allocated).
int vf_archive_read(void* archive, const char* record, void* dst, size_t n) noexcept {
  return guarded([&] {
    auto* reader = static_cast<caffe2::serialize::PyTorchStreamReader*>(archive);
    size_t got = reader->getRecord(std::string(record), dst, n);
    if (got != n) {
      throw std::runtime_error("record " + std::string(record) + " read " + std::to_string(got) +
                               " bytes of " + std::to_string(n));
    }
    return VF_OK;
  });
}

// One record written to the open file `fd`, in chunks of `chunk` bytes (never whole in
// memory); `n` is the size its entry declares, which the caller checked.
int vf_archive_extract(void* archive, const char* record, size_t n, size_t chunk, int fd) noexcept {
  return guarded([&] {
    auto* reader = static_cast<caffe2::serialize::PyTorchStreamReader*>(archive);
    std::vector<char> buf(chunk);
    auto iter = reader->createChunkReaderIter(std::string(record), n, chunk);
    size_t done = 0;
    while (done < n) {
      size_t got = iter.next(buf.data());
      if (got == 0) {
        throw std::runtime_error("record " + std::string(record) + " ended after " +
                                 std::to_string(done) + " bytes of " + std::to_string(n));
      }
      size_t off = 0;
      while (off < got) {
        ssize_t w = ::write(fd, buf.data() + off, got - off);
        if (w < 0 && errno == EINTR) {
          continue;
        }
        if (w <= 0) {
          throw std::runtime_error("cannot write record " + std::string(record) + ": " +
                                   std::strerror(errno));
        }
        off += static_cast<size_t>(w);
      }
      done += got;
    }
    return VF_OK;
  });
}

// Loads the archive's model `name` (models/<name>.json) with the Native Runtime.
int vf_export_load(const char* path, const char* name, void** out) noexcept {
  return guarded([&] {
    *out = new torch::nativert::ModelRunnerHandle(std::string(path), std::string(name));
    return VF_OK;
  });
}

void vf_export_free(void* program) noexcept {
  try {
    delete static_cast<torch::nativert::ModelRunnerHandle*>(program);
  } catch (...) {
  }
}

// One pass: `n` borrowed input tensors in; `*n_out` owned output tensors out, in a malloc'ed
// array the caller frees with vf_export_free_bytes (each tensor it takes over, as tch does).
// `*single`: the program returned one tensor (1), or a tuple, list or dict of them (0).
int vf_export_run(void* program, const at::Tensor* const* inputs, size_t n, at::Tensor*** outputs,
                  size_t* n_out, int* single) noexcept {
  return guarded([&] {
    auto* runner = static_cast<torch::nativert::ModelRunnerHandle*>(program);
    std::vector<c10::IValue> args;
    args.reserve(n);
    for (size_t i = 0; i < n; i++) {
      args.emplace_back(*inputs[i]);
    }
    c10::IValue result = runner->run(args, {});
    std::vector<at::Tensor> flat;
    flatten(result, flat, single);
    auto** arr = static_cast<at::Tensor**>(std::malloc(sizeof(at::Tensor*) * (flat.size() + 1)));
    if (arr == nullptr) {
      throw std::bad_alloc();
    }
    for (size_t i = 0; i < flat.size(); i++) {
      arr[i] = new at::Tensor(std::move(flat[i]));
    }
    *outputs = arr;
    *n_out = flat.size();
    return VF_OK;
  });
}

// Loads an AOTInductor model (`so_path`, unpacked from its package) for `device` ("cpu",
// "cuda:0"...), with `bin_dir` where its other files (CUDA kernels) lie. The runner registry
// is keyed by device type ("cpu", "cuda": RegisterAOTIModelRunner's keys, which
// AOTIModelPackageLoader looks up by the package's AOTI_DEVICE_KEY); the full device string,
// index included, is what the runner itself is given.
int vf_aoti_load(const char* so_path, const char* device, const char* bin_dir, void** out) noexcept {
  return guarded([&] {
    std::string full(device);
    std::string type = full.substr(0, full.find(':'));
    auto& registry = torch::inductor::getAOTIModelRunnerRegistry();
    auto found = registry.find(type);
    if (found == registry.end()) {
      throw std::runtime_error("no AOTInductor runner for device type " + type +
                               " in this libtorch");
    }
    auto runner = found->second(std::string(so_path), 1, full, std::string(bin_dir), false);
    *out = runner.release();
    return VF_OK;
  });
}

void vf_aoti_free(void* runner) noexcept {
  try {
    delete static_cast<torch::inductor::AOTIModelContainerRunner*>(runner);
  } catch (...) {
  }
}

// The model's call spec: its input and output pytree specs (JSON), one per line.
int vf_aoti_call_spec(void* runner, char** out, size_t* len) noexcept {
  return guarded([&] {
    auto* r = static_cast<torch::inductor::AOTIModelContainerRunner*>(runner);
    std::string text;
    for (const auto& s : r->get_call_spec()) {
      text += s;
      text += '\n';
    }
    give(text, out, len);
    return VF_OK;
  });
}

// One pass of an AOTInductor model, as vf_export_run (its outputs are always a flat list:
// `*single` is left to the caller, who reads the output spec).
int vf_aoti_run(void* runner, const at::Tensor* const* inputs, size_t n, at::Tensor*** outputs,
                size_t* n_out) noexcept {
  return guarded([&] {
    auto* r = static_cast<torch::inductor::AOTIModelContainerRunner*>(runner);
    std::vector<at::Tensor> args;
    args.reserve(n);
    for (size_t i = 0; i < n; i++) {
      args.push_back(*inputs[i]);
    }
    std::vector<at::Tensor> flat = r->run(args);
    auto** arr = static_cast<at::Tensor**>(std::malloc(sizeof(at::Tensor*) * (flat.size() + 1)));
    if (arr == nullptr) {
      throw std::bad_alloc();
    }
    for (size_t i = 0; i < flat.size(); i++) {
      arr[i] = new at::Tensor(std::move(flat[i]));
    }
    *outputs = arr;
    *n_out = flat.size();
    return VF_OK;
  });
}

}  // extern "C"
