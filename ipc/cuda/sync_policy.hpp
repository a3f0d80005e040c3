// How a CUDA tensor's receiver is ordered after its sender's last write (design invariant 6):
// one pure decision, a test per case; the sender gathers the facts and carries out the answer.
//
// The ways, cheapest first:
// - none: the sender's current stream had no work pending when the tensor was sent
//   (cudaStreamQuery), so every write to the tensor has completed; the receiver waits for
//   nothing, and the record says so.
// - memop: a timeline counter. The sender's stream writes a rising value into its slot of a
//   small flag buffer, after the stream's earlier work (cuStreamWriteValue64); the receiver's
//   current stream waits until the slot holds at least that value (cuStreamWaitValue64, GEQ).
//   No event, no host stall on either side (ipc/cuda/timeline.hpp, flag_imports.hpp).
// - event: an interprocess event from the sender's pool, recorded on its stream; the receiver's
//   stream waits on it. Kept where a memop cannot serve: the device failed the memop probe, the
//   stream is being captured into a graph, every flag slot is taken. A record of one costs about
//   85 us on an H100.
// - synced: the sender synchronised its stream (FERRY_CUDA_SYNC=stream, or no event was free).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ferry::cuda {

// FERRY_CUDA_SYNC: which way a sender orders its receivers. `automatic` (the default) skips
// when the stream is idle and takes a memop otherwise; the others force one way, so that a GPU
// run can compare them.
enum class SyncMode : std::uint8_t { automatic, memop, event, stream };
// The mode named by FERRY_CUDA_SYNC's value ("auto", "memop", "event", "stream"; "" is auto).
// Throws Error(invalid_argument) naming the value and the choices.
SyncMode sync_mode_from(const std::string& value);
const char* sync_mode_name(SyncMode m) noexcept;

// How a record's receiver is ordered: its wire value (wire::Record::sync).
enum class Sync : std::uint8_t { none = 0, event = 1, memop = 2, synced = 3 };
const char* sync_name(Sync s) noexcept;

// Why a send did not take the way its mode asked for (counted in transport_stats()).
enum class SyncFallback : std::uint8_t {
  capturing,        // the stream is being captured: no query, no memop; an event is recorded
  no_memops,        // the device failed the memop probe (driver, MPS, no 64-bit memops)
  flag_slots_full,  // every slot of the flag buffer has its stream: an event instead
  event_pool_full,  // every pooled event is still awaited: the stream is synchronised instead
  count_,
};
const char* sync_fallback_name(SyncFallback f) noexcept;

// What the decision depends on, gathered by the sender.
struct SyncFacts {
  SyncMode mode = SyncMode::automatic;
  bool capturing = false;    // cudaStreamIsCapturing: the stream is being captured
  bool stream_idle = false;  // cudaStreamQuery said the stream has nothing pending (not asked
                             // while capturing, where the query is not allowed)
  bool memops = false;       // this device passed the memop probe and has its flag buffer
  bool flag_slot = false;    // the stream has a flag slot, or one is free for it
  bool event_free = false;   // the event pool has an event (or room to make one)
};

struct SyncChoice {
  Sync sync = Sync::none;
  std::optional<SyncFallback> fallback;  // set when the mode's own way could not be taken
};

// The rules, first match wins: a stream being captured records an event (it can be neither
// queried nor written to now); `stream` synchronises; `event` records an event; `automatic`
// skips an idle stream; then a memop where the device and a slot allow, else an event. Where an
// event is chosen and none is free, the stream is synchronised instead.
SyncChoice choose_sync(const SyncFacts& f) noexcept;

}  // namespace ferry::cuda
