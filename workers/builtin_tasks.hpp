// The tasks every ferry worker has:
//   echo         returns its inputs unchanged (a transport round trip);
//   square       each input times itself, on the worker's device;
//   mlp          a small fixed multilayer perceptron (kMlpFeatures -> 256 -> 256 -> kMlpClasses,
//                ReLU) whose weights are a fixed formula, so every worker and every LibTorch
//                version computes the same function; input [batch, kMlpFeatures];
//   torchscript  loads the TorchScript file named by config "model" once per worker onto its
//                device and returns forward(inputs...) without autograd; a tensor, or a
//                tuple/list of tensors, comes back as the result.
#pragma once

#include <ATen/ATen.h>

namespace ferry {

inline constexpr std::int64_t kMlpFeatures = 64;
inline constexpr std::int64_t kMlpClasses = 10;

// The mlp task's function, here in this process, for checking a pool's answers.
at::Tensor reference_mlp(const at::Tensor& batch);

}  // namespace ferry
