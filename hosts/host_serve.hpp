// The host's side of a job spread over several hosts: tasks that come over the link from the
// head run on this host's own ferry::Pool (shared memory inside the host, zero-copy), and their
// results go back over the link (docs/multi-host.md).
//
// Three threads share the link: the caller's receives tasks and hands them to the pool (a task
// the pool refuses, e.g. a name it lacks, is answered with its error at once); the pool's threads
// put each result in an outbox; one sender thread sends results in the order they end, a
// heartbeat when the link has been quiet for `heartbeat`, and the goodbye. Either side that
// leaves says goodbye, and the other answers it, so both stop at once rather than at a timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>

#include "hosts/host_link.hpp"
#include "runtime/pool.hpp"

namespace ferry::hosts {

struct ServeOptions {
  std::chrono::milliseconds heartbeat{500};    // a quiet link sends one this often
  std::chrono::milliseconds lost_after{5000};  // a head silent this long is gone
};

enum class ServeEnd {
  head_left,  // the head said goodbye (its job ended)
  stopped,    // `stop` was set: this host said goodbye and the head answered
};

// Serves the head over `link` on `pool` until one side leaves. Throws Error(peer_dead) when the
// head's process is gone, Error(timeout) when it was silent for lost_after, Error(bad_record) for
// a frame a head does not send. Tasks still running when it returns are the caller's to cancel
// (Pool::close); the head retries them elsewhere.
ServeEnd serve_head(Pool& pool, HostLink& link, const ServeOptions& options,
                    const std::atomic<bool>& stop);

// As above, while `start` makes this host's pool on a thread of its own (a Python host learns its
// workers' setup only when it joins, and a pool takes seconds to start): heartbeats go out
// meanwhile and tasks that arrive wait for the pool. When `start` throws, this host says goodbye
// and, once the head has answered, serve_head rethrows what `start` threw (the head retries the
// tasks it had sent). `start`'s pool is the caller's to close.
ServeEnd serve_head(const std::function<Pool&()>& start, HostLink& link,
                    const ServeOptions& options, const std::atomic<bool>& stop);

}  // namespace ferry::hosts
