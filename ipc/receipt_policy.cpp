#include "ipc/receipt_policy.hpp"

#include <cstdlib>
#include <string>

#include "ipc/error.hpp"
#include "ipc/units.hpp"
#include "ipc/wire.hpp"

namespace ferry {

Receipt decide_receipt(std::uint32_t flags, std::uint64_t block_length,
                       std::uint64_t copy_below) noexcept {
  if (copy_below == 0) return Receipt::view;
  if ((flags & wire::kFlagCopied) == 0) return Receipt::view;
  if (flags & wire::kFlagToDevice) return Receipt::view;
  return block_length < copy_below ? Receipt::copy_out : Receipt::view;
}

std::uint64_t copy_on_receipt_below_from_env() {
  constexpr const char* kName = "FERRY_COPY_ON_RECEIPT_BELOW";
  const char* v = std::getenv(kName);
  if (v == nullptr || *v == '\0') return kDefaultCopyOnReceiptBelow;
  std::uint64_t bytes = 0;
  try {
    bytes = parse_bytes(v);
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, std::string(kName) + ": " + e.detail() +
                                            "; unset it, or set 0 to turn copying on receipt off");
  }
  if (bytes > kMaxCopyOnReceiptBelow) {
    throw Error(Errc::invalid_argument, std::string(kName) + "=" + v + " is over the limit of " +
                                            format_bytes(kMaxCopyOnReceiptBelow) +
                                            "; copies that large cost more than they save");
  }
  return bytes;
}

}  // namespace ferry
