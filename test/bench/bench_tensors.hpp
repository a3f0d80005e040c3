// The messages of the CPU benchmarks: float32 tensors, read by the consumer one load per page.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstring>

namespace ferry::bench {

inline constexpr std::size_t kPage = 4096;

inline float* floats(const at::Tensor& t) {
  return static_cast<float*>(t.data_ptr());
}

// One load per 4 KiB page: every page of the message is mapped into the consumer and read, which
// a transport that defers work (lazy mapping, copy on read) cannot skip.
inline float touch_pages(const at::Tensor& t) {
  const auto* base = static_cast<const unsigned char*>(t.data_ptr());
  const std::size_t bytes = t.nbytes();
  float sum = 0;
  for (std::size_t off = 0; off < bytes; off += kPage) {
    float v;
    std::memcpy(&v, base + off, sizeof v);
    sum += v;
  }
  return sum;
}

}  // namespace ferry::bench
