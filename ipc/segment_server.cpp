#include "ipc/segment_server.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ipc/clock.hpp"
#include "ipc/control_socket.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/stats.hpp"

namespace ferry {
namespace {

constexpr std::uint32_t kRequestMagic = 0x46525153;  // "FRQS"
constexpr std::uint32_t kFound = 1, kMissing = 2;

struct Request {
  std::uint32_t magic;
  std::uint32_t seq;
};
// Followed, for a bundle, by its bytes.
struct Reply {
  std::uint32_t status;
  std::uint32_t fds;   // how many fds ride with it
  std::uint64_t size;  // a segment's size, or a bundle's byte count
};

// What a seq names: a segment (one fd, mappable) or a bundle.
struct Published {
  std::shared_ptr<Segment> segment;
  std::shared_ptr<const FdBundle> bundle;
};

socklen_t socket_address(pid_t pid, std::uint64_t token, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  // Abstract namespace (leading NUL): nothing on disk to leak when the owner dies.
  int n = std::snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "ferry-seg-%d-%016llx",
                        static_cast<int>(pid), static_cast<unsigned long long>(token));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// One per process. A forked child gets a fresh one: the parent's (inherited as a copy) is left
// alone and leaked, because tensors the child inherited may still point into its segments.
struct Server {
  pid_t pid = 0;
  int listen_fd = -1;
  std::unordered_map<std::uint32_t, Published> published;
};

std::mutex g_mu;
Server* g_server = nullptr;
std::atomic<void (*)() noexcept> g_reader_exit_hook{nullptr};
std::atomic<bool (*)() noexcept> g_sweep_pending{nullptr};
std::atomic<Housekeeping> g_housekeeping{nullptr};
// When housekeeping next comes due (steady clock, ns; kNever: nothing pending), and the eventfd
// that wakes the serving thread of process g_wake_pid when it had nothing pending.
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();
std::atomic<std::int64_t> g_housekeeping_due{kNever};
std::atomic<int> g_wake_fd{-1};
std::atomic<pid_t> g_wake_pid{0};

std::int64_t ns_of(Clock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Lowers the due time to `due`; true when it was lowered.
bool lower_due(std::int64_t due) noexcept {
  std::int64_t cur = g_housekeeping_due.load(std::memory_order_relaxed);
  while (due < cur) {
    if (g_housekeeping_due.compare_exchange_weak(cur, due)) return true;
  }
  return false;
}
// How often the hook also runs while g_sweep_pending says so: the bound on how long a lease
// outlives a reader this server never watched (a child forked after its parent mapped our
// segments uses them without asking) or stopped watching (beyond kMaxWatched).
constexpr int kSweepMs = 1000;
// Readers watched at most: beyond, a reader's death is noticed by the sweep (kSweepMs).
constexpr std::size_t kMaxWatched = 1024;

// A forked child's server, when it makes one, starts with nothing pending.
void in_forked_child() {
  g_mu.unlock();
  g_housekeeping_due.store(kNever);
  g_wake_fd.store(-1);
}

[[maybe_unused]] const int g_atfork =
    pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, in_forked_child);

struct Reader {
  pid_t pid;
  UniqueFd pidfd;  // readable once the reader has exited
};

// Starts watching `pid` unless it is watched already. Called before the reader gets its reply,
// while it waits for it: the pid is still its own, so no reader can exit (and have its pid
// reused) between being served and being watched.
void watch(std::vector<Reader>& readers, pid_t pid) {
  if (readers.size() >= kMaxWatched) return;
  for (const Reader& r : readers) {
    if (r.pid == pid) return;
  }
  try {
    readers.push_back({pid, open_pidfd(pid)});
  } catch (const Error& e) {
    log().debug("segment server: not watching pid {}: {}", pid, e.detail());
  }
}

// Serves one request; a process about to get a segment is watched first.
void serve_one(int conn, std::vector<Reader>& readers) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::geteuid()) {
    return;  // only processes of our own user may map our memory
  }
  pollfd p{conn, POLLIN, 0};
  if (::poll(&p, 1, 1000) != 1) return;  // a peer that connects and says nothing is dropped
  Request req{};
  if (::recv(conn, &req, sizeof req, 0) != static_cast<ssize_t>(sizeof req) ||
      req.magic != kRequestMagic) {
    return;
  }
  Published found;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_server->published.find(req.seq);
    if (it != g_server->published.end()) found = it->second;
  }
  Reply reply{kMissing, 0, 0};
  std::string bytes;
  std::vector<int> fds;
  if (found.segment) {
    reply = Reply{kFound, 1, found.segment->size()};
    fds.push_back(found.segment->fd());
  } else if (found.bundle) {
    reply = Reply{kFound, static_cast<std::uint32_t>(found.bundle->fds.size()),
                  found.bundle->bytes.size()};
    bytes = found.bundle->bytes;
    for (const UniqueFd& fd : found.bundle->fds) fds.push_back(fd.get());
  }
  if (reply.status == kFound && cred.pid > 0) watch(readers, cred.pid);
  bytes.insert(0, reinterpret_cast<const char*>(&reply), sizeof reply);
  try {
    send_control(conn, bytes, fds);
  } catch (const Error& e) {
    log().debug("segment server: answering pid {}: {}", cred.pid, e.detail());
  }
}

