// The receiver's choice between a view of the sender's block and a copy of its own, one case per
// rule, and the setting that moves the line between them.
#include "../catch.hpp"

#include <cstdlib>
#include <optional>
#include <string>

#include "ipc/error.hpp"
#include "ipc/receipt_policy.hpp"
#include "ipc/wire.hpp"

using ferry::decide_receipt;
using ferry::Receipt;
using ferry::wire::kFlagCopied;
using ferry::wire::kFlagToDevice;

namespace {

constexpr std::uint64_t kBelow = 64 * 1024;

// Sets FERRY_COPY_ON_RECEIPT_BELOW for one scope and puts back what was there.
class ScopedSetting {
 public:
  explicit ScopedSetting(const char* value) {
    if (const char* v = std::getenv(kName)) old_ = v;
    if (value) {
      ::setenv(kName, value, 1);
    } else {
      ::unsetenv(kName);
    }
  }
  ~ScopedSetting() {
    if (old_) {
      ::setenv(kName, old_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }

 private:
  static constexpr const char* kName = "FERRY_COPY_ON_RECEIPT_BELOW";
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("receipt: a small copied block is copied out", "[receipt]") {
  CHECK(decide_receipt(kFlagCopied, 400, kBelow) == Receipt::copy_out);
  CHECK(decide_receipt(kFlagCopied, 0, kBelow) == Receipt::copy_out);  // an empty tensor
  CHECK(decide_receipt(kFlagCopied, kBelow - 1, kBelow) == Receipt::copy_out);
}

TEST_CASE("receipt: a copied block at or over the threshold stays a view", "[receipt]") {
  CHECK(decide_receipt(kFlagCopied, kBelow, kBelow) == Receipt::view);
  CHECK(decide_receipt(kFlagCopied, std::uint64_t{1} << 30, kBelow) == Receipt::view);
}

TEST_CASE("receipt: a tensor the sender shares deliberately stays a view, however small",
          "[receipt]") {
  CHECK(decide_receipt(0, 4, kBelow) == Receipt::view);
  CHECK(decide_receipt(0, 0, kBelow) == Receipt::view);
}

TEST_CASE("receipt: a CUDA tensor staged through shared memory stays a view", "[receipt]") {
  CHECK(decide_receipt(kFlagCopied | kFlagToDevice, 400, kBelow) == Receipt::view);
}

TEST_CASE("receipt: a block of a sender that has exited is copied out, whatever it is",
          "[receipt]") {
  CHECK(decide_receipt(kFlagCopied, std::uint64_t{1} << 30, kBelow, true) == Receipt::copy_out);
  // Shared deliberately, but its owner is gone: it would be moved here at the next check.
  CHECK(decide_receipt(0, 4, kBelow, true) == Receipt::copy_out);
  CHECK(decide_receipt(kFlagCopied, 400, 0, true) == Receipt::copy_out);  // copying turned off
  // Staged for a CUDA device: moved there at once, nothing of the block is kept.
  CHECK(decide_receipt(kFlagCopied | kFlagToDevice, 400, kBelow, true) == Receipt::view);
}

TEST_CASE("receipt: a threshold of 0 turns copying on receipt off", "[receipt]") {
  CHECK(decide_receipt(kFlagCopied, 0, 0) == Receipt::view);
  CHECK(decide_receipt(kFlagCopied, 400, 0) == Receipt::view);
}

TEST_CASE("receipt: FERRY_COPY_ON_RECEIPT_BELOW sets the threshold, and a bad value names it",
          "[receipt]") {
  {
    ScopedSetting unset(nullptr);
    CHECK(ferry::copy_on_receipt_below_from_env() == ferry::kDefaultCopyOnReceiptBelow);
  }
  {
    ScopedSetting off("0");
    CHECK(ferry::copy_on_receipt_below_from_env() == 0);
  }
  {
    ScopedSetting bytes("4096");
    CHECK(ferry::copy_on_receipt_below_from_env() == 4096);
  }
  {
    ScopedSetting unit("1M");
    CHECK(ferry::copy_on_receipt_below_from_env() == 1024 * 1024);
  }
  for (const char* bad : {"lots", "-1", "2T"}) {
    ScopedSetting setting(bad);
    try {
      ferry::copy_on_receipt_below_from_env();
      FAIL("no error for " << bad);
    } catch (const ferry::Error& e) {
      CHECK(e.code() == ferry::Errc::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("FERRY_COPY_ON_RECEIPT_BELOW"));
    }
  }
}
