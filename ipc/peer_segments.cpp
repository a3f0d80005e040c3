#include "ipc/peer_segments.hpp"

#include <pthread.h>

#include <map>
#include <mutex>
#include <utility>

#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/segment_server.hpp"
#include "ipc/stats.hpp"

namespace ferry {
namespace {

struct Entry {
  pid_t pid;
  std::shared_ptr<Segment> segment;
};

std::mutex g_mu;
// Leaked: received tensors may be released by other statics' destructors during exit.
auto* g_cache = new std::map<std::pair<std::uint64_t, std::uint32_t>, Entry>;

[[maybe_unused]] const int g_atfork =
    pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, [] { g_mu.unlock(); });

void prune_locked() {
  for (auto it = g_cache->begin(); it != g_cache->end();) {
    it = process_alive(it->second.pid) ? std::next(it) : g_cache->erase(it);
  }
}

}  // namespace

std::shared_ptr<Segment> map_peer_segment(pid_t owner_pid, std::uint64_t owner_token,
                                          std::uint32_t seq, std::size_t expected_size,
                                          std::chrono::milliseconds timeout) {
  if (owner_token == process_token()) {
    auto own = find_published_segment(seq);
    if (!own) {
      throw Error(Errc::bad_record, "record names segment " + std::to_string(seq) +
                                        " of this process, which has no such segment");
    }
    return own;
  }
  const auto key = std::make_pair(owner_token, seq);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_cache->find(key);
    if (it != g_cache->end()) return it->second.segment;
  }
  // Fetch without the lock: other receiving threads keep going meanwhile.
  auto segment =
      Segment::attach(fetch_segment_fd(owner_pid, owner_token, seq, timeout), expected_size);
  detail::bump(detail::counters().segments_mapped);
  log().debug("mapped segment {} of pid {} ({} bytes)", seq, owner_pid, segment->size());
  std::lock_guard<std::mutex> lock(g_mu);
  prune_locked();
  // A racing thread's mapping wins; ours is unmapped on return.
  return g_cache->emplace(key, Entry{owner_pid, segment}).first->second.segment;
}

}  // namespace ferry