void serve_forever(int listen_fd, int wake_fd, std::shared_ptr<std::promise<void>> started) {
  started->set_value();
  std::vector<Reader> readers;
  std::vector<pollfd> polled;
  constexpr std::size_t kFirstReader = 2;  // after the listening socket and the wake-up fd
  // Counted from the last sweep, so that a server kept busy by requests still sweeps.
  auto next_sweep = Clock::now() + std::chrono::milliseconds(kSweepMs);
  for (;;) {
    polled.assign({pollfd{listen_fd, POLLIN, 0}, pollfd{wake_fd, POLLIN, 0}});
    for (const Reader& r : readers) polled.push_back({r.pidfd.get(), POLLIN, 0});
    const auto pending = g_sweep_pending.load();
    const bool sweeping = pending && pending();
    const Clock::time_point now = Clock::now();
    std::optional<Clock::time_point> until;
    if (sweeping) {
      until = next_sweep;
    } else {
      next_sweep = now + std::chrono::milliseconds(kSweepMs);
    }
    const std::int64_t due = g_housekeeping_due.load(std::memory_order_relaxed);
    if (due != kNever) {
      const Clock::time_point at{
          std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(due))};
      if (!until || at < *until) until = at;
    }
    int timeout = -1;
    if (until) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*until - now);
      timeout = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
    }
    if (::poll(polled.data(), polled.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      log().error("segment server stopped: poll: {}", std::strerror(errno));
      return;
    }
    if (polled[1].revents & POLLIN) {
      std::uint64_t n;
      [[maybe_unused]] ssize_t r = ::read(wake_fd, &n, sizeof n);
    }
    const Clock::time_point woke = Clock::now();
    if (const auto run = g_housekeeping.load();
        run && g_housekeeping_due.load(std::memory_order_relaxed) <= ns_of(woke)) {
      // Cleared first: what is noted while it runs lowers it again and is not lost.
      g_housekeeping_due.store(kNever);
      if (const auto next = run(woke)) lower_due(ns_of(*next));
    }
    // A sweep runs the hook as if someone had exited.
    bool exited = sweeping && woke >= next_sweep;
    if (exited) next_sweep = woke + std::chrono::milliseconds(kSweepMs);
    for (std::size_t i = polled.size(); i-- > kFirstReader;) {
      if (polled[i].revents == 0) continue;
      log().debug("segment server: reader {} exited", readers[i - kFirstReader].pid);
      readers.erase(readers.begin() + static_cast<std::ptrdiff_t>(i - kFirstReader));
      exited = true;
    }
    if (exited) {
      if (auto hook = g_reader_exit_hook.load()) hook();
    }
    if ((polled[0].revents & POLLIN) == 0) continue;
    int conn = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      if (errno == EMFILE || errno == ENFILE) {
        log().warn("segment server: out of file descriptors, retrying (raise ulimit -n)");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      log().error("segment server stopped: accept: {}", std::strerror(errno));
      return;
    }
    serve_one(conn, readers);
    ::close(conn);
  }
}

