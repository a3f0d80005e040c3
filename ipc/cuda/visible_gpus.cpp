#include "ipc/cuda/visible_gpus.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "ipc/log.hpp"

namespace ferry::cuda {
namespace {

// An entry's leading ordinal as the runtime reads it (strtoul-like: "1gpu" is 1), -1 for none.
long leading_ordinal(const std::string& entry) {
  std::size_t i = 0;
  while (i < entry.size() && std::isspace(static_cast<unsigned char>(entry[i]))) ++i;
  const std::size_t digits = i;
  while (i < entry.size() && std::isdigit(static_cast<unsigned char>(entry[i]))) ++i;
  if (i == digits || i - digits > 6) return -1;
  return std::strtol(entry.c_str() + digits, nullptr, 10);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int visible_count(const char* env, const std::vector<std::string>& uuids) {
  const int n = static_cast<int>(uuids.size());
  if (env == nullptr) return n;
  const std::string text = env;
  if (text.rfind("MIG-", 0) == 0) return -1;
  std::vector<int> seen;  // the devices chosen so far, by NVML index
  for (const std::string& entry : split(text)) {
    int device = -1;
    if (text.rfind("GPU-", 0) == 0) {
      if (entry.rfind("GPU-", 0) != 0) break;
      int matches = 0;
      for (int d = 0; d < n; ++d) {
        if (uuids[static_cast<std::size_t>(d)].rfind(entry, 0) == 0) {
          device = d;
          ++matches;
        }
      }
      if (matches != 1) break;  // no such device, or a prefix too short to name one
    } else {
      const long ordinal = leading_ordinal(entry);
      if (ordinal < 0 || ordinal >= n) break;
      device = static_cast<int>(ordinal);
    }
    if (std::find(seen.begin(), seen.end(), device) != seen.end()) return 0;
    seen.push_back(device);
  }
  return static_cast<int>(seen.size());
}

std::optional<std::vector<std::string>> nvml_uuids() noexcept {
  // NVML's C ABI, declared here: the toolkit ships no nvml.h everywhere, and the driver's
  // library is what the machine has.
  using Init = int (*)();
  using Shutdown = int (*)();
  using Count = int (*)(unsigned*);
  using Handle = int (*)(unsigned, void**);
  using Uuid = int (*)(void*, char*, unsigned);
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::nullopt;
  std::optional<std::vector<std::string>> out;
  auto init = reinterpret_cast<Init>(::dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<Shutdown>(::dlsym(lib, "nvmlShutdown"));
  auto count = reinterpret_cast<Count>(::dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<Handle>(::dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto uuid = reinterpret_cast<Uuid>(::dlsym(lib, "nvmlDeviceGetUUID"));
  if (init && shutdown && count && handle && uuid && init() == 0) {
    unsigned n = 0;
    if (count(&n) == 0) {
      std::vector<std::string> uuids;
      for (unsigned i = 0; i < n; ++i) {
        void* device = nullptr;
        char text[96] = {};
        if (handle(i, &device) != 0 || uuid(device, text, sizeof text) != 0) break;
        uuids.emplace_back(text);
      }
      if (uuids.size() == n) out = std::move(uuids);
    }
    shutdown();
  }
  ::dlclose(lib);
  return out;
}

int visible_gpus() noexcept {
  try {
    const auto uuids = nvml_uuids();
    if (!uuids) return 0;
    const int n = visible_count(std::getenv("CUDA_VISIBLE_DEVICES"), *uuids);
    if (n < 0) {
      log().info(
          "CUDA_VISIBLE_DEVICES names MIG instances, which ferry cannot count without "
          "initialising CUDA: no GPU in the default device list; name them (--devices cuda:0,...)");
      return 0;
    }
    return n;
  } catch (...) {
    return 0;
  }
}

}  // namespace ferry::cuda
