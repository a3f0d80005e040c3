// The mapping between LibTorch's ScalarType and ferry's stable wire dtype codes.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace ferry {

// The wire code of `t`. Throws Error(invalid_argument) for dtypes that cannot travel as raw
// bytes (quantized types need their quantizer; convert with .dequantize() or send .int_repr()).
std::uint8_t to_wire_dtype(c10::ScalarType t);
// The ScalarType of a validated wire code; Error(bad_record) if this LibTorch lacks it.
c10::ScalarType from_wire_dtype(std::uint8_t code);

}  // namespace ferry
