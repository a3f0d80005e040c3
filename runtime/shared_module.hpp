// A module's parameters and an optimizer's state in shared memory, for Hogwild-style training:
// several processes step the same weights, each with its own gradients, without locks.
//
//   auto net = std::make_shared<Net>();
//   torch::optim::Adam opt(net->parameters(), 1e-3);
//   ferry::PoolOptions o;
//   o.shared = ferry::share_module(*net);              // "fc1.weight", "fc1.bias", ...
//   o.shared.merge(ferry::share_optimizer(opt));       // "optimizer.0.exp_avg", ...
//   ferry::Pool pool(o);  // every worker, and every restarted one, gets the same memory
//
// and in a task, on a module and optimizer built the same way:
//   ferry::adopt_shared(*net, *ctx.shared);
//   ferry::adopt_shared(opt, *ctx.shared);
//
// CPU tensors move into this process's arena in place (ferry::share_), so the module, its views
// and an optimizer that already holds its parameters keep working; CUDA tensors stay where they
// are and travel by IPC handle, opened once per peer. Gradients are never shared.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "runtime/tensor_queue.hpp"  // NamedTensors

namespace ferry {

// Moves every parameter and buffer of `module` and its submodules into shared memory in place
// and returns them by their dotted names ("fc1.weight"), each behind `prefix`.
// Throws Error: invalid_argument (a sparse or non-CPU, non-CUDA tensor), shm_exhausted.
NamedTensors share_module(torch::nn::Module& module, const std::string& prefix = "");

// Makes the per-parameter state of `optimizer` where it does not exist yet, as its first step()
// would, and moves every state tensor into shared memory in place. Returns them named
// "<prefix><i>.<field>", i counting parameters across groups ("optimizer.3.exp_avg").
// Known: SGD (momentum_buffer, made at zero where the first step() would copy the gradient:
// the same when dampening is 0), Adam and AdamW (exp_avg, exp_avg_sq, max_exp_avg_sq with
// amsgrad), RMSprop (square_avg, momentum_buffer, grad_avg), Adagrad (sum). LibTorch keeps the
// step count as an integer, so each process counts its own steps for bias correction.
// Throws Error(invalid_argument) for another optimizer class.
NamedTensors share_optimizer(torch::optim::Optimizer& optimizer,
                             const std::string& prefix = "optimizer.");

// The receiving side: makes every parameter and buffer of `module` (built like the sharer's) use
// the tensor named "<prefix><its name>" in `shared`. Throws Error(invalid_argument) naming a
// missing name or a mismatched shape, dtype or device.
void adopt_shared(torch::nn::Module& module, const NamedTensors& shared,
                  const std::string& prefix = "");

// The same for an optimizer over such a module's parameters: its state becomes the shared
// tensors named as share_optimizer() named them.
void adopt_shared(torch::optim::Optimizer& optimizer, const NamedTensors& shared,
                  const std::string& prefix = "optimizer.");

}  // namespace ferry
