#include "ipc/receipt_policy.hpp"

#include "ipc/env.hpp"
#include "ipc/wire.hpp"

namespace ferry {

Receipt decide_receipt(std::uint32_t flags, std::uint64_t block_length, std::uint64_t copy_below,
                       bool sender_exited) noexcept {
  if (flags & wire::kFlagToDevice) return Receipt::view;
  if (sender_exited) return Receipt::copy_out;
  if (copy_below == 0) return Receipt::view;
  if ((flags & wire::kFlagCopied) == 0) return Receipt::view;
  return block_length < copy_below ? Receipt::copy_out : Receipt::view;
}

std::uint64_t copy_on_receipt_below_from_env() {
  return env::bytes("FERRY_COPY_ON_RECEIPT_BELOW", kDefaultCopyOnReceiptBelow, 0,
                    kMaxCopyOnReceiptBelow);
}

}  // namespace ferry
