#include "ipc/proc_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <exception>

namespace ferry::proc {

std::optional<std::string> slurp(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    errno = err;
    return std::nullopt;
  }
  return out;
}

std::optional<std::uint64_t> read_u64(const std::string& path) {
  auto text = slurp(path);
  if (!text) return std::nullopt;
  try {
    std::size_t used = 0;
    const unsigned long long v = std::stoull(*text, &used);
    return static_cast<std::uint64_t>(v);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace ferry::proc
