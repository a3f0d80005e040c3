#include "ipc/cuda/import_cache.hpp"

#include <algorithm>
#include <set>
#include <tuple>

#include "ipc/stats.hpp"

namespace ferry::cuda {

bool BlockKey::operator<(const BlockKey& o) const noexcept {
  return std::tie(owner, device, base, size, buffer_id) <
         std::tie(o.owner, o.device, o.base, o.size, o.buffer_id);
}
bool BlockKey::operator==(const BlockKey& o) const noexcept {
  return same_place(o) && size == o.size && buffer_id == o.buffer_id;
}
bool BlockKey::same_place(const BlockKey& o) const noexcept {
  return owner == o.owner && device == o.device && base == o.base;
}

ImportCache::Entry* ImportCache::find(EntryId id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}
const ImportCache::Entry* ImportCache::find(EntryId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

ImportCache::Lookup ImportCache::acquire(const BlockKey& key) {
  Lookup out;
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    Entry& e = entries_.at(it->second);
    out.id = it->second;
    switch (e.state) {
      case State::opening:
      case State::closing:
        out.action = Lookup::wait;
        return out;
      case State::idle:
        e.state = State::open;
        [[fallthrough]];
      case State::open:
        ++e.views;
        out.action = Lookup::use;
        out.local = e.local;
        return out;
    }
  }
  // Blocks sit in by_key_ ordered by owner, device, then base: the same place is one range.
  BlockKey low = key;
  low.size = 0;
  low.buffer_id = 0;
  for (auto it = by_key_.lower_bound(low); it != by_key_.end() && it->first.same_place(key); ++it) {
    Entry& e = entries_.at(it->second);
    if (e.state == State::idle) {
      e.state = State::closing;
      stale_.push_back(it->second);
      detail::bump(detail::counters().cuda_stale_entries);
    }
  }
  const EntryId id = next_id_++;
  Entry& e = entries_[id];
  e.key = key;
  e.views = 1;
  by_key_[key] = id;
  out.action = Lookup::open;
  out.id = id;
  return out;
}

void ImportCache::opened(EntryId id, int device, void* local) {
  if (Entry* e = find(id)) {
    e->state = State::open;
    e->device = device;
    e->local = local;
  }
}

void ImportCache::open_failed(EntryId id) {
  if (Entry* e = find(id)) {
    by_key_.erase(e->key);
    entries_.erase(id);
  }
}

bool ImportCache::drop_view(EntryId id, std::optional<LeaseRef> lease, Clock::time_point now) {
  if (lease) release_.push_back(std::move(*lease));
  Entry* e = find(id);
  if (e == nullptr || e->views == 0) return false;
  if (--e->views > 0) return false;
  e->state = State::idle;
  e->idle_since = now;
  return true;
}

std::optional<ImportCache::Clock::time_point> ImportCache::next_close(
    Clock::duration linger) const {
  std::optional<Clock::time_point> next;
  for (const auto& [id, e] : entries_) {
    if (e.state == State::idle && (!next || e.idle_since + linger < *next)) {
      next = e.idle_since + linger;
    }
  }
  return next;
}

ImportCache::Work ImportCache::take_work(Clock::time_point now, Clock::duration linger) {
  Work w;
  w.release.swap(release_);
  for (EntryId id : stale_) {
    if (const Entry* e = find(id)) w.close.push_back({id, e->device, e->local});
  }
  stale_.clear();
  for (auto& [id, e] : entries_) {
    if (e.state != State::idle || now - e.idle_since < linger) continue;
    e.state = State::closing;
    w.close.push_back({id, e.device, e.local});
  }
  return w;
}

void ImportCache::closed(EntryId id) {
  if (Entry* e = find(id)) {
    if (auto it = by_key_.find(e->key); it != by_key_.end() && it->second == id) by_key_.erase(it);
    entries_.erase(id);
  }
}

std::size_t ImportCache::owner_died(const ProcessIdentity& owner) {
  std::size_t n = 0;
  for (auto& [id, e] : entries_) {
    if (e.key.owner == owner && !e.owner_dead) {
      e.owner_dead = true;
      ++n;
    }
  }
  return n;
}

bool ImportCache::owner_dead(EntryId id) const {
  const Entry* e = find(id);
  return e != nullptr && e->owner_dead;
}

std::vector<ProcessIdentity> ImportCache::owners() const {
  std::set<ProcessIdentity> s;
  for (const auto& [id, e] : entries_) {
    if (!e.owner_dead) s.insert(e.key.owner);
  }
  return {s.begin(), s.end()};
}

const BlockKey* ImportCache::key_of(EntryId id) const {
  const Entry* e = find(id);
  return e ? &e->key : nullptr;
}
ImportCache::State ImportCache::state_of(EntryId id) const {
  const Entry* e = find(id);
  return e ? e->state : State::closing;
}
std::size_t ImportCache::views_of(EntryId id) const {
  const Entry* e = find(id);
  return e ? e->views : 0;
}

}  // namespace ferry::cuda
