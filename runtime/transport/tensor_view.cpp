#include "runtime/transport/tensor_view.hpp"

#include <string>

#include "ipc/error.hpp"
#include "runtime/transport/dtype.hpp"

namespace ferry::detail {
namespace {

std::string where(std::size_t index) {
  return "tensor " + std::to_string(index) + " of the message";
}

}  // namespace

void check_sendable(const at::Tensor& t, std::size_t index) {
  if (!t.defined()) throw Error(Errc::invalid_argument, where(index) + " is undefined");
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    throw Error(Errc::invalid_argument, where(index) + " is on " + t.device().str() +
                                            "; ferry carries CPU and CUDA tensors: send t.cpu()");
  }
  if (t.layout() != at::kStrided) {
    throw Error(Errc::invalid_argument,
                where(index) + " is sparse; send t.to_dense() or its indices and values");
  }
  if (t.dim() > wire::kMaxDims) {
    throw Error(Errc::invalid_argument, where(index) + " has " + std::to_string(t.dim()) +
                                            " dimensions, more than ferry's limit of " +
                                            std::to_string(wire::kMaxDims) + "; reshape it");
  }
}

void describe_view(const at::Tensor& t, wire::Record& r) {
  r.dtype = to_wire_dtype(t.scalar_type());
  r.rank = static_cast<std::uint8_t>(t.dim());
  r.block_length = t.storage().nbytes();
  r.storage_offset = t.storage_offset();
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    r.sizes[d] = t.size(d);
    r.strides[d] = t.stride(d);
  }
}

at::Tensor tensor_over(void* base, std::size_t nbytes, void* ctx, c10::DeleterFnPtr deleter,
                       c10::Device device, at::ScalarType dtype, at::IntArrayRef sizes,
                       at::IntArrayRef strides, std::int64_t storage_offset) {
  c10::DataPtr data(base, ctx, deleter, device);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), nullptr, false);
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(device))
      .set_(std::move(storage), storage_offset, sizes, strides);
}

void count_copy(CopyReason reason, std::size_t bytes) {
  auto& c = counters();
  bump(c.tensors_copied);
  bump(c.bytes_copied, bytes);
  bump(c.copies_by_reason[static_cast<int>(reason)]);
}

}  // namespace ferry::detail
