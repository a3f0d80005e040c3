// HostLink: the messages between the head and one host, over a two-rank Gloo process group of
// c10d's, met through the job's store (host_store.hpp; docs/multi-host.md, "The link").
//
// This file, host_store.hpp and their .cpps are ferry's one adapter to c10d: what differs between
// LibTorch 1.13 and 2.x (the Gloo group's base class here, TCPStoreOptions' fields there, watchKey,
// the error types) stays inside them. Each pair of hosts has its own group, under its own store
// prefix, so losing one host breaks only its link; there is never a collective across hosts.
//
// The rules a user of a link relies on:
// - a message is a frame (host_frame.hpp) and the payload tensors it describes, sent and received
//   in order, in the frame, in one slab (behind a wide frame, or apart) or apart
//   (plan_message()); the receiver checks the frame before posting a payload's receives, a
//   frame's receive is exactly kFrameBytes or, where the peer's last frame announced it,
//   kWideFrameBytes, and a slab's receive is always exactly kSlabBytes, so a bad peer gets
//   Error(bad_record), never a receive of a size it did not announce (one of the wrong size
//   would abort this process);
// - any failure breaks the link for good (Gloo closes the pair after a timeout, and a host that
//   failed once is treated as lost): the call throws Error(peer_dead) when the peer's connection
//   closed, Error(timeout) when a wait ran out, and every later call throws at once;
// - a receive waits at most the timeout it is given, then the link is broken: pass the time after
//   which the peer counts as lost (an idle peer sends heartbeats), not a polling interval;
// - a send completes only once the peer has posted the matching receive (Gloo's pairs hand
//   over unbuffered); from its first recv() on, a side keeps its next frame's receive posted, so
//   a peer's frame goes out at once while this side does something else, but a payload sent
//   apart waits for its receive: each side keeps a thread receiving while another sends, as the
//   head and the hosts do, or the two sides alternate; two sides that both send before either
//   has received wait for each other until the timeout;
// - one thread may send while another receives; concurrent sends (or receives) are serialised;
// - the first link makes this process ignore SIGPIPE (unless the program set a handler): Gloo
//   writes without MSG_NOSIGNAL, and a write to a peer that just died must break the link, not
//   kill this process.
#pragma once

#include <ATen/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hosts/host_frame.hpp"
#include "hosts/host_store.hpp"
#include "ipc/error.hpp"

namespace ferry::hosts {

struct LinkOptions {
  // This side's address as the peer reaches it: Gloo listens there for the pair's connection.
  std::string address = "127.0.0.1";
  // How long a send waits for the peer to take a frame (and a payload's receive, below).
  std::chrono::milliseconds timeout{30000};
  // How long making the link, and each step of a join (host_join.hpp), waits for the peer.
  std::chrono::milliseconds join_timeout{30000};
  // A payload's wait is the timeout plus its size at this rate, so a large tensor on a slow link
  // is not mistaken for a frozen peer.
  double min_bytes_per_s = 50e6;
  // The most payload bytes one incoming message may announce (a bad frame cannot make this side
  // allocate more).
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 40;
  // Where a received payload is put; null: receive_buffer().
  std::function<at::Tensor(at::IntArrayRef sizes, at::ScalarType dtype)> allocate;
};

struct Message {
  Frame frame;
  std::vector<at::Tensor> tensors;  // CPU, contiguous, as the frame describes them
};

class HostLink {
 public:
  // Joins the link named `prefix` in `store` as `rank` (0: the head, 1: the host). Blocks until
  // the peer has joined too, at most options.timeout: Error(timeout) otherwise.
  HostLink(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
           LinkOptions options);
  ~HostLink();
  HostLink(const HostLink&) = delete;
  HostLink& operator=(const HostLink&) = delete;

  // Sends a frame of `kind`, `seq` and `body`, then `tensors` (sent contiguous; a CUDA tensor as a
  // CPU copy, counted in transport_stats() as CopyReason::other_host, and received as a CPU
  // tensor). Error as above; Error(invalid_argument) for what a frame cannot carry or a sparse
  // tensor (the link is not broken by those).
  void send(FrameKind kind, std::uint64_t seq, const std::string& body,
            const std::vector<at::Tensor>& tensors);
  // The next message; waits at most `timeout` for its frame, then breaks the link.
  Message recv(std::chrono::milliseconds timeout);

  bool broken() const noexcept;
  const std::string& name() const noexcept;  // the prefix, for messages

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Where a link receives a payload by default: ferry's shared-memory arena (empty_shared), whose
// blocks come back for reuse when dropped, already mapped: a fresh 64 MiB allocation per receive
// made the link 10x slower than plain Gloo (its pages faulted in under the socket reads), and
// what arrives there reaches this host's workers without a copy. Where /dev/shm has no room,
// ordinary memory.
at::Tensor receive_buffer(at::IntArrayRef sizes, at::ScalarType dtype);

// What a failure of the link means, from the text of what Gloo or c10d threw: Errc::timeout when
// a wait ran out (a frozen peer, a cut network), Errc::peer_dead otherwise (a closed or reset
// connection: the peer's process is gone).
Errc link_failure_code(std::string_view what) noexcept;

}  // namespace ferry::hosts
