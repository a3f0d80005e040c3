// ferry-cuda-sync-bench: what each way of ordering CUDA work across two processes costs, and
// whether it orders at all: the figures that decide FERRY_CUDA_SYNC=auto (docs/cuda.md,
// "Ordering a receiver after its sender"). Standalone: the CUDA runtime (static) and driver
// entry points looked up at run time, no LibTorch, no ferry; JSON out. Without a GPU it prints
// "skipped: <why>" and exits 0.
//
//   ferry-cuda-sync-bench [--json FILE] [--quick] [--device N]
//
// Two helper processes are forked before this process touches CUDA (a child forked after CUDA
// is initialised cannot use it): the peer, which does what each cell needs of a second process
// (opens handles, waits, consumes round trips), and the victim, a sender killed with writes
// pending (the last cell). They talk through one shared anonymous mapping.
//
// Each timed cell: a warm-up, then host microseconds per call, p50 and p99. The axes: the legacy
// default stream (what torch uses unless told otherwise) or a non-blocking stream; idle, or busy
// behind a queued 50 us spin kernel.
//   A  cudaEventRecord: a plain event; an interprocess event never exported, exported, opened by
//      the peer, opened and waited on by the peer after each record; with BlockingSync.
//   B  A's interprocess cells while a second thread loops cudaDeviceSynchronize, and how long
//      those syncs take: is the 85 us the record itself, or contention with the closer?
//   C  cudaStreamWaitEvent on a plain event, and (in the peer) on an opened interprocess one.
//   D  cuStreamWriteValue64/WaitValue64 (and 32-bit) on a device buffer of this process's own,
//      on the peer's buffer opened by IPC handle, and on a shared page registered with
//      cuMemHostRegister in both processes; the device attribute and a real write-and-wait probe.
//   E  cudaStreamQuery idle and busy, cudaStreamSynchronize idle, cuPointerGetAttributes with 8
//      attributes and with 1, cuStreamGetId.
//   F  a plain record then cudaEventQuery; an idle cudaDeviceSynchronize; cudaIpcOpenMemHandle of
//      a first block and of later ones; cudaIpcCloseMemHandle.
//   G  a two-process round trip per way of ordering: interprocess event, memop on a device flag,
//      memop on a host flag, skip when idle (else an event), the sender synchronising its stream,
//      and no ordering at all. The producer's kernel fills 1 MiB with the iteration's number, the
//      consumer's kernel checks it; again with the producer behind a 200 us spin. Every way must
//      show 0 mismatches, and "none" some: that proves the check can fail.
//   I  a dead sender: the victim queues flag writes (device and host) behind a wait that never
//      ends, and is SIGKILLed while this process's streams wait on those flags. Does writing the
//      largest value (a memop on the device flag, a CPU store on the host one) release them?
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ipc/cuda/driver.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kRelease = 0x7fffffffffffffffull;   // ends any GEQ wait
constexpr std::size_t kFloats = (1 << 20) / sizeof(float);  // the round trip's 1 MiB

// ---- failing loudly --------------------------------------------------------------------------

struct Failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Failed(std::string(what) + ": " + cudaGetErrorName(e));
  }
}
void ok(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw Failed(std::string(what) + ": CUresult " + std::to_string(r));
}

// ---- driver entry points, looked up through the runtime (no -lcuda) -------------------------

template <class F>
F entry(const char* name) {
  return reinterpret_cast<F>(ferry::cuda::driver::entry(name));
}

struct Driver {
  CUresult (*write64)(CUstream, CUdeviceptr, cuuint64_t, unsigned) = nullptr;
  CUresult (*wait64)(CUstream, CUdeviceptr, cuuint64_t, unsigned) = nullptr;
  CUresult (*write32)(CUstream, CUdeviceptr, cuuint32_t, unsigned) = nullptr;
  CUresult (*wait32)(CUstream, CUdeviceptr, cuuint32_t, unsigned) = nullptr;
  CUresult (*host_register)(void*, size_t, unsigned) = nullptr;
  CUresult (*host_device_pointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*host_unregister)(void*) = nullptr;
  CUresult (*pointer_attributes)(unsigned, CUpointer_attribute*, void**, CUdeviceptr) = nullptr;
  CUresult (*stream_id)(CUstream, unsigned long long*) = nullptr;
  CUresult (*attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  void load() {
    write64 = entry<decltype(write64)>("cuStreamWriteValue64");
    wait64 = entry<decltype(wait64)>("cuStreamWaitValue64");
    write32 = entry<decltype(write32)>("cuStreamWriteValue32");
    wait32 = entry<decltype(wait32)>("cuStreamWaitValue32");
    host_register = entry<decltype(host_register)>("cuMemHostRegister");
    host_device_pointer = entry<decltype(host_device_pointer)>("cuMemHostGetDevicePointer");
    host_unregister = entry<decltype(host_unregister)>("cuMemHostUnregister");
    pointer_attributes = entry<decltype(pointer_attributes)>("cuPointerGetAttributes");
    stream_id = entry<decltype(stream_id)>("cuStreamGetId");
    attribute = entry<decltype(attribute)>("cuDeviceGetAttribute");
  }
  bool memops() const { return write64 && wait64 && write32 && wait32; }
};
Driver drv;

// ---- kernels ---------------------------------------------------------------------------------

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void fill(float* p, std::size_t n, float v) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = v;
}

// Counts the elements of p that are not v, one atomic per block.
__global__ void check(const float* p, std::size_t n, float v, unsigned long long* bad) {
  __shared__ unsigned long long block_bad;
  if (threadIdx.x == 0) block_bad = 0;
  __syncthreads();
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    mine += p[i] != v;
  if (mine) atomicAdd(&block_bad, mine);
  __syncthreads();
  if (threadIdx.x == 0 && block_bad) atomicAdd(bad, block_bad);
}

__global__ void mark(volatile int* p) {
  *p = 1;
}

