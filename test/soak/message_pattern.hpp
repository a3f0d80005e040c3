// The messages of the queue soak: each one says what it should hold, so a receiver can prove
// that every message it got is whole, in order, and unchanged, even after its sender died.
//
// A message is a header, int64 [2 + 2k] = {seq, k, numel_0, dtype_0, ..., numel_k-1, dtype_k-1},
// followed by k tensors whose element e of tensor j is (seq * 7919 + j * 104729 + e) mod 251:
// exact in every dtype used, and different from one message and one tensor to the next.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "runtime/shared_tensor.hpp"

namespace ferry::soak {

inline constexpr std::array<at::ScalarType, 5> kDtypes = {at::kByte, at::kInt, at::kLong,
                                                          at::kFloat, at::kDouble};

// The values tensor j of message `seq` must hold.
inline at::Tensor expected_values(std::int64_t seq, std::int64_t j, std::int64_t numel,
                                  at::ScalarType dtype) {
  return at::arange(numel, at::kLong).add_(seq * 7919 + j * 104729).remainder_(251).to(dtype);
}

struct MessageShape {
  int tensors_max = 3;               // k is drawn from [1, tensors_max]
  std::int64_t bytes_max = 1 << 18;  // each tensor's size is drawn log-uniformly up to this
};

// Message `seq`: each tensor drawn in shared memory (zero-copy) or ordinary memory (copied on
// send) at random.
inline std::vector<at::Tensor> make_message(std::int64_t seq, std::mt19937_64& rng,
                                            const MessageShape& shape) {
  const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % shape.tensors_max);
  std::vector<at::Tensor> out(1);
  std::vector<std::int64_t> head = {seq, k};
  for (std::int64_t j = 0; j < k; ++j) {
    const at::ScalarType dtype = kDtypes[rng() % kDtypes.size()];
    const std::int64_t item = static_cast<std::int64_t>(c10::elementSize(dtype));
    // Log-uniform, so small and large tensors are both common; empty ones too.
    std::uniform_real_distribution<double> log_bytes(0.0, std::log2(double(shape.bytes_max)));
    const std::int64_t numel = (std::int64_t(std::exp2(log_bytes(rng))) - 1) / item;
    at::Tensor values = expected_values(seq, j, numel, dtype);
    if (rng() % 2 == 0) values = ferry::to_shared(values);
    head.push_back(numel);
    head.push_back(static_cast<std::int64_t>(dtype));
    out.push_back(values);
  }
  out[0] = at::tensor(head, at::kLong);
  return out;
}

// Empty when `m` is message `seq` whole and unchanged, else what is wrong.
inline std::string check_message(const std::vector<at::Tensor>& m, std::int64_t seq) {
  if (m.empty()) return "an empty message";
  const at::Tensor& h = m[0];
  if (h.scalar_type() != at::kLong || h.dim() != 1 || h.numel() < 2) return "a bad header";
  const auto* head = h.data_ptr<std::int64_t>();
  if (head[0] != seq) {
    return "message " + std::to_string(head[0]) + " where " + std::to_string(seq) +
           " was due (lost, duplicated or reordered)";
  }
  const std::int64_t k = head[1];
  if (h.numel() != 2 + 2 * k || static_cast<std::int64_t>(m.size()) != 1 + k) {
    return "message " + std::to_string(seq) + " has " + std::to_string(m.size() - 1) +
           " tensors, its header says " + std::to_string(k);
  }
  for (std::int64_t j = 0; j < k; ++j) {
    const at::Tensor& t = m[static_cast<std::size_t>(1 + j)];
    const auto dtype = static_cast<at::ScalarType>(head[3 + 2 * j]);
    if (t.numel() != head[2 + 2 * j] || t.scalar_type() != dtype ||
        !at::equal(t, expected_values(seq, j, t.numel(), dtype))) {
      return "message " + std::to_string(seq) + " tensor " + std::to_string(j) +
             " does not hold what was sent";
    }
  }
  return {};
}

}  // namespace ferry::soak