// Called with g_mu held.
Server& local_server() {
  if (g_server && g_server->pid == current_pid()) return *g_server;
  auto* s = new Server;  // never freed: the serving thread uses it until the process exits
  s->pid = current_pid();
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_errno(Errc::system, "segment server: socket", errno);
  sockaddr_un addr{};
  socklen_t len = socket_address(s->pid, process_token(), &addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 64) != 0) {
    int err = errno;
    ::close(fd);
    throw_errno(Errc::system, "segment server: bind/listen", err);
  }
  s->listen_fd = fd;
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int err = errno;
    ::close(fd);
    throw_errno(Errc::system, "segment server: eventfd", err);
  }
  // Wait until the thread runs: a fork while it is still starting (inside the allocator, with
  // sanitizer runtimes that do not guard it across fork) would leave the child a lock held
  // forever, and users often fork right after their first shared tensor.
  auto started = std::make_shared<std::promise<void>>();
  std::future<void> running = started->get_future();
  g_wake_pid.store(s->pid);
  g_wake_fd.store(wake);
  std::thread(serve_forever, fd, wake, std::move(started)).detach();
  running.wait();
  g_server = s;
  log().debug("segment server listening for pid {}", s->pid);
  return *s;
}

}  // namespace

void publish_segment(std::uint32_t seq, std::shared_ptr<Segment> segment) {
  std::lock_guard<std::mutex> lock(g_mu);
  local_server().published[seq] = Published{std::move(segment), nullptr};
}

void publish_bundle(std::uint32_t seq, std::shared_ptr<const FdBundle> bundle) {
  std::lock_guard<std::mutex> lock(g_mu);
  local_server().published[seq] = Published{nullptr, std::move(bundle)};
}

void withdraw_segment(std::uint32_t seq) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_server && g_server->pid == current_pid()) g_server->published.erase(seq);
}

void set_housekeeping(Housekeeping run) noexcept {
  g_housekeeping.store(run);
}

void note_housekeeping(Clock::time_point due) noexcept {
  if (!lower_due(ns_of(due))) return;  // the thread wakes by then anyway
  const int fd = g_wake_fd.load();
  if (fd >= 0 && g_wake_pid.load() == current_pid()) {
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(fd, &one, sizeof one);
  }
}

void set_reader_exit_hook(void (*hook)() noexcept, bool (*pending)() noexcept) noexcept {
  g_sweep_pending.store(pending);
  g_reader_exit_hook.store(hook);
}

std::shared_ptr<Segment> find_published_segment(std::uint32_t seq) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_server || g_server->pid != current_pid()) return nullptr;
  auto it = g_server->published.find(seq);
  return it == g_server->published.end() ? nullptr : it->second.segment;
}

