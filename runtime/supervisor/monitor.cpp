#include "runtime/supervisor/monitor.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "ipc/error.hpp"
#include "ipc/log.hpp"

namespace ferry::supervisor {

Monitor::Monitor() : wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!wake_) throw_errno(Errc::system, "eventfd for the pool's monitor", errno);
}

void Monitor::rouse() const noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

void Monitor::wait(std::vector<pollfd>& watch, Clock::time_point until) {
  watch.push_back({wake_.get(), POLLIN, 0});
  const auto now = Clock::now();
  const auto cap = now + std::chrono::milliseconds(250);
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::min(until, cap) - now);
  // +1: poll rounds down, and waking a moment early would only spin.
  const int ms = static_cast<int>(std::max<long long>(left.count(), 0)) + 1;
  const int n = ::poll(watch.data(), watch.size(), ms);
  if (n < 0 && errno != EINTR) {
    // Not expected with fds the pool owns; never spin on it.
    log().error("pool monitor: poll: {}", std::strerror(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (n > 0 && (watch.back().revents & POLLIN)) {
    std::uint64_t drained;
    [[maybe_unused]] ssize_t r = ::read(wake_.get(), &drained, sizeof drained);
  }
  watch.pop_back();
}

}  // namespace ferry::supervisor