// ---- what the processes share ----------------------------------------------------------------

enum Command : int {
  kNothing = 0,
  kOpenEvent,      // open the main process's interprocess event
  kWaitEvents,     // queue a wait on it after each record the main process posts, until stopped
  kTimeWaitEvent,  // time cudaStreamWaitEvent on it
  kExportFlags,    // allocate a device flag buffer and export it
  kOpenRoundTrip,  // open the round trip's buffer, flag and event; register the host page
  kConsume,        // the consumer's side of round trips, until stopped
  kQuit,
};

// How an iteration of a round trip is ordered (what the consumer waits on).
enum How : int { kHowNone = 0, kHowEvent, kHowDeviceFlag, kHowHostFlag };

struct alignas(4096) Shared {
  std::atomic<int> command{kNothing};
  std::atomic<int> issued{0};    // commands issued
  std::atomic<int> answered{0};  // commands done (or failed: error is set)
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> posted{0};  // round trips: the iteration the producer posted
  std::atomic<std::uint64_t> acked{0};   // the iteration the consumer has checked
  std::atomic<int> how{kHowNone};
  std::atomic<std::uint64_t> mismatches{0};
  std::atomic<int> flag_slot{0};  // which slot of the flags this round trip's cell uses
  std::atomic<int> victim_ready{0};
  std::uint8_t event_handle[64];
  std::uint8_t buffer_handle[64];
  std::uint8_t flag_handle[64];       // the main process's device flags
  std::uint8_t peer_flag_handle[64];  // the peer's
  std::uint8_t victim_flag_handle[64];
  double peer_us[4096];  // the peer's timings
  int peer_n = 0;
  char error[512];
  // Host flags, a page each: registered with cuMemHostRegister in every process that uses them.
  alignas(4096) std::atomic<std::uint64_t> host_flags[512];
  alignas(4096) std::atomic<std::uint64_t> victim_host_flags[512];
};
static_assert(sizeof(std::atomic<std::uint64_t>) == 8, "a flag is one 64-bit word");
Shared* shared = nullptr;

inline void pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Spins until cond(), up to `seconds`; false on the timeout.
template <class F>
bool spin_until(F cond, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (unsigned i = 0; !cond(); ++i) {
    pause();
    if ((i & 1023) == 0 && Clock::now() > end) return false;
  }
  return true;
}

// Has the peer do `c`, and waits for its answer (an error there is thrown here).
void ask(Command c, double seconds = 30) {
  const int n = shared->issued.load() + 1;
  shared->error[0] = 0;
  shared->stop = false;
  shared->command = c;
  shared->issued = n;
  if (!spin_until([&] { return shared->answered.load() >= n; }, seconds)) {
    throw Failed("the peer did not answer command " + std::to_string(c));
  }
  if (shared->error[0]) throw Failed(std::string("peer: ") + shared->error);
}

// Has the peer start `c` without waiting for it to end (kWaitEvents, kConsume: ended by stop).
void start(Command c) {
  const int n = shared->issued.load() + 1;
  shared->error[0] = 0;
  shared->stop = false;
  shared->command = c;
  shared->issued = n;
}
void finish(double seconds = 30) {
  const int n = shared->issued.load();
  shared->stop = true;
  if (!spin_until([&] { return shared->answered.load() >= n; }, seconds)) {
    throw Failed("the peer did not stop");
  }
  if (shared->error[0]) throw Failed(std::string("peer: ") + shared->error);
}

// ---- statistics and JSON ---------------------------------------------------------------------

struct Cell {
  std::string name;
  std::map<std::string, std::string> fields;  // already JSON values
};
std::vector<Cell> cells;

std::string num(double v) {
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}
std::string quoted(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o + "\"";
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p / 100.0 * v.size()));
  return v[i];
}

void add(const std::string& name, const std::vector<double>& us,
         std::map<std::string, std::string> extra = {}) {
  extra["p50_us"] = num(percentile(us, 50));
  extra["p99_us"] = num(percentile(us, 99));
  extra["n"] = std::to_string(us.size());
  cells.push_back({name, std::move(extra)});
  std::printf("%-58s p50 %9s us  p99 %9s us\n", name.c_str(), num(percentile(us, 50)).c_str(),
              num(percentile(us, 99)).c_str());
  std::fflush(stdout);
}
void add_failed(const std::string& name, const std::string& why) {
  cells.push_back({name, {{"error", quoted(why)}}});
  std::printf("%-58s FAILED: %s\n", name.c_str(), why.c_str());
  std::fflush(stdout);
}

// Runs one cell, recording its failure rather than stopping the run.
void cell(const std::string& name, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    add_failed(name, e.what());
    (void)cudaGetLastError();
  }
}

// ---- the configuration -----------------------------------------------------------------------

struct Config {
  int device = 0;
  int warmup = 100;
  int timed = 2000;
  int trips = 2000;
  long long spin50 = 0;   // cycles of a 50 us spin
  long long spin200 = 0;  // of 200 us
};
Config cfg;

