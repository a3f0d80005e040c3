#include "python/fds.hpp"

#include <fcntl.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <optional>

#include "ipc/error.hpp"
#include "ipc/process.hpp"
#include "ipc/segment_server.hpp"
#include "python/durations.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

std::atomic<std::uint32_t> g_next{0};

}  // namespace

void bind_fds(py::module_& m) {
  m.def(
      "publish_fd",
      [](int fd) {
        UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
        if (!copy) throw_errno(Errc::system, "publish_fd: dup of fd " + std::to_string(fd), errno);
        auto bundle = std::make_shared<FdBundle>();
        bundle->fds.push_back(std::move(copy));
        const std::uint32_t seq = kFirstHandedFdSeq | (g_next.fetch_add(1) & 0x3fffffffu);
        publish_bundle(seq, std::move(bundle));
        return seq;
      },
      py::arg("fd"), "publishes a copy of `fd` for this user's processes to fetch; its seq");
  m.def("withdraw_fd", &withdraw_segment, py::arg("seq"),
        "withdraws (and closes) what publish_fd published");
  m.def(
      "fetch_fd",
      [](pid_t pid, std::uint64_t token, std::uint32_t seq, std::optional<double> timeout) {
        const auto ms = to_timeout(timeout);
        FdBundle b;
        {
          py::gil_scoped_release unlocked;
          b = fetch_bundle(pid, token, seq, ms);
        }
        if (b.fds.size() != 1) {
          throw Error(Errc::fd_transfer, "process " + std::to_string(pid) + " answered with " +
                                             std::to_string(b.fds.size()) + " fds, not 1");
        }
        return b.fds[0].release();
      },
      py::arg("pid"), py::arg("token"), py::arg("seq"), py::arg("timeout") = 10.0,
      "a new fd (the caller's to close) of what process `pid` published as `seq`");
  m.def("process_token", &process_token, "this process's token (pid and token name it)");
  m.def("process_alive", &process_alive, py::arg("pid"),
        "whether `pid` is a process that has not exited (a zombie has)");
}

}  // namespace ferry::python
