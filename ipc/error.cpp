#include "ipc/error.hpp"

#include <cstring>

namespace ferry {

const char* errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::shm_exhausted:
      return "shm_exhausted";
    case Errc::shm_failed:
      return "shm_failed";
    case Errc::bad_record:
      return "bad_record";
    case Errc::timeout:
      return "timeout";
    case Errc::closed:
      return "closed";
    case Errc::peer_dead:
      return "peer_dead";
    case Errc::ledger_full:
      return "ledger_full";
    case Errc::fd_transfer:
      return "fd_transfer";
    case Errc::system:
      return "system";
    case Errc::task_failed:
      return "task_failed";
    case Errc::worker_lost:
      return "worker_lost";
    case Errc::handshake:
      return "handshake";
  }
  return "unknown";
}

Error::Error(Errc code, const std::string& message)
    : std::runtime_error(std::string("ferry: ") + errc_name(code) + ": " + message),
      code_(code),
      detail_(message) {}

void throw_errno(Errc code, const std::string& what, int err) {
  throw Error(code, what + ": " + std::strerror(err));
}

}  // namespace ferry
