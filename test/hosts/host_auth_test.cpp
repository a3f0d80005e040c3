// The shared secret and the challenge-response between hosts: who gets in, who does not, and
// what a bad secret file is told.
#include "hosts/host_auth.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include "../catch.hpp"

#include "ipc/error.hpp"

namespace ferry::hosts {
namespace {

// A file in a fresh directory, removed with it.
struct TempFile {
  std::string dir, path;
  TempFile(const std::string& text, mode_t mode) {
    char tmpl[] = "/tmp/ferry-secret-XXXXXX";
    dir = ::mkdtemp(tmpl);
    path = dir + "/secret";
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
  }
  ~TempFile() {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
};

struct EnvGuard {
  ~EnvGuard() { ::unsetenv(kSecretEnv); }
};

const Secret kSecret = Secret::from_bytes("0123456789abcdef-the-job", "a test");

}  // namespace

TEST_CASE("hosts: the right secret proves itself, both ways", "[multihost]") {
  const Challenge head_asks = make_challenge(), host_asks = make_challenge();
  const Proof host_says = prove(kSecret, Role::host, "pair/1", head_asks, host_asks);
  CHECK(verify(kSecret, Role::host, "pair/1", head_asks, host_asks, host_says));
  const Proof head_says = prove(kSecret, Role::head, "pair/1", host_asks, head_asks);
  CHECK(verify(kSecret, Role::head, "pair/1", host_asks, head_asks, head_says));
}

TEST_CASE("hosts: a wrong secret, a replayed answer or a reflected one is refused", "[multihost]") {
  const Secret other = Secret::from_bytes("0123456789abcdef-the-jog", "a test");
  const Challenge asked = make_challenge(), sent = make_challenge();
  const Proof good = prove(kSecret, Role::host, "pair/1", asked, sent);
  // Another secret, one byte apart.
  CHECK_FALSE(verify(kSecret, Role::host, "pair/1", asked, sent,
                     prove(other, Role::host, "pair/1", asked, sent)));
  // The same answer to a fresh challenge: a recording is no use.
  CHECK_FALSE(verify(kSecret, Role::host, "pair/1", make_challenge(), sent, good));
  // For another link.
  CHECK_FALSE(verify(kSecret, Role::host, "pair/2", asked, sent, good));
  // Sent back as the other role's answer (the head's own challenge reflected to it).
  CHECK_FALSE(verify(kSecret, Role::head, "pair/1", asked, sent, good));
  // One bit flipped.
  Proof flipped = good;
  flipped[31] ^= 1;
  CHECK_FALSE(verify(kSecret, Role::host, "pair/1", asked, sent, flipped));
}

TEST_CASE("hosts: challenges are fresh and the proof does not contain the secret", "[multihost]") {
  CHECK(make_challenge() != make_challenge());
  const Proof p = prove(kSecret, Role::host, "pair/1", make_challenge(), make_challenge());
  const std::string proof(p.begin(), p.end());
  CHECK(proof.find(kSecret.bytes().substr(0, 8)) == std::string::npos);
}

TEST_CASE("hosts: the secret comes from an owner-only file, else FERRY_SECRET", "[multihost]") {
  EnvGuard env;
  {
    TempFile f("a-secret-of-enough-bytes\n", 0600);
    CHECK(Secret::load(f.path).bytes() == "a-secret-of-enough-bytes");
  }
  ::setenv(kSecretEnv, "an-env-secret-long-enough", 1);
  CHECK(Secret::load("").bytes() == "an-env-secret-long-enough");
  {
    // The file wins over the environment.
    TempFile f("the-file-secret-long-enough", 0400);
    CHECK(Secret::load(f.path).bytes() == "the-file-secret-long-enough");
  }
}

TEST_CASE("hosts: a bad secret is refused by name, with the remedy", "[multihost]") {
  EnvGuard env;
  auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      return e.what();
    }
    FAIL("no error");
    return "";
  };
  using Catch::Contains;
  {
    TempFile f("a-secret-of-enough-bytes", 0644);
    const std::string m = message_of([&] { Secret::load(f.path); });
    CHECK_THAT(m, Contains(f.path) && Contains("0644") && Contains("chmod 600"));
  }
  {
    TempFile f("short\n", 0600);
    CHECK_THAT(message_of([&] { Secret::load(f.path); }),
               Contains("5 bytes") && Contains("head -c 32 /dev/urandom"));
  }
  CHECK_THAT(message_of([] { Secret::load("/nonexistent/ferry-secret"); }),
             Contains("/nonexistent/ferry-secret") && Contains("No such file"));
  CHECK_THAT(message_of([] { Secret::load(""); }),
             Contains("--secret-file") && Contains(kSecretEnv));
  ::setenv(kSecretEnv, "tiny", 1);
  CHECK_THAT(message_of([] { Secret::load(""); }), Contains(kSecretEnv) && Contains("4 bytes"));
}

}  // namespace ferry::hosts
