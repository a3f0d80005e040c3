#include "ipc/arena.hpp"

#include <pthread.h>

#include "ipc/allocation_policy.hpp"
#include "ipc/env.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/peer_segments.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/segment_server.hpp"
#include "ipc/stats.hpp"
#include "ipc/units.hpp"

namespace ferry {
namespace {

constexpr std::size_t kSmallAlign = 64;
constexpr std::size_t kLargeAlign = 4096;
constexpr std::size_t kLargeBlock = std::size_t{1} << 20;
// What a free range gives back is whole pages of it.
constexpr std::uint64_t kPage = 4096;

std::size_t round_up(std::size_t v, std::size_t a) {
  return (v + a - 1) / a * a;
}

std::mutex g_local_mu;
Arena* g_local = nullptr;
[[maybe_unused]] const int g_atfork = pthread_atfork(
    [] { g_local_mu.lock(); }, [] { g_local_mu.unlock(); }, [] { g_local_mu.unlock(); });

// This process's ledger if it has made one (arenas are never freed: it outlives the lock).
Ledger* existing_local_ledger() {
  Arena* arena;
  {
    std::lock_guard<std::mutex> lock(g_local_mu);
    arena = g_local && g_local->pid() == current_pid() ? g_local : nullptr;
  }
  return arena ? arena->existing_ledger() : nullptr;
}

// On the segment server's thread, the moment a process it served exits: the dead process's
// leases are taken back (the blocks they kept, and the queues their messages were routed through,
// which a queue the user has dropped no longer keeps open), and its segments mapped here are let
// go. The next send would do the same, but a process that sends no more would keep them. It
// also runs once a second while leases are out (leases_out), for holders nobody watched.
void reader_exited() noexcept {
  try {
    if (Ledger* ledger = existing_local_ledger()) ledger->reclaim(true);
  } catch (const std::exception& e) {
    log().warn("taking back the leases of a process that exited: {}", e.what());
  }
  drop_dead_peer_segments();
}

// The segment server's housekeeping: this process's arena gives back the pages that lay unused.
std::optional<Clock::time_point> give_back_idle(Clock::time_point now) noexcept {
  Arena* arena;
  {
    std::lock_guard<std::mutex> lock(g_local_mu);
    arena = g_local && g_local->pid() == current_pid() ? g_local : nullptr;
  }
  return arena ? arena->trim(now) : std::nullopt;
}

// Whether reader_exited() should also run now and then: while a lease is out, its holder may be
// a process the segment server never watched.
bool leases_out() noexcept {
  try {
    Ledger* ledger = existing_local_ledger();
    return ledger && ledger->outstanding() > 0;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

Arena& Arena::local() {
  std::lock_guard<std::mutex> lock(g_local_mu);
  if (!g_local || g_local->pid() != current_pid()) {
    // Never freed: blocks handed out (and a forked child's inherited ones) point into it.
    g_local = new Arena(options_from_env());
  }
  return *g_local;
}

Arena::Options Arena::options_from_env() {
  Options o;
  // Under 1 MiB every large block would take a segment of its own.
  o.segment_size = static_cast<std::size_t>(
      env::bytes("FERRY_ARENA_SEGMENT_MB", o.segment_size, kLargeBlock, std::uint64_t{1} << 40));
  o.lease_slots = static_cast<std::uint32_t>(
      env::integer("FERRY_LEASE_SLOTS", o.lease_slots, 1, std::int64_t{1} << 24));
  o.idle = env::millis("FERRY_ARENA_IDLE_MS", o.idle, std::chrono::milliseconds(0),
                       std::chrono::hours(24 * 365));
  return o;
}

Arena::Arena(Options options) : options_(std::move(options)), pid_(current_pid()) {}

Ledger& Arena::ledger() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ledger_) {
    ledger_ = Ledger::create(options_.lease_slots);
    set_reader_exit_hook(&reader_exited, &leases_out);
    set_housekeeping(&give_back_idle);
    publish_segment(0, ledger_->segment());
  }
  return *ledger_;
}

Ledger* Arena::existing_ledger() {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.get();
}

void Arena::insert_free_locked(std::uint32_t seq, std::uint64_t offset, std::uint64_t size) {
  auto& by_off = free_by_offset_[seq - 1];
  auto erase_sized = [&](std::uint64_t off, std::uint64_t sz) {
    auto [b, e] = free_by_size_.equal_range(sz);
    for (auto it = b; it != e; ++it) {
      if (it->second.seq == seq && it->second.offset == off) {
        free_by_size_.erase(it);
        return;
      }
    }
  };
  // Coalesce with the free neighbours on both sides.
  auto next = by_off.lower_bound(offset);
  if (next != by_off.end() && offset + size == next->first) {
    erase_sized(next->first, next->second.size);
    size += next->second.size;
    next = by_off.erase(next);
  }
  if (next != by_off.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size == offset) {
      erase_sized(prev->first, prev->second.size);
      offset = prev->first;
      size += prev->second.size;
      by_off.erase(prev);
    }
  }
  // The merged range lies unused from now: what of it was given back already stays so.
  const Clock::time_point now = Clock::now();
  by_off.emplace(offset, Range{size, now, false});
  free_by_size_.emplace(size, Free{seq, offset});
  note_housekeeping(now + options_.idle);
}

void Arena::reserve_locked(std::uint32_t seq, std::uint64_t offset, std::uint64_t size) {
  auto& returned = returned_[seq - 1];
  if (returned.empty()) return;
  const std::uint64_t from = offset / kPage * kPage;
  const std::uint64_t to = round_up(offset + size, kPage);
  auto it = returned.upper_bound(from);
  if (it != returned.begin() && std::prev(it)->second > from) --it;
  while (it != returned.end() && it->first < to) {
    const std::uint64_t a = std::max(it->first, from), b = std::min(it->second, to);
    // Reserved before the range is changed: a refusal leaves the record exact.
    segments_[seq - 1]->reserve_pages(a, b - a);
    const std::uint64_t start = it->first, end = it->second;
    it = returned.erase(it);
    if (start < a) returned.emplace(start, a);
    if (b < end) it = returned.emplace(b, end).first;
    returned_bytes_ -= b - a;
  }
}

bool Arena::take_locked(std::size_t size, std::size_t align, Block* out) {
  // Best fit: the smallest free range that still fits after alignment.
  for (auto it = free_by_size_.lower_bound(size); it != free_by_size_.end(); ++it) {
    const std::uint64_t range_size = it->first;
    const Free f = it->second;
    const std::uint64_t start = round_up(f.offset, align);
    if (start + size > f.offset + range_size) continue;
    free_by_size_.erase(it);
    free_by_offset_[f.seq - 1].erase(f.offset);
    if (start > f.offset) insert_free_locked(f.seq, f.offset, start - f.offset);
    const std::uint64_t tail = f.offset + range_size - (start + size);
    if (tail > 0) insert_free_locked(f.seq, start + size, tail);
    try {
      reserve_locked(f.seq, start, size);
    } catch (...) {
      insert_free_locked(f.seq, start, size);  // back where it was; its pages stay given back
      throw;
    }
    *out = Block{f.seq, start, size, segments_[f.seq - 1]->data() + start};
    stats_.bytes_in_use += size;
    stats_.blocks_in_use += 1;
    return true;
  }
  return false;
}

std::optional<Clock::time_point> Arena::trim(Clock::time_point now) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<Clock::time_point> next;
  for (std::size_t i = 0; i < free_by_offset_.size(); ++i) {
    auto& returned = returned_[i];
    for (auto& [offset, range] : free_by_offset_[i]) {
      if (range.trimmed) continue;
      if (range.since + options_.idle > now) {
        if (!next || range.since + options_.idle < *next) next = range.since + options_.idle;
        continue;
      }
      range.trimmed = true;
      // Its whole pages, less those given back already.
      std::uint64_t at = round_up(offset, kPage);
      const std::uint64_t end = (offset + range.size) / kPage * kPage;
      while (at < end) {
        auto it = returned.upper_bound(at);
        if (it != returned.begin() && std::prev(it)->second > at) {
          at = std::prev(it)->second;
          continue;
        }
        const std::uint64_t stop = it == returned.end() ? end : std::min(end, it->first);
        if (!segments_[i]->release_pages(at, stop - at)) return std::nullopt;  // it never will
        // Joined to its neighbours, so the record stays a few ranges.
        std::uint64_t from = at, to = stop;
        if (it != returned.end() && it->first == to) {
          to = it->second;
          it = returned.erase(it);
        }
        if (it != returned.begin() && std::prev(it)->second == from) {
          from = std::prev(it)->first;
          returned.erase(std::prev(it));
        }
        returned.emplace(from, to);
        returned_bytes_ += stop - at;
        detail::bump(detail::counters().bytes_returned, stop - at);
        at = stop;
      }
    }
  }
  stats_.bytes_returned = returned_bytes_;
  return next;
}

