#include "tools/torch_save_file.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include "ipc/log.hpp"
#include "tools/bad_input.hpp"
#include "tools/pickle_compat.hpp"

namespace ferry::tools {
namespace {

// What `path` is, from its first bytes, where it is not a zip archive.
std::string what_else(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw BadInput("cannot read --input '" + path + "': " + std::strerror(errno));
  char head[4] = {};
  f.read(head, sizeof head);
  if (f.gcount() == 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return "";
  if (f.gcount() >= 1 && static_cast<unsigned char>(head[0]) == 0x80) {
    return "a pickle without torch.save's zip archive (torch.save before PyTorch 1.6 or with "
           "_use_new_zipfile_serialization=False, or pickle.dump)";
  }
  return "not a file of torch.save";
}

c10::IValue unpickle(caffe2::serialize::PyTorchStreamReader& zip, const std::string& path) {
  const auto [data, size] = zip.getRecord("data.pkl");
  const std::string pickle =
      pickle_for_libtorch(std::string(static_cast<const char*>(data.get()), size));
  // torch.save(..., pickle_protocol=4), say; LibTorch's unpickler says only "found protocol = ".
  if (pickle.size() >= 2 && static_cast<unsigned char>(pickle[0]) == 0x80 && pickle[1] != 2) {
    throw BadInput("--input '" + path + "' was pickled with protocol " +
                   std::to_string(static_cast<int>(pickle[1])) +
                   ", where LibTorch reads 2 only, torch.save's default: leave out torch.save's "
                   "pickle_protocol");
  }
  std::size_t pos = 0;
  auto read = [&](char* to, std::size_t n) {
    n = std::min(n, pickle.size() - pos);
    std::memcpy(to, pickle.data() + pos, n);
    pos += n;
    return n;
  };
  auto record = [&](const std::string& name) { return std::get<0>(zip.getRecord("data/" + name)); };
  torch::jit::Unpickler unpickler(read, nullptr, nullptr, record, at::Device(at::kCPU));
  unpickler.set_version(zip.version());
  return unpickler.parse_ivalue();
}

}  // namespace

c10::IValue read_torch_save(const std::string& path) {
  const std::string remedy = ": save a tensor, or a list, tuple or dict of them, with torch.save";
  if (const std::string what = what_else(path); !what.empty()) {
    throw BadInput("--input '" + path + "' is " + what + remedy);
  }
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const c10::Error& e) {
    ferry::log().debug("reading --input '{}' as a zip archive: {}", path, e.what());
    throw BadInput("--input '" + path + "' is a zip archive LibTorch cannot read (" +
                   e.what_without_backtrace() + ")" + remedy);
  }
  if (zip->hasRecord("constants.pkl")) {
    throw BadInput("--input '" + path +
                   "' is a TorchScript module (torch.jit.save), not tensors: give it as --model");
  }
  if (!zip->hasRecord("data.pkl")) {
    throw BadInput("--input '" + path + "' is a zip archive but not a file of torch.save" + remedy);
  }
  try {
    return unpickle(*zip, path);
  } catch (const BadInput&) {
    throw;
  } catch (const c10::Error& e) {
    ferry::log().debug("unpickling --input '{}': {}", path, e.what());
    throw BadInput("--input '" + path + "' holds something LibTorch cannot read (" +
                   e.what_without_backtrace() + ")" + remedy);
  } catch (const std::exception& e) {
    throw BadInput("--input '" + path + "' holds something LibTorch cannot read (" + e.what() +
                   ")" + remedy);
  }
}

}  // namespace ferry::tools
