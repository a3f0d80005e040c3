#include "runtime/transport/dtype.hpp"

#include <torch/version.h>

#include <string>

#include "ipc/error.hpp"
#include "ipc/wire.hpp"

namespace ferry {
namespace {

using c10::ScalarType;
using wire::DType;

struct Pair {
  ScalarType torch;
  DType wire;
};

// Types newer than LibTorch 1.13 are listed only where the LibTorch being built has them.
constexpr Pair kPairs[] = {
    {ScalarType::Byte, DType::uint8},
    {ScalarType::Char, DType::int8},
    {ScalarType::Short, DType::int16},
    {ScalarType::Int, DType::int32},
    {ScalarType::Long, DType::int64},
    {ScalarType::Half, DType::float16},
    {ScalarType::Float, DType::float32},
    {ScalarType::Double, DType::float64},
    {ScalarType::ComplexHalf, DType::complex32},
    {ScalarType::ComplexFloat, DType::complex64},
    {ScalarType::ComplexDouble, DType::complex128},
    {ScalarType::Bool, DType::bool_},
    {ScalarType::BFloat16, DType::bfloat16},
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    {ScalarType::Float8_e5m2, DType::float8_e5m2},
    {ScalarType::Float8_e4m3fn, DType::float8_e4m3fn},
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
    {ScalarType::Float8_e5m2fnuz, DType::float8_e5m2fnuz},
    {ScalarType::Float8_e4m3fnuz, DType::float8_e4m3fnuz},
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    {ScalarType::UInt16, DType::uint16},
    {ScalarType::UInt32, DType::uint32},
    {ScalarType::UInt64, DType::uint64},
#endif
};

}  // namespace

std::uint8_t to_wire_dtype(ScalarType t) {
  for (const Pair& p : kPairs) {
    if (p.torch == t) return static_cast<std::uint8_t>(p.wire);
  }
  std::string name = c10::toString(t);
  if (c10::isQIntType(t)) {
    throw Error(Errc::invalid_argument,
                "dtype " + name +
                    " is quantized and cannot travel as raw bytes: send t.dequantize(), or "
                    "t.int_repr() with t.q_scale() and t.q_zero_point()");
  }
  throw Error(Errc::invalid_argument, "dtype " + name + " is not supported by ferry's wire format");
}

ScalarType from_wire_dtype(std::uint8_t code) {
  for (const Pair& p : kPairs) {
    if (static_cast<std::uint8_t>(p.wire) == code) return p.torch;
  }
  throw Error(Errc::bad_record, std::string("dtype ") + wire::dtype_name(code) +
                                    " is not available in this build's LibTorch; the sender's "
                                    "LibTorch is newer: upgrade this side");
}

}  // namespace ferry
