#include "hosts/host_auth.hpp"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "ipc/env.hpp"
#include "ipc/error.hpp"
#include "ipc/fd.hpp"

namespace ferry::hosts {
namespace {

constexpr const char* kRemedy =
    "make one with `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE` and give every "
    "host of the job the same";

// The bytes the proof is a MAC of. Each field but the last is length-prefixed, so no two
// different inputs give the same bytes.
std::string transcript(Role prover, std::string_view context, const Challenge& asked,
                       const Challenge& sent) {
  std::string t = "ferry-host-v1";
  t.push_back(static_cast<char>(prover));
  const auto n = static_cast<std::uint32_t>(context.size());
  t.append(reinterpret_cast<const char*>(&n), sizeof n);
  t.append(context);
  t.append(reinterpret_cast<const char*>(asked.data()), asked.size());
  t.append(reinterpret_cast<const char*>(sent.data()), sent.size());
  return t;
}

}  // namespace

Secret Secret::from_bytes(std::string bytes, const std::string& origin) {
  if (!bytes.empty() && bytes.back() == '\n') bytes.pop_back();
  if (bytes.size() < kMinSecretBytes) {
    throw Error(Errc::invalid_argument, "the shared secret from " + origin + " has " +
                                            std::to_string(bytes.size()) + " bytes, fewer than " +
                                            std::to_string(kMinSecretBytes) + ": " + kRemedy);
  }
  return Secret(std::move(bytes));
}

Secret Secret::from_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    throw Error(Errc::invalid_argument,
                "cannot open the secret file " + path + ": " + std::strerror(err) + "; " + kRemedy);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno(Errc::system, "fstat " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    throw Error(Errc::invalid_argument, "the secret file " + path + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error(Errc::invalid_argument, "the secret file " + path + " has mode " + mode +
                                            ": others may read or change it; run `chmod 600 " +
                                            path + "`");
  }
  std::string bytes;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::system, "read " + path, errno);
    if (n == 0) break;
    bytes.append(buf, static_cast<std::size_t>(n));
    if (bytes.size() > (1u << 20)) {
      throw Error(Errc::invalid_argument, "the secret file " + path + " is over 1 MiB");
    }
  }
  return from_bytes(std::move(bytes), "the file " + path);
}

Secret Secret::from_env(const char* name) {
  std::string v = env::text(name, "");
  if (v.empty()) {
    throw Error(Errc::invalid_argument,
                std::string("no shared secret: ") + name + " is not set; " + kRemedy);
  }
  return from_bytes(std::move(v), std::string("the environment variable ") + name);
}

Secret Secret::load(const std::string& path) {
  if (!path.empty()) return from_file(path);
  const std::string file = env::text(kSecretFileEnv, "");
  if (!file.empty()) return from_file(file);
  if (env::text(kSecretEnv, "").empty()) {
    throw Error(Errc::invalid_argument,
                std::string("no shared secret: pass a secret file (--secret-file FILE, or ") +
                    kSecretFileEnv + "=FILE) or set " + kSecretEnv + "; " + kRemedy);
  }
  return from_env(kSecretEnv);
}

Challenge make_challenge() {
  Challenge c{};
  std::size_t got = 0;
  while (got < c.size()) {
    const ssize_t n = ::getrandom(c.data() + got, c.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::system, "getrandom", errno);
    got += static_cast<std::size_t>(n);
  }
  return c;
}

Proof prove(const Secret& secret, Role prover, std::string_view context, const Challenge& asked,
            const Challenge& sent) {
  const std::string t = transcript(prover, context, asked, sent);
  Proof p{};
  unsigned int len = 0;
  if (::HMAC(EVP_sha256(), secret.bytes().data(), static_cast<int>(secret.bytes().size()),
             reinterpret_cast<const unsigned char*>(t.data()), t.size(), p.data(),
             &len) == nullptr ||
      len != p.size()) {
    throw Error(Errc::system, "HMAC-SHA256 failed (OpenSSL)");
  }
  return p;
}

bool verify(const Secret& secret, Role prover, std::string_view context, const Challenge& asked,
            const Challenge& sent, const Proof& proof) {
  const Proof want = prove(secret, prover, context, asked, sent);
  return CRYPTO_memcmp(want.data(), proof.data(), want.size()) == 0;
}

}  // namespace ferry::hosts
