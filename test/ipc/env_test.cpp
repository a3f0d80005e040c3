// The environment reader: every accepted form of each kind, and every refusal naming the
// variable, its value and what is accepted.
#include "ipc/env.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "../catch.hpp"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "../test_util.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"

namespace {

using namespace std::chrono_literals;
namespace env = ferry::env;

// Sets `name` to `value` for one scope (nullptr: unset), then unsets it.
struct Var {
  const char* name;
  Var(const char* n, const char* value) : name(n) {
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~Var() { ::unsetenv(name); }
};

// Runs `read` and requires Error(invalid_argument) whose message has each of `needles`.
template <typename F>
void refused(F read, std::initializer_list<std::string> needles) {
  try {
    read();
    FAIL("accepted");
  } catch (const ferry::Error& e) {
    CHECK(e.code() == ferry::Errc::invalid_argument);
    for (const auto& n : needles) CHECK_THAT(e.what(), Catch::Contains(n));
  }
}

}  // namespace

TEST_CASE("unset or empty, every kind gives its fallback", "[env]") {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    Var v("FERRY_TEST_ENV", value);
    CHECK(env::integer("FERRY_TEST_ENV", 7, 0, 10) == 7);
    CHECK(env::bytes("FERRY_TEST_ENV", 4096, 1, 1 << 20) == 4096);
    CHECK(env::millis("FERRY_TEST_ENV_MS", 250ms, 0ms, 1s) == 250ms);
    CHECK(env::flag("FERRY_TEST_ENV", true));
    CHECK(env::text("FERRY_TEST_ENV", "x") == "x");
    CHECK(env::choice("FERRY_TEST_ENV", "warn", {"warn", "off"}) == "warn");
    CHECK(env::absolute_path("FERRY_TEST_ENV", "/dev/shm") == "/dev/shm");
  }
}

TEST_CASE("integers: whole numbers with a sign, inside the range", "[env]") {
  const char* n = "FERRY_TEST_ENV";
  {
    Var v(n, "4096");
    CHECK(env::integer(n, 1, 1, 1 << 24) == 4096);
  }
  {
    Var v(n, "-3");
    CHECK(env::integer(n, 0, -5, 5) == -3);
  }
  {
    Var v(n, "+3");
    CHECK(env::integer(n, 0, -5, 5) == 3);
  }
  {
    Var v(n, "16777216");
    CHECK(env::integer(n, 1, 1, 1 << 24) == (1 << 24));  // the bounds themselves are in
  }
  for (const char* bad : {"lots", "2s", "1e3", " 5", "5 ", "0x10", "-", "3.0", "0", "16777217",
                          "99999999999999999999"}) {
    INFO(bad);
    Var v(n, bad);
    refused([&] { env::integer(n, 65536, 1, 1 << 24); },
            {"FERRY_TEST_ENV='" + std::string(bad) + "'", "a whole number from 1 to 16777216",
             "the default (65536)"});
  }
}

TEST_CASE("sizes: bytes, the unit the name ends in, or a unit given", "[env]") {
  {
    Var v("FERRY_TEST_ENV", "4096");
    CHECK(env::bytes("FERRY_TEST_ENV", 0, 0, 1 << 30) == 4096);
  }
  {
    Var v("FERRY_TEST_ENV_MB", "64");  // a bare number is in the name's unit
    CHECK(env::bytes("FERRY_TEST_ENV_MB", 0, 0, 1ull << 40) == (64u << 20));
  }
  {
    Var v("FERRY_TEST_ENV_MB", "1.5");
    CHECK(env::bytes("FERRY_TEST_ENV_MB", 0, 0, 1ull << 40) == (3u << 19));
  }
  {
    Var v("FERRY_TEST_ENV_KB", "2");
    CHECK(env::bytes("FERRY_TEST_ENV_KB", 0, 0, 1ull << 40) == 2048);
  }
  {
    Var v("FERRY_TEST_ENV_GB", "1");
    CHECK(env::bytes("FERRY_TEST_ENV_GB", 0, 0, 1ull << 40) == (1u << 30));
  }
  for (const char* with_unit : {"1.5GiB", "1536M", "1536m", "1572864k"}) {
    INFO(with_unit);
    Var v("FERRY_TEST_ENV_MB", with_unit);  // a unit given wins over the name's
    CHECK(env::bytes("FERRY_TEST_ENV_MB", 0, 0, 1ull << 40) == (3ull << 29));
  }
  for (const char* bad : {"lots", "-1", "64 M", "12QB", "0.5", "2T"}) {
    INFO(bad);
    Var v("FERRY_TEST_ENV_MB", bad);
    refused([&] { env::bytes("FERRY_TEST_ENV_MB", 64u << 20, 1u << 20, 1ull << 40); },
            {"FERRY_TEST_ENV_MB='" + std::string(bad) + "'", "from 1.0 MiB to 1.0 TiB",
             "a number of MiB", "64M, 1.5GiB", "the default (64.0 MiB)"});
  }
}

