#include "runtime/transport/in_record/in_record.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include <c10/core/CPUAllocator.h>

#include "runtime/transport/dtype.hpp"
#include "runtime/transport/tensor_view.hpp"

namespace ferry::detail {
namespace {

// A CPU tensor whose memory comes from malloc, not from c10's CPU allocator. That one asks
// posix_memalign for 64-byte alignment, which glibc serves past its per-thread cache by carving
// and freeing chunks, and a pool received two of these per task (each task's envelope and its
// result's): with the matching sends, a fifth of an empty task's CPU went to the allocator
// (docs/benchmarks.md, issue 54). malloc aligns to 16 bytes, all any dtype needs. The storage
// stays resizable, growing through the CPU allocator, as at::empty's does.
at::Tensor malloc_tensor(at::IntArrayRef sizes, caffe2::TypeMeta dtype, std::size_t nbytes) {
  void* mem = std::malloc(std::max<std::size_t>(nbytes, 1));
  if (mem == nullptr) throw std::bad_alloc();
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(mem, mem, &std::free, c10::Device(c10::kCPU)),
                       c10::GetCPUAllocator(), /*resizable=*/true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

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
    const caffe2::TypeMeta dtype = c10::scalarTypeToTypeMeta(from_wire_dtype(r.dtype));
    const at::IntArrayRef sizes(r.sizes, r.rank);
    // validate() checked that the view is contiguous and its bytes are block_length.
    const std::size_t bytes =
        static_cast<std::size_t>(c10::multiply_integers(sizes)) * dtype.itemsize();
    if (bytes > r.block_length) {
      throw Error(Errc::bad_record, "an inline record of " + std::to_string(r.block_length) +
                                        " bytes describes " + std::to_string(bytes));
    }
    at::Tensor t = malloc_tensor(sizes, dtype, bytes);
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
