#include "ipc/peer_segments.hpp"

#include <pthread.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/segment_server.hpp"
#include "ipc/stats.hpp"

namespace ferry {
namespace {

// `held` while the owner lives; once it has exited only `seen` remains, so the mapping lasts
// exactly as long as something else holds it (and a message the owner left queued can still be
// read meanwhile).
struct Entry {
  pid_t pid;
  std::shared_ptr<Segment> held;
  std::weak_ptr<Segment> seen;
};

std::mutex g_mu;
// Leaked: received tensors may be released by other statics' destructors during exit.
auto* g_cache = new std::map<std::pair<std::uint64_t, std::uint32_t>, Entry>;

[[maybe_unused]] const int g_atfork =
    pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, [] { g_mu.unlock(); });

// Releases outside the lock: the last reference unmaps.
using Released = std::vector<std::shared_ptr<Segment>>;

void drop_dead_locked(Released& released) {
  std::map<pid_t, bool> alive;  // one check per owner, not per segment
  for (auto it = g_cache->begin(); it != g_cache->end();) {
    Entry& e = it->second;
    if (e.held) {
      auto [a, fresh] = alive.emplace(e.pid, false);
      if (fresh) a->second = process_alive(e.pid);
      if (!a->second) released.push_back(std::move(e.held));
    }
    it = e.held || !e.seen.expired() ? std::next(it) : g_cache->erase(it);
  }
}

}  // namespace

std::shared_ptr<Segment> map_peer_segment(pid_t owner_pid, std::uint64_t owner_token,
                                          std::uint32_t seq, std::size_t expected_size,
                                          std::chrono::milliseconds timeout,
                                          const SegmentFallback& fallback, bool* owner_exited) {
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
    if (it != g_cache->end()) {
      if (it->second.held) return it->second.held;
      if (auto still = it->second.seen.lock()) {
        if (owner_exited) *owner_exited = true;  // only an exited owner's entries are weak
        return still;
      }
    }
  }
  // Fetch without the lock: other receiving threads keep going meanwhile.
  UniqueFd fd;
  bool exited = false;
  try {
    fd = fetch_segment_fd(owner_pid, owner_token, seq, timeout);
  } catch (const Error& e) {
    if (e.code() != Errc::peer_dead || !fallback) throw;
    fd = fallback(owner_token, seq);
    if (!fd) throw;
    exited = true;
  }
  auto segment = Segment::attach(std::move(fd), expected_size);
  detail::bump(detail::counters().segments_mapped);
  log().debug("mapped segment {} of pid {} ({} bytes){}", seq, owner_pid, segment->size(),
              exited ? " from a queue's custody" : "");
  if (owner_exited && exited) *owner_exited = true;
  Released released;
  std::lock_guard<std::mutex> lock(g_mu);
  drop_dead_locked(released);
  Entry& e = (*g_cache)[key];
  if (exited) {
    // Held only by what uses it: nobody else will serve this owner's segments again.
    if (!e.held && e.seen.expired()) e = Entry{owner_pid, nullptr, segment};
    return segment;
  }
  // A racing thread's mapping wins; ours is unmapped on return.
  if (!e.held) e = Entry{owner_pid, segment, segment};
  return e.held;
}

void drop_peer_segments(std::uint64_t owner_token) noexcept {
  Released released;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_cache->lower_bound({owner_token, 0});
  for (; it != g_cache->end() && it->first.first == owner_token; ++it) {
    if (it->second.held) released.push_back(std::move(it->second.held));
  }
}

void drop_dead_peer_segments() noexcept {
  Released released;
  std::lock_guard<std::mutex> lock(g_mu);
  drop_dead_locked(released);
}

}  // namespace ferry
