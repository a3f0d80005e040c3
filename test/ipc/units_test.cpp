#include "ipc/units.hpp"

#include "../catch.hpp"

#include <string>

#include "ipc/error.hpp"

TEST_CASE("sizes parse in the forms people type, binary whatever the spelling", "[units]") {
  CHECK(ferry::parse_bytes("4096") == 4096);
  CHECK(ferry::parse_bytes("64M") == (64u << 20));
  CHECK(ferry::parse_bytes("64m") == (64u << 20));
  CHECK(ferry::parse_bytes("64MB") == (64u << 20));
  CHECK(ferry::parse_bytes("2g") == (std::uint64_t{2} << 30));
  CHECK(ferry::parse_bytes("1.5GiB") == (std::uint64_t{3} << 29));
  CHECK(ferry::parse_bytes("512k") == (512u << 10));
  CHECK(ferry::parse_bytes("1T") == (std::uint64_t{1} << 40));
  CHECK(ferry::parse_bytes("10b") == 10);
  CHECK(ferry::parse_bytes("0") == 0);
}

TEST_CASE("a bad size names the value and the accepted forms", "[units]") {
  for (const char* bad :
       {"12QB", "", "M", "-1G", "1.2.3M", "1e9", " 64M", "64 M", "inf", "99999999999P"}) {
    INFO(bad);
    try {
      ferry::parse_bytes(bad);
      FAIL("accepted");
    } catch (const ferry::Error& e) {
      CHECK(e.code() == ferry::Errc::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("'" + std::string(bad) + "'"));
      CHECK_THAT(e.what(), Catch::Contains("64M, 1.5GiB, 2g"));
    }
  }
}

TEST_CASE("durations parse as s, m, h, d or plain seconds, bad ones say what is accepted",
          "[units]") {
  using std::chrono::seconds;
  CHECK(ferry::parse_duration("30s") == seconds(30));
  CHECK(ferry::parse_duration("10m") == seconds(600));
  CHECK(ferry::parse_duration("2h") == seconds(7200));
  CHECK(ferry::parse_duration("1d") == seconds(86400));
  CHECK(ferry::parse_duration("1.5h") == seconds(5400));
  CHECK(ferry::parse_duration("45") == seconds(45));
  for (const char* bad : {"-3x", "-1h", "3x", "h", "", "1w", "2hours"}) {
    INFO(bad);
    try {
      ferry::parse_duration(bad);
      FAIL("accepted");
    } catch (const ferry::Error& e) {
      CHECK(e.code() == ferry::Errc::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("'" + std::string(bad) + "'"));
      CHECK_THAT(e.what(), Catch::Contains("30s, 10m, 2h, 1d"));
    }
  }
}
