// Fills a filesystem the way another job would: one file takes every free byte. For the tests
// and the soak that starve ferry of shared memory; no Catch2, so the soak's own binaries use it.
#pragma once

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ferry::test {

// Creates `dir`/`name` over all the free space of dir's filesystem and returns its path; the
// caller removes it. Throws std::runtime_error naming the path when it cannot be created.
inline std::string fill_filesystem(const std::string& dir, const std::string& name = "filler") {
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  struct statvfs v {};
  ::statvfs(dir.c_str(), &v);
  const off_t left = off_t(v.f_bavail) * off_t(v.f_frsize);
  off_t at = 0;
  for (off_t step = left; step >= 4096; step /= 2) {  // the last pages may not all fit at once
    while (::posix_fallocate(fd, at, step) == 0) at += step;
  }
  ::close(fd);
  return path;
}

}  // namespace ferry::test
