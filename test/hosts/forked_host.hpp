// A second "host" for the hosts' tests: a process forked before the test starts any thread (the
// store's server is one), so the child is a clean copy. It learns the head's store port through a
// pipe, connects to the store and runs its body; its exit code is what the body returns (2 for
// an exception, whose text goes to stderr; 3 if the port never came).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include "../catch.hpp"

#include "hosts/host_link.hpp"

namespace ferry::hosts::test {

class ForkedHost {
 public:
  // body(store) -> exit code.
  template <class Body>
  explicit ForkedHost(Body body) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(fds[1]);
      std::uint16_t port = 0;
      int code = 3;
      if (::read(fds[0], &port, sizeof port) == sizeof port) {
        try {
          code = body(connect_store("127.0.0.1", port, std::chrono::seconds(10)));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "forked host: %s\n", e.what());
          code = 2;
        }
      }
      ::_exit(code);
    }
    ::close(fds[0]);
    port_fd_ = fds[1];
  }
  ~ForkedHost() {
    if (port_fd_ >= 0) ::close(port_fd_);
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ForkedHost(const ForkedHost&) = delete;
  ForkedHost& operator=(const ForkedHost&) = delete;

  void tell_port(std::uint16_t port) {
    REQUIRE(::write(port_fd_, &port, sizeof port) == sizeof port);
    ::close(port_fd_);
    port_fd_ = -1;
  }
  pid_t pid() const { return pid_; }
  int exit_code() {
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    reaped_ = true;
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  }

 private:
  pid_t pid_ = -1;
  int port_fd_ = -1;
  bool reaped_ = false;
};

}  // namespace ferry::hosts::test
