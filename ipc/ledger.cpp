#include "ipc/ledger.hpp"

#include <new>
#include <unordered_map>
#include <utility>

#include "ipc/channel.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/stats.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kMagic = 0x4745444c59525246ull;  // "FRRYLDGE"

// A slot word: state in the top 2 bits, a 30-bit generation, the holder's pid in the low 32.
enum State : std::uint64_t { kFree = 0, kInFlight = 1, kHeld = 2, kReleased = 3 };
constexpr std::uint32_t kGenMask = (1u << 30) - 1;

constexpr std::uint64_t word(State s, std::uint32_t gen, pid_t holder) {
  return (std::uint64_t{s} << 62) | (std::uint64_t{gen & kGenMask} << 32) |
         static_cast<std::uint32_t>(holder);
}
constexpr State state_of(std::uint64_t w) {
  return static_cast<State>(w >> 62);
}
constexpr std::uint32_t gen_of(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> 32) & kGenMask;
}
// A refusal is a release whose holder field has this bit set: pids stay below 2^22.
constexpr std::uint32_t kRefusedBit = 1u << 31;

constexpr pid_t holder_of(std::uint64_t w) {
  return static_cast<pid_t>(w & 0x7fffffffu);
}
constexpr bool refused(std::uint64_t w) {
  return (w & kRefusedBit) != 0;
}

}  // namespace

struct Ledger::Header {
  std::uint64_t magic;
  std::uint32_t slots;
  // Bumped by every release: the owner compares it with what it saw to skip a needless scan.
  std::atomic<std::uint32_t> releases;
};

namespace {
// Where slots start: after the header, aligned to a cache line.
constexpr std::size_t kSlotsOffset = 64;
static_assert(sizeof(std::atomic<std::uint64_t>) == 8, "slots are plain 64-bit words");

std::atomic<std::uint64_t>* peer_slot(const Segment& ledger, std::uint32_t slot) {
  auto* h = reinterpret_cast<const std::uint64_t*>(ledger.data());
  const std::size_t capacity = (ledger.size() - kSlotsOffset) / 8;
  if (h[0] != kMagic || slot >= capacity) return nullptr;
  return reinterpret_cast<std::atomic<std::uint64_t>*>(ledger.data() + kSlotsOffset) + slot;
}
}  // namespace

Ledger::Ledger(std::shared_ptr<Segment> segment) : segment_(std::move(segment)) {}

std::size_t Ledger::segment_bytes(std::uint32_t slots) noexcept {
  return kSlotsOffset + std::size_t{slots} * 8;
}

std::unique_ptr<Ledger> Ledger::create(std::uint32_t slots) {
  if (slots == 0) throw Error(Errc::invalid_argument, "a ledger of 0 lease slots");
  auto seg = Segment::create(segment_bytes(slots));
  auto* h = new (seg->data()) Header;
  h->magic = kMagic;
  h->slots = slots;
  h->releases.store(0);
  for (std::uint32_t i = 0; i < slots; ++i) {
    new (seg->data() + kSlotsOffset + std::size_t{i} * 8) std::atomic<std::uint64_t>(0);
  }
  std::unique_ptr<Ledger> l(new Ledger(std::move(seg)));
  l->local_.resize(slots);
  l->where_.resize(slots);
  l->free_.reserve(slots);
  for (std::uint32_t i = slots; i-- > 0;) l->free_.push_back(i);
  return l;
}

Ledger::Header* Ledger::header() const noexcept {
  return reinterpret_cast<Header*>(segment_->data());
}
std::atomic<std::uint64_t>* Ledger::slots() const noexcept {
  return reinterpret_cast<std::atomic<std::uint64_t>*>(segment_->data() + kSlotsOffset);
}

