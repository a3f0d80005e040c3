// The ways a tensor travels between processes (internal), behind one interface.
//
// A transport turns a tensor into a wire record and back, in three steps that follow the queue's
// own: encode (sender, before the push: describe the tensor, copying it first where it cannot be
// shared, and take a lease on what the record names), claim (receiver, inside the pop, while the
// record is still in the ring: make the lease this process's and map what the tensor needs, so
// the sender may go as soon as it sees the lease claimed) and decode (receiver, after the pop:
// the at::Tensor whose storage ends the lease when it dies). Hooks with defaults let a transport
// act before a send, before a receive and at a normal exit, so the queue holds none of its code.
//
// TensorQueue asks choose() once per tensor and per record which transport carries it, and
// otherwise knows none of them; runtime/transport_table.hpp maps the choice to the transport.
// docs/transports.md says how to add one.
#pragma once

#include <ATen/ATen.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ipc/error.hpp"
#include "ipc/ledger.hpp"
#include "ipc/peer_segments.hpp"
#include "ipc/stats.hpp"
#include "ipc/wire.hpp"

namespace ferry {

class Arena;
class Segment;

namespace detail {

// Which transport carries a tensor.
enum class Carrier : std::uint8_t {
  shm_cpu,    // a block of the sender's shared-memory arena (runtime/transport/shm_cpu)
  cuda_ipc,   // the sender's device memory, or a host copy of it (runtime/transport/cuda_ipc)
  in_record,  // a small copy inside the record itself (runtime/transport/in_record)
};

// What choose() needs to know of a tensor to send.
struct Sending {
  bool cuda = false;
  bool shared = false;      // sent in place: a block of this process's arena, not detached
  bool contiguous = false;  // its view covers its bytes densely, in order
  std::uint64_t bytes = 0;  // the view's bytes
};

// The one choice, pure. A tensor goes by its device; a CPU tensor that would be copied anyway
// (not shared in place) and fits a record (contiguous, at most wire::kInlineBytes) travels in
// it, which spares the arena block, the lease and the receiver's mapping. A record comes back
// through the transport that made it: a CUDA record, or a CPU record staged through shared
// memory for a device (wire::kFlagToDevice), belongs to cuda_ipc; an inline record
// (wire::kFlagInline) to in_record; every other record to shm_cpu.
Carrier choose(const Sending& t) noexcept;
Carrier choose(const wire::Record& r) noexcept;
const char* carrier_name(Carrier c) noexcept;

// The receiving process as the sender knows it. device: -2 unknown (any receiver of a shared
// queue), -1 a process that cannot use CUDA, N its CUDA device.
struct ReceiverHint {
  pid_t pid = 0;
  int device = -2;
};

// What a send knows besides the tensor.
struct SendContext {
  Arena& arena;     // this process's arena, where copies go
  ReceiverHint to;  // who receives, when one process does
  bool detached;    // copy every tensor (CopyReason::detached)
};

// One encoded tensor: its record and the lease that keeps what it names alive.
struct Outgoing {
  wire::Record record;
  Ledger* ledger = nullptr;  // which of this process's ledgers holds the lease; none: no lease
  Ledger::Lease lease;
  std::optional<CopyReason> copied;  // why it was copied first; unset when shared in place
  bool self_contained = false;  // the record holds the bytes: counted neither shared nor copied
  // The segment of this process's arena that the record names (its receiver maps it, and the
  // lease ledger, segment 0): the queue's custody must hold both before the message is pushed,
  // so that it outlives this process.
  std::optional<std::uint32_t> segment;
};

// What the receiver learned about one record while the message was still in the ring.
struct Claim {
  wire::Record record;
  std::shared_ptr<Segment> ledger;  // the sender's ledger, set once the lease is this process's
  std::shared_ptr<Segment> data;    // the segment the tensor lies in (shm_cpu)
  bool sender_exited = false;       // its segments came from the queue's custody
  std::string error;                // why the record cannot be used; empty when it can
  Errc code = Errc::bad_record;
};

// Where an exited sender left its segments (the queue's custody): the pop holds the ring lock
// that reading it needs.
using CustodyLookup = SegmentFallback;

// What a transport still waits for at a normal exit: called until it returns 0 or the linger
// runs out, it says how many tensors this process sent still need the process alive.
using ExitWait = std::function<std::size_t()>;

class Transport {
 public:
  virtual ~Transport() = default;

  // Sender: record and lease for tensor `index` of a message. Throws Error; on a throw no lease
  // is left taken.
  virtual Outgoing encode(const at::Tensor& t, std::size_t index, const SendContext& ctx) const = 0;

  // Receiver, inside the pop: claims c.record's lease for `me` and maps what decode() needs.
  // Throws Error; a claim that sets c.ledger owns the lease from then on.
  virtual void claim(Claim& c, pid_t me, const CustodyLookup& custody) const = 0;

  // Receiver, after the pop: the tensor for a claimed record. Throws Error; the caller then
  // releases the lease.
  virtual at::Tensor decode(Claim& c, pid_t me) const = 0;

  // Tensors this process sent that no receiver has claimed yet (flush()).
  virtual std::size_t in_flight() const = 0;

  // Process `pid` has exited: what this process received from it stops depending on it.
  virtual void peer_exited(pid_t pid) const = 0;

  // Sender, before a message is encoded: housekeeping that needs no thread of its own (the CPU
  // transport ends the leases receivers let go). Every transport is asked, whatever it carries.
  virtual void before_send(const SendContext&) const {}

  // Receiver, before the pop: checks that must fail with no message taken, and housekeeping
  // (the CPU transport moves storages received from senders that died).
  virtual void before_receive() const {}

  // At a normal exit (flush_at_exit()), once: leaves what this process's unclaimed tensors need
  // where their receivers can still reach it, and returns what is left to wait for. By default
  // the process waits for all it has in flight.
  virtual ExitWait at_exit() const {
    return [this] { return in_flight(); };
  }
};

}  // namespace detail
}  // namespace ferry