void Arena::grow_locked(std::size_t at_least) {
  const std::size_t size = growth_for(at_least, options_.segment_size);
  auto seg = Segment::create(
      size, options_.dir.empty() ? default_segment_place() : SegmentPlace::in_dir(options_.dir));
  segments_.push_back(seg);
  free_by_offset_.emplace_back();
  returned_.emplace_back();
  const auto seq = static_cast<std::uint32_t>(segments_.size());
  set_housekeeping(&give_back_idle);
  publish_segment(seq, std::move(seg));
  insert_free_locked(seq, 0, size);
  stats_.segments += 1;
  stats_.bytes_reserved += size;
  reserved_.store(stats_.bytes_reserved, std::memory_order_relaxed);
  log().debug("arena grew to {} segments, {}", stats_.segments,
              format_bytes(stats_.bytes_reserved));
}

Arena::Block Arena::allocate(std::size_t bytes) {
  return *try_allocate(bytes, true);
}

std::optional<Arena::Block> Arena::try_allocate(std::size_t bytes, bool may_grow) {
  const std::size_t align = bytes >= kLargeBlock ? kLargeAlign : kSmallAlign;
  const std::size_t size = round_up(std::max<std::size_t>(bytes, 1), align);
  if (size < bytes) {
    throw Error(Errc::invalid_argument, "an allocation of " + std::to_string(bytes) + " bytes");
  }
  Block b;
  Ledger* ledger = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (take_locked(size, align, &b)) return b;
    ledger = ledger_.get();
  }
  // Before growing, take back what receivers have finished with or lost by dying; without
  // growing, only what they released (no syscall when nothing was). This runs without the arena
  // lock: ending leases frees blocks, which takes it.
  if (ledger && (may_grow || ledger->has_releases())) ledger->reclaim(may_grow);
  std::lock_guard<std::mutex> lock(mu_);
  if (take_locked(size, align, &b)) return b;
  if (!may_grow) return std::nullopt;
  grow_locked(size);
  if (!take_locked(size, align, &b)) {
    throw Error(Errc::system, "arena: a fresh segment could not hold " + format_bytes(size));
  }
  return b;
}

void Arena::free(const Block& block) noexcept {
  if (pid_ != current_pid()) return;  // a forked child's copy of its parent's arena
  std::lock_guard<std::mutex> lock(mu_);
  insert_free_locked(block.segment_seq, block.offset, block.size);
  stats_.bytes_in_use -= block.size;
  stats_.blocks_in_use -= 1;
}

std::shared_ptr<Segment> Arena::segment(std::uint32_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq == 0) return ledger_ ? ledger_->segment() : nullptr;
  return seq <= segments_.size() ? segments_[seq - 1] : nullptr;
}

Arena::Stats Arena::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.bytes_returned = returned_bytes_;
  return s;
}

}  // namespace ferry