Ledger::Lease Ledger::acquire(std::shared_ptr<void> keepalive, std::uint32_t segment) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) reclaim_locked(true);
  if (free_.empty()) {
    throw Error(Errc::ledger_full,
                "all " + std::to_string(local_.size()) +
                    " lease slots are held by tensors receivers still use. Remedy: drop received "
                    "tensors sooner, or raise FERRY_LEASE_SLOTS");
  }
  const std::uint32_t slot = free_.back();
  free_.pop_back();
  Local& l = local_[slot];
  l.gen = (l.gen + 1) & kGenMask;
  l.keepalive = std::move(keepalive);
  l.channel.reset();
  l.segment = segment;
  where_[slot] = static_cast<std::uint32_t>(outstanding_.size());
  outstanding_.push_back(slot);
  slots()[slot].store(word(kInFlight, l.gen, 0), std::memory_order_release);
  return {slot, l.gen};
}

bool Ledger::has_room() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) reclaim_locked(true);
  return !free_.empty();
}

void Ledger::route(const Lease& lease, std::shared_ptr<Channel> channel, std::uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  Local& l = local_[lease.slot];
  if (l.gen != lease.gen || !l.keepalive) return;  // already reclaimed
  l.seq = seq;
  l.channel = std::move(channel);
}

void Ledger::abandon(const Lease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  if (local_[lease.slot].gen == lease.gen && local_[lease.slot].keepalive) free_locked(lease.slot);
}

void Ledger::free_locked(std::uint32_t slot) {
  slots()[slot].store(word(kFree, local_[slot].gen, 0), std::memory_order_release);
  Local& l = local_[slot];
  l.keepalive.reset();  // may return the block to the arena
  l.channel.reset();
  const std::uint32_t at = where_[slot];
  outstanding_[at] = outstanding_.back();
  where_[outstanding_[at]] = at;
  outstanding_.pop_back();
  free_.push_back(slot);
}

bool Ledger::has_releases() const noexcept {
  return header()->releases.load(std::memory_order_acquire) !=
         releases_seen_.load(std::memory_order_relaxed);
}

std::size_t Ledger::reclaim(bool check_dead) {
  std::lock_guard<std::mutex> lock(mu_);
  return reclaim_locked(check_dead);
}

std::size_t Ledger::reclaim_locked(bool check_dead) {
  releases_seen_.store(header()->releases.load(std::memory_order_acquire),
                       std::memory_order_relaxed);
  std::unordered_map<pid_t, bool> alive;
  const auto holder_alive = [&alive](pid_t holder) {
    auto it = alive.find(holder);
    if (it == alive.end()) it = alive.emplace(holder, process_alive(holder)).first;
    return it->second;
  };
  // A queue that no process holds any more will never be popped: what its messages keep is
  // taken back (Channel::abandoned(), a few syscalls for a queue this process let go of).
  std::unordered_map<const Channel*, bool> given_up;
  const auto abandoned = [&given_up](const Channel& channel) {
    auto it = given_up.find(&channel);
    if (it == given_up.end()) it = given_up.emplace(&channel, channel.abandoned()).first;
    return it->second;
  };
  std::size_t freed = 0;
  for (std::size_t i = 0; i < outstanding_.size();) {
    const std::uint32_t slot = outstanding_[i];
    const Local& l = local_[slot];
    // Whether the message left its queue is read BEFORE the slot: a receiver claims inside the
    // pop's critical section, before the head store that commits it, so once the pop is seen
    // the slot word read after it is final. Read the other way round, a claim landing between
    // the two reads made a just-claimed lease look discarded, and its block was reused under
    // the receiver.
    const bool consumed = l.channel && l.channel->consumed(l.seq);
    const std::uint64_t w = slots()[slot].load(std::memory_order_acquire);
    bool end = false;
    bool lost = false;
    bool left = false;  // its queue was abandoned with the message in it
    switch (state_of(w)) {
      case kReleased:
        end = true;
        break;
      case kInFlight:
        // Consumed yet never claimed: the message was discarded, nobody will claim it.
        end = consumed;
        if (!end && check_dead && l.channel) end = left = abandoned(*l.channel);
        break;
      case kHeld:
        // Only once the message has left the queue: before that, the next consumer re-claims it,
        // unless no process holds the queue any more (its claimer died inside the pop).
        if (check_dead && l.channel && !holder_alive(holder_of(w))) {
          if (consumed) {
            end = lost = true;
          } else {
            end = left = abandoned(*l.channel);
          }
        }
        break;
      case kFree:
        end = true;
        break;
    }
    if (!end) {
      ++i;
      continue;
    }
    if (left) {
      detail::bump(detail::counters().leases_abandoned);
      log().debug("lease {} taken back: its queue is held by no process any more", slot);
    }
    if (state_of(w) == kReleased && refused(w)) {
      refusals_.push_back({holder_of(w), local_[slot].keepalive});
    }
    if (lost) {
      detail::bump(detail::counters().leases_reclaimed);
      log().debug("lease {} reclaimed from pid {}, which exited holding it", slot, holder_of(w));
    }
    free_locked(slot);  // swaps another slot into position i
    ++freed;
  }
  return freed;
}