double since_us(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Times `call` (warm-up, then cfg.timed calls), with `before` run untimed ahead of each.
std::vector<double> time_calls(const std::function<void()>& call,
                               const std::function<void()>& before = {}) {
  std::vector<double> us;
  us.reserve(cfg.timed);
  for (int i = 0; i < cfg.warmup + cfg.timed; ++i) {
    if (before) before();
    const auto t0 = Clock::now();
    call();
    if (i >= cfg.warmup) us.push_back(since_us(t0));
  }
  return us;
}

struct Streams {
  cudaStream_t nonblocking = nullptr;
  std::vector<std::pair<std::string, cudaStream_t>> both() const {
    return {{"legacy", cudaStreamLegacy}, {"nonblocking", nonblocking}};
  }
};
Streams streams;

// A spin of `cycles` queued on `s`, so that the next call finds the stream busy.
void busy(cudaStream_t s, long long cycles) {
  spin<<<1, 1, 0, s>>>(cycles);
  ok(cudaGetLastError(), "launching the spin kernel");
}

// ---- A, B: recording events ------------------------------------------------------------------

void records(const std::string& prefix) {
  struct Kind {
    std::string name;
    unsigned flags;
    bool exported, opened, waited;
  };
  const std::vector<Kind> kinds = {
      {"plain", cudaEventDisableTiming, false, false, false},
      {"ipc_private", cudaEventDisableTiming | cudaEventInterprocess, false, false, false},
      {"ipc_exported", cudaEventDisableTiming | cudaEventInterprocess, true, false, false},
      {"ipc_opened", cudaEventDisableTiming | cudaEventInterprocess, true, true, false},
      {"ipc_waited", cudaEventDisableTiming | cudaEventInterprocess, true, true, true},
      {"ipc_blocking", cudaEventDisableTiming | cudaEventInterprocess | cudaEventBlockingSync, true,
       true, true},
  };
  for (const Kind& k : kinds) {
    if (!prefix.empty() && k.name == "plain") continue;
    for (const auto& named : streams.both()) {
      const std::string sname = named.first;
      cudaStream_t s = named.second;
      for (bool is_busy : {false, true}) {
        const std::string name =
            prefix + "record/" + k.name + "/" + sname + "/" + (is_busy ? "busy" : "idle");
        cell(name, [&] {
          cudaEvent_t ev = nullptr;
          ok(cudaEventCreateWithFlags(&ev, k.flags), "cudaEventCreateWithFlags");
          if (k.exported) {
            cudaIpcEventHandle_t h;
            ok(cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle");
            std::memcpy(shared->event_handle, &h, sizeof h);
          }
          if (k.opened) ask(kOpenEvent);
          if (k.waited) start(kWaitEvents);
          std::uint64_t n = 0;
          std::vector<double> us;
          try {
            us = time_calls(
                [&] {
                  ok(cudaEventRecord(ev, s), "cudaEventRecord");
                  if (k.waited) shared->posted = ++n;
                },
                [&] {
                  if (is_busy) busy(s, cfg.spin50);
                });
          } catch (...) {
            if (k.waited) finish();
            throw;
          }
          if (k.waited) finish();
          ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
          ok(cudaEventDestroy(ev), "cudaEventDestroy");
          add(name, us);
        });
      }
    }
  }
}

// B: A's interprocess records while another thread loops cudaDeviceSynchronize, as ferry's closer
// did; and how long those syncs took.
void records_beside_device_syncs() {
  std::atomic<bool> stop{false};
  std::vector<double> sync_us;
  std::thread syncer([&] {
    ok(cudaSetDevice(cfg.device), "cudaSetDevice");
    while (!stop) {
      const auto t0 = Clock::now();
      if (cudaDeviceSynchronize() != cudaSuccess) break;
      sync_us.push_back(since_us(t0));
    }
  });
  records("beside_device_syncs/");
  stop = true;
  syncer.join();
  add("beside_device_syncs/the_syncs_themselves", sync_us);
}

// ---- C: waiting on events --------------------------------------------------------------------

void waits_on_events() {
  for (const auto& named : streams.both()) {
    const std::string sname = named.first;
    cudaStream_t s = named.second;
    cell("wait_event/plain/" + sname, [&] {
      cudaEvent_t ev = nullptr;
      ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      ok(cudaEventRecord(ev, streams.nonblocking), "cudaEventRecord");
      auto us = time_calls([&] { ok(cudaStreamWaitEvent(s, ev, 0), "cudaStreamWaitEvent"); });
      ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      ok(cudaEventDestroy(ev), "cudaEventDestroy");
      add("wait_event/plain/" + sname, us);
    });
  }
  cell("wait_event/ipc_opened/nonblocking (in the peer)", [&] {
    cudaEvent_t ev = nullptr;
    ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess),
       "cudaEventCreateWithFlags");
    cudaIpcEventHandle_t h;
    ok(cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle");
    std::memcpy(shared->event_handle, &h, sizeof h);
    ok(cudaEventRecord(ev, streams.nonblocking), "cudaEventRecord");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ask(kOpenEvent);
    ask(kTimeWaitEvent, 120);
    std::vector<double> us(shared->peer_us, shared->peer_us + shared->peer_n);
    ok(cudaEventDestroy(ev), "cudaEventDestroy");
    add("wait_event/ipc_opened/nonblocking (in the peer)", us);
  });
}

// ---- D: stream memory operations -------------------------------------------------------------

std::string probe() {
  std::ostringstream o;
  int a64 = -1, a_v1 = -1;
  if (drv.attribute) {
    (void)drv.attribute(&a64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, cfg.device);
    (void)drv.attribute(&a_v1, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1, cfg.device);
  }
  std::string real = "not tried (no entry points)";
  if (drv.memops()) {
    std::uint64_t* word = nullptr;
    ok(cudaMalloc(&word, 8), "cudaMalloc");
    ok(cudaMemset(word, 0, 8), "cudaMemset");
    CUresult w = drv.write64(streams.nonblocking, reinterpret_cast<CUdeviceptr>(word), 5, 0);
    CUresult v = w == CUDA_SUCCESS
                     ? drv.wait64(streams.nonblocking, reinterpret_cast<CUdeviceptr>(word), 5,
                                  CU_STREAM_WAIT_VALUE_GEQ)
                     : w;
    bool done =
        v == CUDA_SUCCESS &&
        spin_until([] { return cudaStreamQuery(streams.nonblocking) != cudaErrorNotReady; }, 2.0);
    std::uint64_t seen = 0;
    if (done) (void)cudaMemcpy(&seen, word, 8, cudaMemcpyDeviceToHost);
    real = v != CUDA_SUCCESS ? "refused (CUresult " + std::to_string(v) + ")"
           : !done           ? "the wait never ended"
           : seen == 5       ? "works"
                             : "the write was not seen";
    if (done) (void)cudaFree(word);
  }
  o << "{\"attribute_64bit\": " << a64 << ", \"attribute_64bit_v1\": " << a_v1
    << ", \"real_write_and_wait\": " << quoted(real) << "}";
  std::printf("memop probe: attribute %d (v1 %d), a real write and wait: %s\n", a64, a_v1,
              real.c_str());
  return o.str();
}

void memops() {
  if (!drv.memops()) {
    add_failed("memop/*", "the driver lacks the stream memory operation entry points");
    return;
  }
  // Where the words are: this process's device memory, the peer's (opened by handle), a shared
  // page registered here (the peer registers it too, for the round trips).
  std::uint64_t* own = nullptr;
  ok(cudaMalloc(&own, 4096), "cudaMalloc");
  ok(cudaMemset(own, 0, 4096), "cudaMemset");
  void* peer = nullptr;
  cell("memop/open the peer's flags", [&] {
    ask(kExportFlags);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, shared->peer_flag_handle, sizeof h);
    ok(cudaIpcOpenMemHandle(&peer, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  });
  CUdeviceptr host = 0;
  cell("memop/register the host page", [&] {
    const auto t0 = Clock::now();
    ok(drv.host_register(shared->host_flags, 4096,
                         CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
       "cuMemHostRegister");
    const double reg = since_us(t0);
    ok(drv.host_device_pointer(&host, shared->host_flags, 0), "cuMemHostGetDevicePointer");
    cells.push_back({"memop/cuMemHostRegister of one page", {{"us", num(reg)}}});
    std::printf("%-58s %9s us\n", "memop/cuMemHostRegister of one page", num(reg).c_str());
  });
  struct Where {
    std::string name;
    CUdeviceptr p;
  };
  std::vector<Where> where = {{"own", reinterpret_cast<CUdeviceptr>(own)}};
  if (peer) where.push_back({"peer", reinterpret_cast<CUdeviceptr>(peer)});
  if (host) where.push_back({"host", host});
  std::uint64_t value = 0;
  for (const auto& w : where) {
    for (const auto& named : streams.both()) {
      const std::string sname = named.first;
      cudaStream_t s = named.second;
      for (bool is_busy : {false, true}) {
        const std::string tail = "/" + w.name + "/" + sname + (is_busy ? "/busy" : "/idle");
        auto before = [&] {
          if (is_busy) busy(s, cfg.spin50);
        };
        cell("memop/write64" + tail, [&] {
          add("memop/write64" + tail,
              time_calls([&] { ok(drv.write64(s, w.p, ++value, 0), "cuStreamWriteValue64"); },
                         before));
          ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        });
        cell("memop/wait64" + tail, [&] {
          // The value is there already: what is timed is queueing the wait.
          add("memop/wait64" + tail, time_calls(
                                         [&] {
                                           ok(drv.wait64(s, w.p, 1, CU_STREAM_WAIT_VALUE_GEQ),
                                              "cuStreamWaitValue64");
                                         },
                                         before));
          ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        });
        cell("memop/write32" + tail, [&] {
          std::uint32_t v32 = 0;
          add("memop/write32" + tail,
              time_calls([&] { ok(drv.write32(s, w.p + 8, ++v32, 0), "cuStreamWriteValue32"); },
                         before));
          ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        });
        cell("memop/wait32" + tail, [&] {
          add("memop/wait32" + tail, time_calls(
                                         [&] {
                                           ok(drv.wait32(s, w.p + 8, 0, CU_STREAM_WAIT_VALUE_GEQ),
                                              "cuStreamWaitValue32");
                                         },
                                         before));
          ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        });
      }
    }
  }
  if (peer) (void)cudaIpcCloseMemHandle(peer);
  (void)cudaFree(own);
}

// ---- E, F: queries, attributes, opens --------------------------------------------------------

void queries() {
  for (const auto& named : streams.both()) {
    const std::string sname = named.first;
    cudaStream_t s = named.second;
    for (bool is_busy : {false, true}) {
      const std::string name = "stream_query/" + sname + (is_busy ? "/busy" : "/idle");
      cell(name, [&] {
        add(name, time_calls([&] { (void)cudaStreamQuery(s); },
                             [&] {
                               if (is_busy) busy(s, cfg.spin50);
                             }));
        ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        (void)cudaGetLastError();
      });
    }
    cell("stream_synchronize/" + sname + "/idle", [&] {
      add("stream_synchronize/" + sname + "/idle",
          time_calls([&] { ok(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }));
    });
  }
  cell("pointer_attributes", [&] {
    if (!drv.pointer_attributes) throw Failed("no cuPointerGetAttributes");
    float* p = nullptr;
    ok(cudaMalloc(&p, 1 << 20), "cudaMalloc");
    CUpointer_attribute eight[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_BUFFER_ID,        CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,   CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    unsigned long long values[8] = {};
    void* out[8];
    for (int i = 0; i < 8; ++i) out[i] = &values[i];
    const auto ptr = reinterpret_cast<CUdeviceptr>(p + 100);
    add("pointer_attributes/8", time_calls([&] {
          ok(drv.pointer_attributes(8, eight, out, ptr), "cuPointerGetAttributes");
        }));
    add("pointer_attributes/1", time_calls([&] {
          ok(drv.pointer_attributes(1, eight + 4, out, ptr), "cuPointerGetAttributes");
        }));
    (void)cudaFree(p);
  });
  cell("stream_get_id/nonblocking", [&] {
    if (!drv.stream_id) throw Failed("no cuStreamGetId");
    unsigned long long id = 0;
    add("stream_get_id/nonblocking",
        time_calls([&] { ok(drv.stream_id(streams.nonblocking, &id), "cuStreamGetId"); }));
  });
  cell("record+query/plain/nonblocking", [&] {
    cudaEvent_t ev = nullptr;
    ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    add("record+query/plain/nonblocking", time_calls([&] {
          ok(cudaEventRecord(ev, streams.nonblocking), "cudaEventRecord");
          (void)cudaEventQuery(ev);
        }));
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    (void)cudaGetLastError();
    (void)cudaEventDestroy(ev);
  });
  cell("device_synchronize/idle", [&] {
    add("device_synchronize/idle",
        time_calls([&] { ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }));
  });
}

// F: opening the peer's blocks. Each open is of a block not opened before (the peer exports a
// fresh one each time): the first pays for setting up peer access.
void opens() {
  cell("ipc_open", [&] {
    const int n = std::min(50, cfg.timed);
    std::vector<double> open_us, close_us;
    for (int i = 0; i < n; ++i) {
      ask(kExportFlags);
      cudaIpcMemHandle_t h;
      std::memcpy(&h, shared->peer_flag_handle, sizeof h);
      void* p = nullptr;
      auto t0 = Clock::now();
      ok(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      open_us.push_back(since_us(t0));
      t0 = Clock::now();
      ok(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle");
      close_us.push_back(since_us(t0));
    }
    cells.push_back({"ipc_open/first", {{"us", num(open_us.front())}}});
    std::printf("%-58s %9s us\n", "ipc_open/first", num(open_us.front()).c_str());
    add("ipc_open/later", std::vector<double>(open_us.begin() + 1, open_us.end()));
    add("ipc_close", close_us);
  });
}

// ---- G: round trips --------------------------------------------------------------------------

struct RoundTrip {
  float* buffer = nullptr;         // the 1 MiB the producer fills and the consumer checks
  std::uint64_t* flags = nullptr;  // the producer's device flags (exported)
  cudaEvent_t event = nullptr;     // its interprocess event (exported)
  CUdeviceptr host = 0;            // the registered host page
};

void setup_round_trip(RoundTrip& rt) {
  ok(cudaMalloc(&rt.buffer, kFloats * sizeof(float)), "cudaMalloc");
  ok(cudaMemset(rt.buffer, 0, kFloats * sizeof(float)), "cudaMemset");
  ok(cudaMalloc(&rt.flags, 4096), "cudaMalloc");
  ok(cudaMemset(rt.flags, 0, 4096), "cudaMemset");
  ok(cudaEventCreateWithFlags(&rt.event, cudaEventDisableTiming | cudaEventInterprocess),
     "cudaEventCreateWithFlags");
  cudaIpcMemHandle_t hb, hf;
  cudaIpcEventHandle_t he;
  ok(cudaIpcGetMemHandle(&hb, rt.buffer), "cudaIpcGetMemHandle");
  ok(cudaIpcGetMemHandle(&hf, rt.flags), "cudaIpcGetMemHandle");
  ok(cudaIpcGetEventHandle(&he, rt.event), "cudaIpcGetEventHandle");
  std::memcpy(shared->buffer_handle, &hb, sizeof hb);
  std::memcpy(shared->flag_handle, &hf, sizeof hf);
  std::memcpy(shared->event_handle, &he, sizeof he);
  if (drv.host_register && rt.host == 0) {
    // Registered by memops() already where it ran; cuMemHostRegister refuses a second time.
    CUresult r = drv.host_register(shared->host_flags, 4096,
                                   CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
      ok(drv.host_device_pointer(&rt.host, shared->host_flags, 0), "cuMemHostGetDevicePointer");
    }
  }
  ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  ask(kOpenRoundTrip, 60);
}

// One way of ordering, `trips` round trips (after a warm-up); with `delayed`, the producer's
// fill waits behind a 200 us spin, so a consumer that does not wait reads it early.
void round_trips(RoundTrip& rt, const std::string& way, bool delayed, int slot) {
  const std::string name = "round_trip/" + way + (delayed ? "/delayed" : "/prompt");
  cell(name, [&] {
    if ((way == "memop_device" || way == "memop_host") && !drv.memops()) {
      throw Failed("no stream memory operations");
    }
    if (way == "memop_host" && rt.host == 0) throw Failed("no registered host page");
    cudaStream_t s = streams.nonblocking;
    shared->posted = 0;
    shared->acked = 0;
    shared->mismatches = 0;
    shared->flag_slot = slot;
    start(kConsume);
    std::vector<double> us;
    const int total = cfg.warmup + cfg.trips;
    try {
      for (int i = 1; i <= total; ++i) {
        const auto t0 = Clock::now();
        if (delayed) busy(s, cfg.spin200);
        fill<<<256, 256, 0, s>>>(rt.buffer, kFloats, static_cast<float>(i));
        ok(cudaGetLastError(), "launching fill");
        int how = kHowNone;
        if (way == "event") {
          ok(cudaEventRecord(rt.event, s), "cudaEventRecord");
          how = kHowEvent;
        } else if (way == "memop_device") {
          ok(drv.write64(s, reinterpret_cast<CUdeviceptr>(rt.flags + slot), i, 0),
             "cuStreamWriteValue64");
          how = kHowDeviceFlag;
        } else if (way == "memop_host") {
          ok(drv.write64(s, rt.host + slot * 8, i, 0), "cuStreamWriteValue64");
          how = kHowHostFlag;
        } else if (way == "skip_when_idle") {
          if (cudaStreamQuery(s) == cudaErrorNotReady) {
            (void)cudaGetLastError();
            ok(cudaEventRecord(rt.event, s), "cudaEventRecord");
            how = kHowEvent;
          }
        } else if (way == "sender_sync") {
          ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        }  // "none": nothing
        shared->how = how;
        shared->posted = static_cast<std::uint64_t>(i);
        if (!spin_until([&] { return shared->acked.load() >= static_cast<std::uint64_t>(i); },
                        10)) {
          throw Failed("the consumer did not check iteration " + std::to_string(i) +
                       (shared->error[0] ? std::string(": ") + shared->error : ""));
        }
        if (i > cfg.warmup) us.push_back(since_us(t0));
      }
    } catch (...) {
      shared->posted = ~0ull;
      finish();
      throw;
    }
    shared->posted = ~0ull;  // tells the consumer the round trips are over
    finish();
    ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    add(name, us, {{"mismatches", std::to_string(shared->mismatches.load())}});
  });
}

// ---- I: a dead sender ------------------------------------------------------------------------

std::string dead_sender(pid_t victim) {
  std::ostringstream o;
  std::string device_result = "not run", host_result = "not run", errors;
  try {
    shared->victim_ready = 1;  // go: allocate, queue the writes behind a wait that never ends
    if (!spin_until([] { return shared->victim_ready.load() == 2; }, 60)) {
      throw Failed("the victim did not get ready");
    }
    if (shared->error[0]) throw Failed(std::string("victim: ") + shared->error);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, shared->victim_flag_handle, sizeof h);
    void* flags = nullptr;
    ok(cudaIpcOpenMemHandle(&flags, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    CUdeviceptr host = 0;
    ok(drv.host_register(shared->victim_host_flags, 4096,
                         CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
       "cuMemHostRegister");
    ok(drv.host_device_pointer(&host, shared->victim_host_flags, 0), "cuMemHostGetDevicePointer");
    int* marks = nullptr;  // mapped pinned memory: 1 once each waiting stream went on
    ok(cudaHostAlloc(reinterpret_cast<void**>(&marks), 2 * sizeof(int), cudaHostAllocMapped),
       "cudaHostAlloc");
    marks[0] = marks[1] = 0;
    int* dev_marks = nullptr;
    ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_marks), marks, 0),
       "cudaHostGetDevicePointer");
    cudaStream_t waits[2], releaser;
    for (auto& s : waits) ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    ok(cudaStreamCreateWithFlags(&releaser, cudaStreamNonBlocking), "stream");
    ok(drv.wait64(waits[0], reinterpret_cast<CUdeviceptr>(flags), 1, CU_STREAM_WAIT_VALUE_GEQ),
       "cuStreamWaitValue64 (device flag)");
    mark<<<1, 1, 0, waits[0]>>>(dev_marks);
    ok(drv.wait64(waits[1], host, 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue64 (host flag)");
    mark<<<1, 1, 0, waits[1]>>>(dev_marks + 1);
    ok(cudaGetLastError(), "launching the marks");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const bool held = marks[0] == 0 && marks[1] == 0;
    ::kill(victim, SIGKILL);
    ::waitpid(victim, nullptr, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CUresult r = drv.write64(releaser, reinterpret_cast<CUdeviceptr>(flags), kRelease, 0);
    if (r != CUDA_SUCCESS) errors += "the releasing memop: CUresult " + std::to_string(r) + "; ";
    shared->victim_host_flags[0].store(kRelease);  // the CPU store
    const bool device_went =
        spin_until([&] { return reinterpret_cast<volatile int*>(marks)[0] == 1; }, 3);
    const bool host_went =
        spin_until([&] { return reinterpret_cast<volatile int*>(marks)[1] == 1; }, 3);
    device_result = !held         ? "the waits did not hold before the kill"
                    : device_went ? "released"
                                  : "still waiting after 3 s";
    host_result = !held       ? "the waits did not hold before the kill"
                  : host_went ? "released"
                              : "still waiting after 3 s";
    cudaError_t sticky = cudaStreamQuery(waits[0]);
    if (sticky != cudaSuccess && sticky != cudaErrorNotReady) {
      errors += std::string("the device flag's stream: ") + cudaGetErrorName(sticky) + "; ";
    }
    (void)cudaGetLastError();
  } catch (const std::exception& e) {
    errors += e.what();
    ::kill(victim, SIGKILL);
    ::waitpid(victim, nullptr, 0);
  }
  std::printf("dead sender: device flag by memop: %s; host flag by a CPU store: %s%s%s\n",
              device_result.c_str(), host_result.c_str(), errors.empty() ? "" : "; ",
              errors.c_str());
  o << "{\"device_flag_by_memop\": " << quoted(device_result)
    << ", \"host_flag_by_cpu_store\": " << quoted(host_result) << ", \"errors\": " << quoted(errors)
    << "}";
  return o.str();
}

// ---- the helper processes --------------------------------------------------------------------

void fail_in_child(const std::exception& e) {
  std::snprintf(shared->error, sizeof shared->error, "%s", e.what());
}

void peer_main(int device) {
  cudaStream_t s = nullptr;
  cudaEvent_t opened = nullptr;
  float* buffer = nullptr;
  void* flags = nullptr;
  cudaEvent_t trip_event = nullptr;
  CUdeviceptr host = 0;
  unsigned long long* bad = nullptr;
  int done = 0;
  for (;;) {
    if (!spin_until([&] { return shared->issued.load() > done; }, 3600)) return;
    const int c = shared->command.load();
    try {
      if (s == nullptr) {
        ok(cudaSetDevice(device), "cudaSetDevice");
        drv.load();
        ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
        ok(cudaMalloc(&bad, sizeof *bad), "cudaMalloc");
      }
      switch (c) {
        case kOpenEvent: {
          cudaIpcEventHandle_t h;
          std::memcpy(&h, shared->event_handle, sizeof h);
          ok(cudaIpcOpenEventHandle(&opened, h), "cudaIpcOpenEventHandle");
          break;
        }
        case kWaitEvents: {
          std::uint64_t seen = 0;
          while (!shared->stop.load()) {
            const std::uint64_t p = shared->posted.load();
            if (p != seen) {
              ok(cudaStreamWaitEvent(s, opened, 0), "cudaStreamWaitEvent");
              seen = p;
            } else {
              pause();
            }
          }
          ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
          break;
        }
        case kTimeWaitEvent: {
          const int n = std::min<int>(4096, cfg.timed);
          for (int i = 0; i < cfg.warmup; ++i) ok(cudaStreamWaitEvent(s, opened, 0), "wait");
          for (int i = 0; i < n; ++i) {
            const auto t0 = Clock::now();
            ok(cudaStreamWaitEvent(s, opened, 0), "cudaStreamWaitEvent");
            shared->peer_us[i] = since_us(t0);
          }
          shared->peer_n = n;
          ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
          break;
        }
        case kExportFlags: {
          void* p = nullptr;  // a fresh block each time: left to the process's end
          ok(cudaMalloc(&p, 4096), "cudaMalloc");
          ok(cudaMemset(p, 0, 4096), "cudaMemset");
          ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
          cudaIpcMemHandle_t h;
          ok(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle");
          std::memcpy(shared->peer_flag_handle, &h, sizeof h);
          break;
        }
        case kOpenRoundTrip: {
          cudaIpcMemHandle_t hb, hf;
          cudaIpcEventHandle_t he;
          std::memcpy(&hb, shared->buffer_handle, sizeof hb);
          std::memcpy(&hf, shared->flag_handle, sizeof hf);
          std::memcpy(&he, shared->event_handle, sizeof he);
          ok(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&buffer), hb,
                                  cudaIpcMemLazyEnablePeerAccess),
             "cudaIpcOpenMemHandle (buffer)");
          ok(cudaIpcOpenMemHandle(&flags, hf, cudaIpcMemLazyEnablePeerAccess),
             "cudaIpcOpenMemHandle (flags)");
          ok(cudaIpcOpenEventHandle(&trip_event, he), "cudaIpcOpenEventHandle");
          if (drv.host_register && drv.host_device_pointer) {
            CUresult r =
                drv.host_register(shared->host_flags, 4096,
                                  CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
            if (r == CUDA_SUCCESS || r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
              ok(drv.host_device_pointer(&host, shared->host_flags, 0),
                 "cuMemHostGetDevicePointer");
            }
          }
          break;
        }
        case kConsume: {
          const int slot = shared->flag_slot.load();
          std::uint64_t next = 1;
          for (;;) {
            std::uint64_t p = 0;
            if (!spin_until(
                    [&] {
                      p = shared->posted.load();
                      return p >= next || shared->stop.load();
                    },
                    30)) {
              throw Failed("no round trip was posted for 30 s");
            }
            if (p == ~0ull || (shared->stop.load() && p < next)) break;
            switch (shared->how.load()) {
              case kHowEvent:
                ok(cudaStreamWaitEvent(s, trip_event, 0), "cudaStreamWaitEvent");
                break;
              case kHowDeviceFlag:
                ok(drv.wait64(
                       s, reinterpret_cast<CUdeviceptr>(static_cast<std::uint64_t*>(flags) + slot),
                       p, CU_STREAM_WAIT_VALUE_GEQ),
                   "cuStreamWaitValue64 (device flag)");
                break;
              case kHowHostFlag:
                ok(drv.wait64(s, host + slot * 8, p, CU_STREAM_WAIT_VALUE_GEQ),
                   "cuStreamWaitValue64 (host flag)");
                break;
              default:
                break;
            }
            ok(cudaMemsetAsync(bad, 0, sizeof *bad, s), "cudaMemsetAsync");
            check<<<256, 256, 0, s>>>(buffer, kFloats, static_cast<float>(p), bad);
            unsigned long long got = 0;
            ok(cudaMemcpyAsync(&got, bad, sizeof got, cudaMemcpyDeviceToHost, s),
               "cudaMemcpyAsync");
            ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
            shared->mismatches += got;
            shared->acked = p;
            next = p + 1;
          }
          break;
        }
        case kQuit:
          shared->answered = shared->issued.load();
          return;
        default:
          break;
      }
    } catch (const std::exception& e) {
      fail_in_child(e);
    }
    done = shared->issued.load();
    shared->answered = done;
  }
}

void victim_main(int device) {
  if (!spin_until([] { return shared->victim_ready.load() == 1; }, 3600)) return;
  try {
    ok(cudaSetDevice(device), "cudaSetDevice");
    drv.load();
    if (!drv.memops() || !drv.host_register) throw Failed("no memops or host registration");
    void* flags = nullptr;
    std::uint64_t* never = nullptr;
    ok(cudaMalloc(&flags, 4096), "cudaMalloc");
    ok(cudaMalloc(&never, 8), "cudaMalloc");
    ok(cudaMemset(flags, 0, 4096), "cudaMemset");
    ok(cudaMemset(never, 0, 8), "cudaMemset");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cudaIpcMemHandle_t h;
    ok(cudaIpcGetMemHandle(&h, flags), "cudaIpcGetMemHandle");
    std::memcpy(shared->victim_flag_handle, &h, sizeof h);
    CUdeviceptr host = 0;
    ok(drv.host_register(shared->victim_host_flags, 4096,
                         CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
       "cuMemHostRegister");
    ok(drv.host_device_pointer(&host, shared->victim_host_flags, 0), "cuMemHostGetDevicePointer");
    cudaStream_t s = nullptr;
    ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    ok(drv.wait64(s, reinterpret_cast<CUdeviceptr>(never), 1, CU_STREAM_WAIT_VALUE_GEQ),
       "cuStreamWaitValue64");
    ok(drv.write64(s, reinterpret_cast<CUdeviceptr>(flags), 1, 0), "cuStreamWriteValue64");
    ok(drv.write64(s, host, 1, 0), "cuStreamWriteValue64");
  } catch (const std::exception& e) {
    fail_in_child(e);
  }
  shared->victim_ready = 2;
  for (;;) ::pause();  // until the SIGKILL
}

// ---- main ------------------------------------------------------------------------------------

std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string driver_version() {
  std::ifstream f("/sys/module/nvidia/version");
  std::string v;
  if (f >> v) return v;
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--device" && i + 1 < argc) {
      cfg.device = std::atoi(argv[++i]);
    } else {
      const bool help = a == "--help" || a == "-h";
      std::fprintf(help ? stdout : stderr,
                   "usage: %s [--json FILE] [--quick] [--device N]\n"
                   "  what each way of ordering CUDA work across two processes costs, and whether "
                   "it orders (docs/cuda.md)\n",
                   argv[0]);
      return help ? 0 : 2;
    }
  }
  if (quick) {
    cfg.warmup = 20;
    cfg.timed = 200;
    cfg.trips = 200;
  }
  void* mem =
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  shared = new (mem) Shared;
  // The helpers first: a child forked after this process touched CUDA could not use it.
  const pid_t peer = ::fork();
  if (peer == 0) {
    peer_main(cfg.device);
    ::_exit(0);
  }
  const pid_t victim = ::fork();
  if (victim == 0) {
    victim_main(cfg.device);
    ::_exit(0);
  }
  auto stop_children = [&] {
    shared->stop = true;
    ::kill(peer, SIGKILL);
    ::kill(victim, SIGKILL);
    ::waitpid(peer, nullptr, 0);
    ::waitpid(victim, nullptr, 0);
  };

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= cfg.device) {
    (void)cudaGetLastError();
    std::printf("skipped: no CUDA device %d here (%d visible)\n", cfg.device, count);
    stop_children();
    if (!json_path.empty()) {
      std::ofstream(json_path) << "{\"status\": \"skipped\", \"reason\": \"no CUDA device\"}\n";
    }
    return 0;
  }
  std::string header;
  try {
    ok(cudaSetDevice(cfg.device), "cudaSetDevice");
    drv.load();
    cudaDeviceProp p{};
    ok(cudaGetDeviceProperties(&p, cfg.device), "cudaGetDeviceProperties");
    int khz = 0;
    ok(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, cfg.device), "clock rate");
    cfg.spin50 = 50LL * khz / 1000;
    cfg.spin200 = 200LL * khz / 1000;
    int runtime = 0, driver = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaDriverGetVersion(&driver);
    ok(cudaStreamCreateWithFlags(&streams.nonblocking, cudaStreamNonBlocking), "stream");
    std::ostringstream h;
    h << "\"device\": " << quoted(p.name) << ", \"device_index\": " << cfg.device
      << ", \"driver\": " << quoted(driver_version())
      << ", \"cuda_driver_api\": " << quoted(version_text(driver))
      << ", \"cuda_runtime\": " << quoted(version_text(runtime)) << ", \"warmup\": " << cfg.warmup
      << ", \"timed\": " << cfg.timed << ", \"round_trips\": " << cfg.trips;
    header = h.str();
    std::printf("ferry-cuda-sync-bench: %s (driver %s, CUDA %s, runtime %s)\n", p.name,
                driver_version().c_str(), version_text(driver).c_str(),
                version_text(runtime).c_str());
  } catch (const std::exception& e) {
    std::printf("skipped: %s\n", e.what());
    stop_children();
    return 0;
  }

  const auto t0 = Clock::now();
  std::string probed, dead;
  try {
    probed = probe();
  } catch (const std::exception& e) {
    probed = "{\"error\": " + quoted(e.what()) + "}";
  }
  records("");
  records_beside_device_syncs();
  waits_on_events();
  memops();
  queries();
  opens();
  RoundTrip rt;
  bool ready = true;
  cell("round_trip/setup", [&] { setup_round_trip(rt); });
  for (const auto& c : cells) ready = ready && c.name != "round_trip/setup";
  // Each round trip's cell has flag slots of its own, past the words the memop cells used.
  int slot = 16;
  for (const char* way :
       {"event", "memop_device", "memop_host", "skip_when_idle", "sender_sync", "none"}) {
    for (bool delayed : {false, true}) {
      if (ready) round_trips(rt, way, delayed, slot++);
    }
  }
  try {
    ask(kQuit, 10);
  } catch (const std::exception&) {
  }
  ::waitpid(peer, nullptr, 0);
  dead = dead_sender(victim);  // last: a dead peer's memory may upset this context
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("ran in %.1f s\n", seconds);

  // The verdict on ordering: every way that orders shows no mismatch, and "none" shows some
  // (else the check could not have failed, and proves nothing).
  int wrong = 0;
  std::uint64_t unordered = 0;
  bool unordered_ran = false;
  for (const auto& c : cells) {
    auto m = c.fields.find("mismatches");
    if (c.name.rfind("round_trip/", 0) != 0 || m == c.fields.end()) continue;
    const std::uint64_t n = std::stoull(m->second);
    if (c.name.rfind("round_trip/none/", 0) == 0) {
      unordered += n;
      unordered_ran = true;
    } else if (n != 0) {
      std::printf("ORDERING FAILED: %s read %llu stale elements\n", c.name.c_str(),
                  static_cast<unsigned long long>(n));
      ++wrong;
    }
  }
  const std::string verdict = wrong            ? "failed: an ordered way read stale data"
                              : !unordered_ran ? "not run"
                              : unordered      ? "ordered: 0 mismatches, and 'none' showed some"
                                               : "unproven: 'none' showed no mismatch either";
  std::printf("ordering check: %s\n", verdict.c_str());

  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{" << header << ", \"seconds\": " << num(seconds)
        << ",\n \"ordering_check\": " << quoted(verdict) << ",\n \"memop_probe\": " << probed
        << ",\n \"dead_sender\": " << dead << ",\n \"cells\": {\n";
    for (std::size_t i = 0; i < cells.size(); ++i) {
      out << "  " << quoted(cells[i].name) << ": {";
      bool first = true;
      for (const auto& [k, v] : cells[i].fields) {
        out << (first ? "" : ", ") << quoted(k) << ": " << v;
        first = false;
      }
      out << "}" << (i + 1 < cells.size() ? "," : "") << "\n";
    }
    out << " }}\n";
  }
  return wrong ? 3 : 0;
}