TEST_CASE("durations: bare milliseconds for a _MS name, else a unit", "[env]") {
  const char* ms = "FERRY_TEST_ENV_MS";
  const auto read = [&] { return env::millis(ms, 2000ms, 0ms, std::chrono::hours(1)); };
  const std::pair<const char*, std::chrono::milliseconds> good[] = {
      {"250", 250ms}, {"0", 0ms},    {"250ms", 250ms}, {"2s", 2000ms}, {"2S", 2000ms},
      {"1.5m", 90s},  {"1h", 3600s}, {"0.5s", 500ms},  {"1.7ms", 1ms}, {"1.5", 1ms}};
  for (const auto& [text, want] : good) {
    INFO(text);
    Var v(ms, text);
    CHECK(read() == want);
  }
  for (const char* bad : {"-5", "-1s", "2x", "s", "2 s", "1.2.3s", "1e3", "2h", "inf"}) {
    INFO(bad);
    Var v(ms, bad);
    refused(read, {"FERRY_TEST_ENV_MS='" + std::string(bad) + "'", "from 0 ms to 1 h",
                   "milliseconds (250)", "250ms, 2s, 1.5m", "the default (2 s)"});
  }
  // A name that does not say milliseconds: a bare number could mean seconds, so it needs a unit.
  Var v("FERRY_TEST_ENV_WAIT", "250");
  refused([] { env::millis("FERRY_TEST_ENV_WAIT", 1s, 0ms, 1s); },
          {"FERRY_TEST_ENV_WAIT='250'", "a number with a unit ms, s, m or h"});
  Var w("FERRY_TEST_ENV_WAIT", "250ms");
  CHECK(env::millis("FERRY_TEST_ENV_WAIT", 1s, 0ms, 1s) == 250ms);
}

TEST_CASE("flags: 1/0, true/false, yes/no, on/off in any case", "[env]") {
  const char* n = "FERRY_TEST_ENV";
  for (const char* yes : {"1", "true", "TRUE", "yes", "Yes", "on", "ON"}) {
    INFO(yes);
    Var v(n, yes);
    CHECK(env::flag(n, false));
  }
  for (const char* no : {"0", "false", "False", "no", "NO", "off", "Off"}) {
    INFO(no);
    Var v(n, no);
    CHECK_FALSE(env::flag(n, true));
  }
  for (const char* bad : {"2", "y", "enable", " 1"}) {
    INFO(bad);
    Var v(n, bad);
    refused([&] { env::flag(n, false); },
            {"FERRY_TEST_ENV='" + std::string(bad) + "'", "1/0, true/false, yes/no or on/off",
             "the default (off)"});
  }
}

TEST_CASE("text as it is, a choice among the accepted, any case, an absolute path", "[env]") {
  const char* n = "FERRY_TEST_ENV";
  {
    Var v(n, " some thing ");
    CHECK(env::text(n, "x") == " some thing ");
  }
  const std::vector<std::string> levels = {"trace", "debug", "warn", "off"};
  {
    Var v(n, "DEBUG");
    CHECK(env::choice(n, "warn", levels) == "debug");  // the accepted spelling comes back
  }
  {
    Var v(n, "verbose");
    refused([&] { env::choice(n, "warn", levels); },
            {"FERRY_TEST_ENV='verbose'", "one of trace, debug, warn, off", "the default (warn)"});
  }
  {
    Var v(n, "/run/ferry shm");
    CHECK(env::absolute_path(n, "/dev/shm") == "/run/ferry shm");
  }
  for (const char* bad : {"shm", "./shm", "~/shm"}) {
    INFO(bad);
    Var v(n, bad);
    refused([&] { env::absolute_path(n, "/dev/shm"); },
            {"FERRY_TEST_ENV='" + std::string(bad) + "'", "an absolute path",
             "the default (/dev/shm)"});
  }
}

// Run only when the test below re-executes this binary: a fresh process whose logger is made
// here, with the parent's FERRY_LOG.
TEST_CASE("exec'd logger: log at two levels", "[.log_peer]") {
  ferry::log().info("an info line");
  ferry::log().warn("a warning line");
}

TEST_CASE("a bad FERRY_LOG is said as a warning and logging goes on at the default level",
          "[env][log]") {
  const std::string out = "/tmp/ferry-env-log-" + std::to_string(::getpid()) + ".txt";
  const pid_t child = ferry::test::fork_child([&] {
    const int fd = ::open(out.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0 || ::dup2(fd, 2) != 2) ::_exit(20);
    ::setenv("FERRY_LOG", "verbose", 1);
    ::execl("/proc/self/exe", "ipc_tests", "[.log_peer]", nullptr);
    ::_exit(127);
  });
  REQUIRE(ferry::test::wait_child(child) == 0);
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ::unlink(out.c_str());
  INFO(text);
  CHECK_THAT(text, Catch::Contains("FERRY_LOG='verbose' is not accepted") &&
                       Catch::Contains("trace, debug, info") &&
                       Catch::Contains("the default (warn)"));
  CHECK_THAT(text, Catch::Contains("a warning line"));
  CHECK_THAT(text, !Catch::Contains("an info line"));
}