std::size_t Ledger::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_.size();
}

std::size_t Ledger::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (std::uint32_t slot : outstanding_) {
    n += state_of(slots()[slot].load(std::memory_order_acquire)) == kInFlight;
  }
  return n;
}

std::vector<Ledger::Unclaimed> Ledger::unclaimed_leases() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Unclaimed> out;
  for (std::uint32_t slot : outstanding_) {
    const Local& l = local_[slot];
    if (slots()[slot].load(std::memory_order_acquire) != word(kInFlight, l.gen, 0)) continue;
    out.push_back({{slot, l.gen}, l.channel, l.seq, l.segment});
  }
  return out;
}

std::vector<Ledger::Refusal> Ledger::take_refusals() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(refusals_, {});
}

bool Ledger::unclaimed(const Lease& lease) const noexcept {
  return slots()[lease.slot].load(std::memory_order_acquire) == word(kInFlight, lease.gen, 0);
}

bool Ledger::claim(const Segment& ledger, std::uint32_t slot, std::uint32_t gen, pid_t me) {
  auto* s = peer_slot(ledger, slot);
  if (!s) return false;
  std::uint64_t w = s->load(std::memory_order_acquire);
  for (;;) {
    if (gen_of(w) != (gen & kGenMask)) return false;
    const State st = state_of(w);
    // HELD by another pid here means that consumer died inside its pop: the message is still at
    // the head, and the caller holds the ring lock, so nobody can be claiming it now. The lease
    // passes to us. Its liveness is not asked: a killed process lets go of its robust locks
    // before it is a zombie, so the next popper can get here while it still looks alive.
    if (st != kInFlight && !(st == kHeld && holder_of(w) != me)) {
      return st == kHeld && holder_of(w) == me;
    }
    if (s->compare_exchange_weak(w, word(kHeld, gen, me), std::memory_order_acq_rel)) return true;
  }
}

void Ledger::end_held(const Segment& ledger, std::uint32_t slot, std::uint32_t gen, pid_t me,
                      std::uint64_t marker) noexcept {
  auto* s = peer_slot(ledger, slot);
  if (!s) return;
  std::uint64_t expected = word(kHeld, gen, me);
  const std::uint64_t released = word(kReleased, gen, me) | marker;
  if (s->compare_exchange_strong(expected, released, std::memory_order_acq_rel)) {
    reinterpret_cast<Header*>(ledger.data())->releases.fetch_add(1, std::memory_order_acq_rel);
  }
}

void Ledger::release(const Segment& ledger, std::uint32_t slot, std::uint32_t gen,
                     pid_t me) noexcept {
  end_held(ledger, slot, gen, me, 0);
}

void Ledger::refuse(const Segment& ledger, std::uint32_t slot, std::uint32_t gen,
                    pid_t me) noexcept {
  end_held(ledger, slot, gen, me, kRefusedBit);
}

}  // namespace ferry