namespace {

// A killed process closes its sockets a moment before it becomes a zombie, so a fetch that
// failed because its owner is dying is told from a live owner's fault by watching it briefly
// (on the error path only).
bool owner_gone(pid_t pid) {
  for (int i = 0; i < 20; ++i) {
    if (!process_alive(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace

namespace {

// Asks the owner for entry `seq`; returns its answer once it says found.
ControlMessage fetch_entry(pid_t owner_pid, std::uint64_t owner_token, std::uint32_t seq,
                           std::chrono::milliseconds timeout, Reply* reply) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock) throw_errno(Errc::fd_transfer, "socket for a segment fetch", errno);
  if (timeout.count() >= 0) {
    timeval tv{static_cast<time_t>(timeout.count() / 1000),
               static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  sockaddr_un addr{};
  socklen_t len = socket_address(owner_pid, owner_token, &addr);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    int err = errno;
    if (owner_gone(owner_pid)) {
      throw Error(Errc::peer_dead, "the sender (pid " + std::to_string(owner_pid) +
                                       ") exited before its segment " + std::to_string(seq) +
                                       " was mapped here; its tensor is lost");
    }
    throw_errno(Errc::fd_transfer,
                "cannot reach the segment server of pid " + std::to_string(owner_pid) +
                    " (is it in another network namespace?)",
                err);
  }
  Request req{kRequestMagic, seq};
  if (::send(sock.get(), &req, sizeof req, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof req)) {
    // An owner that died between the connect and the send breaks the pipe: that is its death,
    // which the caller answers from the queue's custody, not a failure of this process's own.
    const int err = errno;
    if (owner_gone(owner_pid)) {
      throw Error(Errc::peer_dead, "the sender (pid " + std::to_string(owner_pid) +
                                       ") exited while segment " + std::to_string(seq) +
                                       " was asked of it");
    }
    throw_errno(Errc::fd_transfer, "sending a segment request to pid " + std::to_string(owner_pid),
                err);
  }
  ControlMessage answer;
  try {
    answer = recv_control(sock.get(), timeout);
  } catch (const Error& e) {
    if (e.code() == Errc::timeout) {
      throw Error(Errc::timeout, "pid " + std::to_string(owner_pid) +
                                     " did not hand over segment " + std::to_string(seq) +
                                     " within " + std::to_string(timeout.count()) + " ms");
    }
    if (e.code() == Errc::fd_transfer) throw;  // this process is out of descriptors
    if (owner_gone(owner_pid)) {
      throw Error(Errc::peer_dead, "the sender (pid " + std::to_string(owner_pid) +
                                       ") exited while handing over segment " +
                                       std::to_string(seq));
    }
    throw Error(Errc::fd_transfer, "pid " + std::to_string(owner_pid) +
                                       " closed the connection without an answer (too many open "
                                       "files there? raise ulimit -n)");
  }
  *reply = Reply{};
  if (answer.bytes.size() >= sizeof *reply) std::memcpy(reply, answer.bytes.data(), sizeof *reply);
  if (reply->status != kFound || answer.fds.size() != reply->fds) {
    throw Error(Errc::fd_transfer, "pid " + std::to_string(owner_pid) + " no longer has segment " +
                                       std::to_string(seq));
  }
  answer.bytes.erase(0, sizeof *reply);
  detail::bump(detail::counters().fds_fetched, answer.fds.size());
  return answer;
}

}  // namespace

UniqueFd fetch_segment_fd(pid_t owner_pid, std::uint64_t owner_token, std::uint32_t seq,
                          std::chrono::milliseconds timeout) {
  Reply reply{};
  ControlMessage answer = fetch_entry(owner_pid, owner_token, seq, timeout, &reply);
  if (answer.fds.size() != 1 || !answer.bytes.empty()) {
    throw Error(Errc::fd_transfer, "pid " + std::to_string(owner_pid) + "'s entry " +
                                       std::to_string(seq) + " is not a segment");
  }
  return std::move(answer.fds[0]);
}

FdBundle fetch_bundle(pid_t owner_pid, std::uint64_t owner_token, std::uint32_t seq,
                      std::chrono::milliseconds timeout) {
  Reply reply{};
  ControlMessage answer = fetch_entry(owner_pid, owner_token, seq, timeout, &reply);
  if (answer.bytes.size() != reply.size) {
    throw Error(Errc::fd_transfer, "pid " + std::to_string(owner_pid) + "'s entry " +
                                       std::to_string(seq) + " is not a bundle");
  }
  return FdBundle{std::move(answer.fds), std::move(answer.bytes)};
}

}  // namespace ferry
