#include <dlfcn.h>

#include "../catch.hpp"

#include <string>

#include "ipc/cuda/devices.hpp"

namespace {

// Asked independently of the CUDA runtime, so the test can tell a probe that misses a driver
// from a machine that has none.
bool driver_loadable() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

#ifdef FERRY_HAVE_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

}  // namespace

TEST_CASE("cuda probe returns a consistent status", "[cuda]") {
  ferry::cuda::CudaStatus s;
  REQUIRE_NOTHROW(s = ferry::cuda::probe());
  CHECK(s.built_with_cuda == kBuiltWithCuda);
  // Either there are devices or there is a reason why not, never both or neither.
  CHECK(s.devices.empty() == !s.error.empty());
  // One row of the peer-access matrix per device, each as long as there are devices.
  REQUIRE(s.peer_access.size() == s.devices.size());
  for (std::size_t i = 0; i < s.peer_access.size(); ++i) {
    CHECK(s.peer_access[i].size() == s.devices.size());
    CHECK(s.peer_access[i][i]);
  }
  if (s.built_with_cuda) {
    CHECK(s.runtime_version >= 13000);
  } else {
    CHECK(s.error == "ferry was built without CUDA");
    CHECK_FALSE(s.driver_present);
  }

  // A second call must not trip over state (contexts, sticky errors) left by the first.
  ferry::cuda::CudaStatus again = ferry::cuda::probe();
  CHECK(again.devices.size() == s.devices.size());
  CHECK(again.error == s.error);
}

TEST_CASE("cuda probe without a driver says so plainly", "[cuda]") {
  if (driver_loadable()) {
    WARN("libcuda.so.1 loads on this machine; the no-driver path is not exercised");
    return;
  }
  ferry::cuda::CudaStatus s = ferry::cuda::probe();
  CHECK_FALSE(s.driver_present);
  CHECK(s.driver_version == 0);
  CHECK(s.devices.empty());
  REQUIRE_FALSE(s.error.empty());
  if (s.built_with_cuda) CHECK(contains(s.error, "no CUDA driver found"));
}

TEST_CASE("cuda probe runs its kernel on every device", "[cuda]") {
  ferry::cuda::CudaStatus s = ferry::cuda::probe();
  if (s.devices.empty()) {
    WARN("no CUDA device: " << s.error);
    return;
  }
  CHECK(s.driver_present);
  for (const ferry::cuda::DeviceInfo& d : s.devices) {
    INFO("device " << d.index << " (" << d.name << "): " << d.error);
    CHECK(d.uuid.rfind("GPU-", 0) == 0);
    CHECK(d.uuid.size() == 40);
    CHECK_FALSE(d.name.empty());
    CHECK(d.major > 0);
    CHECK(d.total_memory > 0);
    CHECK(d.kernel_ok);
    CHECK(d.error.empty());
  }
}
