#include "ipc/cuda/sync_policy.hpp"

#include "ipc/error.hpp"
#include "ipc/stats.hpp"
#include "ipc/wire.hpp"

namespace ferry::cuda {

static_assert(static_cast<std::uint8_t>(Sync::none) == wire::kSyncNone &&
                  static_cast<std::uint8_t>(Sync::event) == wire::kSyncEvent &&
                  static_cast<std::uint8_t>(Sync::memop) == wire::kSyncMemop &&
                  static_cast<std::uint8_t>(Sync::synced) == wire::kSyncSynced,
              "cuda::Sync is what the wire says");
static_assert(static_cast<int>(SyncFallback::count_) == kSyncFallbacks,
              "transport_stats() counts every fallback");

SyncMode sync_mode_from(const std::string& value) {
  if (value.empty() || value == "auto") return SyncMode::automatic;
  if (value == "memop") return SyncMode::memop;
  if (value == "event") return SyncMode::event;
  if (value == "stream") return SyncMode::stream;
  throw Error(Errc::invalid_argument,
              "FERRY_CUDA_SYNC=" + value + ": give auto (the default), memop, event or stream");
}

const char* sync_mode_name(SyncMode m) noexcept {
  switch (m) {
    case SyncMode::automatic:
      return "auto";
    case SyncMode::memop:
      return "memop";
    case SyncMode::event:
      return "event";
    case SyncMode::stream:
      return "stream";
  }
  return "?";
}

const char* sync_name(Sync s) noexcept {
  switch (s) {
    case Sync::none:
      return "none";
    case Sync::event:
      return "event";
    case Sync::memop:
      return "memop";
    case Sync::synced:
      return "synced";
  }
  return "?";
}

const char* sync_fallback_name(SyncFallback f) noexcept {
  switch (f) {
    case SyncFallback::capturing:
      return "capturing";
    case SyncFallback::no_memops:
      return "no_memops";
    case SyncFallback::flag_slots_full:
      return "flag_slots_full";
    case SyncFallback::event_pool_full:
      return "event_pool_full";
    case SyncFallback::count_:
      break;
  }
  return "?";
}

SyncChoice choose_sync(const SyncFacts& f) noexcept {
  // An event, or, with none free, the stream synchronised (a captured stream then fails there,
  // saying so: it cannot be synchronised).
  auto event_or_sync = [&](std::optional<SyncFallback> why) -> SyncChoice {
    if (f.event_free) return {Sync::event, why};
    return {Sync::synced, SyncFallback::event_pool_full};
  };
  if (f.capturing) {
    return event_or_sync(f.mode == SyncMode::event ? std::nullopt
                                                   : std::optional(SyncFallback::capturing));
  }
  switch (f.mode) {
    case SyncMode::stream:
      return {Sync::synced, std::nullopt};
    case SyncMode::event:
      return event_or_sync(std::nullopt);
    case SyncMode::automatic:
      if (f.stream_idle) return {Sync::none, std::nullopt};
      [[fallthrough]];
    case SyncMode::memop:
      if (!f.memops) return event_or_sync(SyncFallback::no_memops);
      if (!f.flag_slot) return event_or_sync(SyncFallback::flag_slots_full);
      return {Sync::memop, std::nullopt};
  }
  return event_or_sync(std::nullopt);
}

}  // namespace ferry::cuda
