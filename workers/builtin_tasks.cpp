#include "workers/builtin_tasks.hpp"

#include <torch/script.h>

#include <array>
#include <map>
#include <mutex>

#include "workers/task_registry.hpp"

namespace ferry {
namespace {

constexpr std::int64_t kHidden = 256;

// Weights from a formula rather than a seeded generator: generators differ across LibTorch
// versions, and a pool's workers must agree with each other and with reference_mlp().
struct Mlp {
  std::array<at::Tensor, 3> weight, bias;
  explicit Mlp(at::Device device) {
    const std::array<std::int64_t, 4> widths{kMlpFeatures, kHidden, kHidden, kMlpClasses};
    for (std::size_t l = 0; l < 3; ++l) {
      const std::int64_t in = widths[l], out = widths[l + 1];
      const double phase = 0.7 * static_cast<double>(l + 1);
      at::Tensor i = at::arange(out, at::kDouble).unsqueeze(1);
      at::Tensor j = at::arange(in, at::kDouble).unsqueeze(0);
      weight[l] = (at::sin(i * 0.37 + j * 0.11 + phase) / std::sqrt(static_cast<double>(in)))
                      .to(device, at::kFloat);
      bias[l] = (at::cos(at::arange(out, at::kDouble) * 0.23 + phase) * 0.1).to(device, at::kFloat);
    }
  }
  at::Tensor operator()(const at::Tensor& x) const {
    at::Tensor h = at::relu(at::linear(x, weight[0], bias[0]));
    h = at::relu(at::linear(h, weight[1], bias[1]));
    return at::linear(h, weight[2], bias[2]);
  }
};

const Mlp& mlp_on(at::Device device) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Mlp>> models;
  std::lock_guard<std::mutex> lock(mu);
  auto& m = models[device.str()];
  if (!m) m = std::make_unique<Mlp>(device);
  return *m;
}

at::Tensor check_batch(const at::Tensor& x) {
  if (x.dim() != 2 || x.size(1) != kMlpFeatures) {
    throw std::invalid_argument("mlp takes a [batch, " + std::to_string(kMlpFeatures) +
                                "] tensor, got sizes " + c10::str(x.sizes()));
  }
  return x;
}

Tensors mlp_task(TaskContext& ctx, Tensors in) {
  if (in.size() != 1) {
    throw std::invalid_argument("mlp takes one tensor, got " + std::to_string(in.size()));
  }
  at::NoGradGuard no_grad;
  return {mlp_on(ctx.device)(check_batch(in[0]).to(ctx.device, at::kFloat))};
}

Tensors square_task(TaskContext& ctx, Tensors in) {
  Tensors out;
  for (const auto& t : in) {
    at::Tensor d = t.to(ctx.device);
    out.push_back(d * d);
  }
  return out;
}

Tensors torchscript_task(TaskContext& ctx, Tensors in) {
  const std::string path = ctx.config_value("model");
  if (path.empty()) {
    throw std::invalid_argument(
        "the torchscript task needs a model file: ferry run --model FILE.pt, or "
        "PoolOptions::config[\"model\"]");
  }
  // Loaded once per worker: a worker has one device, and a module is reused for every batch.
  static std::mutex mu;
  static std::map<std::string, torch::jit::Module> modules;
  torch::jit::Module* module;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = modules.find(path);
    if (it == modules.end()) {
      torch::jit::Module m = torch::jit::load(path, ctx.device);
      m.eval();
      it = modules.emplace(path, std::move(m)).first;
      ctx.log().debug("worker {} loaded TorchScript model {}", ctx.worker_id, path);
    }
    module = &it->second;
  }
  std::vector<torch::jit::IValue> args;
  for (const auto& t : in) args.emplace_back(t.to(ctx.device));
  at::NoGradGuard no_grad;
  const torch::jit::IValue result = module->forward(args);
  Tensors out;
  auto take = [&](const torch::jit::IValue& v) {
    if (!v.isTensor()) {
      throw std::invalid_argument("the model's forward returned a " + v.tagKind() +
                                  "; the torchscript task returns tensors only");
    }
    out.push_back(v.toTensor());
  };
  if (result.isTuple()) {
    for (const auto& v : result.toTuple()->elements()) take(v);
  } else if (result.isList()) {
    for (const auto& v : result.toListRef()) take(v);
  } else {
    take(result);
  }
  return out;
}

FERRY_TASK("echo", [](TaskContext&, Tensors in) { return in; });
FERRY_TASK("square", square_task);
FERRY_TASK("mlp", mlp_task);
FERRY_TASK("torchscript", torchscript_task);

}  // namespace

at::Tensor reference_mlp(const at::Tensor& batch) {
  at::NoGradGuard no_grad;
  return mlp_on(at::kCPU)(check_batch(batch).to(at::kFloat));
}

}  // namespace ferry
