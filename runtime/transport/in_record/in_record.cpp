#include "runtime/transport/in_record/in_record.hpp"

#include <cstring>

#include "runtime/transport/dtype.hpp"
#include "runtime/transport/tensor_view.hpp"

namespace ferry::detail {
namespace {

class InRecord final : public Transport {
 public:
  Outgoing encode(const at::Tensor& t, std::size_t index, const SendContext&) const override {
    check_sendable(t, index);
    const std::size_t bytes = t.nbytes();
    if (!t.is_contiguous() || t.is_conj() || t.is_neg() || bytes > wire::kInlineBytes) {
      throw Error(
          Errc::invalid_argument,
          "tensor " + std::to_string(index) + " (" + std::to_string(bytes) +
              " bytes) does not fit a record: only a contiguous, resolved tensor of at most " +
              std::to_string(wire::kInlineBytes) + " bytes travels in one");
    }
    Outgoing out;
    out.record = wire::make_record();
    out.self_contained = true;
    wire::Record& r = out.record;
    describe_view(t, r);
    r.storage_offset = 0;  // only the view's own bytes are carried, from the first element
    r.block_length = bytes;
    r.device_type = static_cast<std::uint8_t>(wire::DeviceType::cpu);
    r.device_index = -1;
    r.flags = wire::kFlagInline | wire::kFlagCopied;
    if (bytes > 0) std::memcpy(wire::inline_bytes(r), t.data_ptr(), bytes);
    return out;
  }

  void claim(Claim&, pid_t, const CustodyLookup&) const override {}  // nothing held elsewhere

  at::Tensor decode(Claim& c, pid_t) const override {
    const wire::Record& r = c.record;
    at::Tensor t = at::empty(at::IntArrayRef(r.sizes, r.rank),
                             at::TensorOptions().dtype(from_wire_dtype(r.dtype)));
    // validate() checked that the view is contiguous and its bytes are block_length: at::empty's.
    const std::size_t bytes = t.nbytes();
    if (bytes > r.block_length) {
      throw Error(Errc::bad_record, "an inline record of " + std::to_string(r.block_length) +
                                        " bytes describes " + std::to_string(bytes));
    }
    if (bytes > 0) std::memcpy(t.data_ptr(), wire::inline_bytes(r), bytes);
    return t;
  }

  std::size_t in_flight() const override { return 0; }  // a record holds nothing once pushed
  void peer_exited(pid_t) const override {}
};

}  // namespace

const Transport& in_record_transport() {
  // Never destroyed, as the other transports: flush_at_exit() may ask it from an atexit handler.
  static const auto* t = new InRecord;
  return *t;
}

}  // namespace ferry::detail
