// ferry::Error: every failure ferry reports at an API edge. It lives in the lowest layer because
// ipc raises it; runtime and tools re-throw it unchanged so callers catch one type.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ferry {

enum class Errc : std::uint8_t {
  invalid_argument,  // a value the caller passed is out of range; the message names it
  shm_exhausted,     // the shared-memory filesystem has no room for the reservation
  shm_failed,        // creating, sizing or mapping a segment failed for another reason
  bad_record,        // a wire record failed validation; nothing was built from it
  timeout,           // a wait ran out before its condition held
  closed,            // the queue was closed
  peer_dead,         // the process on the other side exited
  ledger_full,       // every lease slot is taken by tensors receivers still hold
  fd_transfer,       // a segment fd could not be fetched from its owner
  system,            // an unexpected system-call failure; the message names the call
  task_failed,       // a task threw in its worker (ferry::TaskError carries where)
  worker_lost,       // a worker died or timed out with the task, and retries ran out
  handshake,         // a worker and its supervisor could not agree to start (version, device)
};

// Short stable name of a code, e.g. "shm_exhausted", for logs and JSON.
const char* errc_name(Errc code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message);
  Errc code() const noexcept { return code_; }
  // The message without the "ferry: <code>: " prefix that what() carries, for wrapping.
  const std::string& detail() const noexcept { return detail_; }

 private:
  Errc code_;
  std::string detail_;
};

// Throws Error(code) whose message is "<what>: <strerror(err)>".
[[noreturn]] void throw_errno(Errc code, const std::string& what, int err);

}  // namespace ferry
