// Hogwild training on real data from C++: N pool workers step one shared MLP and its shared
// momentum, fed minibatches by this process through the pool's shared-memory queues.
//
// The 8x8 handwritten digits that python3-sklearn ships (the same CSV as hogwild.py reads).
// Test accuracy is printed while the workers train; the last line is
//   accuracy=0.981 time_to_95=0.25s samples_per_s=35000
//
//   ferry-example-hogwild --workers 2 --batch 8 --epochs 5
//
// A worker that dies is restarted on the same parameters; only its step in flight is lost.
#include <zlib.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/pool.hpp"
#include "runtime/shared_module.hpp"
#include "runtime/shared_tensor.hpp"
#include "workers/task_registry.hpp"

namespace {

constexpr const char* kDigits =
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr std::int64_t kTestImages = 360;  // the last 20% of a fixed shuffle

struct Digits {
  at::Tensor train_x, train_y, test_x, test_y;
};

// Reads the CSV (gzip or plain: zlib reads both): 64 pixels 0-16 and the label per line.
Digits load_digits(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw std::runtime_error(path +
                             " cannot be read; install python3-sklearn (it ships the "
                             "digits CSV) or give --data");
  }
  std::vector<float> pixels;
  std::vector<std::int64_t> labels;
  char line[1024];
  while (gzgets(f, line, sizeof line) != nullptr) {
    std::stringstream ss(line);
    std::string cell;
    std::vector<float> row;
    while (std::getline(ss, cell, ',')) row.push_back(std::stof(cell));
    if (row.empty()) continue;
    if (row.size() != 65) {
      gzclose(f);
      throw std::runtime_error(path + ": a line with " + std::to_string(row.size()) +
                               " values, not 65 (64 pixels and a label)");
    }
    for (int i = 0; i < 64; ++i) pixels.push_back(row[i] / 16.0f);
    labels.push_back(static_cast<std::int64_t>(row[64]));
  }
  gzclose(f);
  const auto n = static_cast<std::int64_t>(labels.size());
  at::Tensor x = at::from_blob(pixels.data(), {n, 64}, at::kFloat).clone();
  at::Tensor y = at::from_blob(labels.data(), {n}, at::kLong).clone();
  at::Tensor order = at::randperm(n, at::detail::getDefaultCPUGenerator());
  x = x.index_select(0, order);
  y = y.index_select(0, order);
  return {x.slice(0, 0, n - kTestImages), y.slice(0, 0, n - kTestImages),
          x.slice(0, n - kTestImages), y.slice(0, n - kTestImages)};
}

// Seeds the CPU generator alone: torch::manual_seed seeds every GPU too, which initialises CUDA
// in a CUDA build of LibTorch, after which this program could not fork its workers.
void seed_cpu(std::uint64_t seed) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(cpu.mutex());
  cpu.set_current_seed(seed);
}

// The model and its optimizer, built the same way in this process and in every worker.
struct Trainer {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::SGD> opt;
  explicit Trainer(double lr) {
    seed_cpu(0);
    model = torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::ReLU(),
                                  torch::nn::Linear(128, 10));
    opt = std::make_unique<torch::optim::SGD>(model->parameters(),
                                              torch::optim::SGDOptions(lr).momentum(0.9));
  }
};

// The workers' task: one step on the minibatch (x, y), on the pool's shared model and momentum
// (adopted at the worker's first task). Returns nothing: the result is in the shared weights.
ferry::Tensors hogwild_step(ferry::TaskContext& ctx, ferry::Tensors in) {
  static std::unique_ptr<Trainer> t;  // one per worker process
  if (!t) {
    t = std::make_unique<Trainer>(std::stod(ctx.config_value("lr")));
    ferry::adopt_shared(*t->model, *ctx.shared, "model.");
    ferry::adopt_shared(*t->opt, *ctx.shared);
  }
  t->opt->zero_grad();
  at::cross_entropy_loss(t->model->forward(in.at(0)), in.at(1)).backward();
  t->opt->step();
  return {};
}
FERRY_TASK("hogwild_step", hogwild_step);

double accuracy(torch::nn::Sequential& model, const Digits& d) {
  at::NoGradGuard no_grad;
  return model->forward(d.test_x).argmax(1).eq(d.test_y).to(at::kFloat).mean().item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Hogwild training of an MLP on the 8x8 digits by ferry::Pool workers"};
  int workers = 2, batch = 8, epochs = 5;
  double lr = 0, target = 0.95, print_every = 0.25;
  std::string data = kDigits;
  bool quiet = false;
  app.add_option("--workers", workers)->check(CLI::Range(1, 256));
  app.add_option("--batch", batch)->check(CLI::Range(1, 1 << 20));
  app.add_option("--epochs", epochs)->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", lr, "default: 0.05 * sqrt(batch / 8)");
  app.add_option("--target", target, "test accuracy to time");
  app.add_option("--data", data, "the digits CSV (gzip or plain)");
  app.add_option("--print-every", print_every, "seconds");
  app.add_flag("--quiet", quiet, "only the last line");
  CLI11_PARSE(app, argc, argv);
  if (lr <= 0) lr = 0.05 * std::sqrt(batch / 8.0);
  at::set_num_threads(1);

  try {
    seed_cpu(0);
    const Digits d = load_digits(data);
    Trainer mine(lr);  // this process's view of the shared model, for the accuracy
    ferry::PoolOptions o;
    o.workers = workers;
    o.threads_per_worker = 1;
    o.config = {{"lr", std::to_string(lr)}};
    o.shared = ferry::share_module(*mine.model, "model.");
    o.shared.merge(ferry::share_optimizer(*mine.opt));
    o.require_tasks = {"hogwild_step"};
    ferry::Pool pool(o);

    // Minibatches, made on demand in shared memory (they travel zero-copy), epoch after epoch.
    const std::int64_t n = d.train_x.size(0);
    const std::size_t per_epoch = static_cast<std::size_t>(n / batch);
    at::Tensor order;
    auto make = [&](std::size_t i) {
      if (i % per_epoch == 0) order = at::randperm(n, at::kLong);
      at::Tensor idx = order.slice(0, static_cast<std::int64_t>(i % per_epoch) * batch,
                                   static_cast<std::int64_t>(i % per_epoch + 1) * batch);
      at::Tensor x = ferry::empty_shared({batch, 64}, at::kFloat);
      at::Tensor y = ferry::empty_shared({batch}, at::kLong);
      at::index_select_out(x, d.train_x, 0, idx);
      at::index_select_out(y, d.train_y, 0, idx);
      return ferry::Tensors{x, y};
    };
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    std::optional<double> hit;
    double last_print = 0, last_check = -1;
    std::size_t done = 0;
    auto results = pool.imap_unordered("hogwild_step", per_epoch * epochs, make);
    while (auto r = results.next()) {
      r->get();  // a task that failed (twice restarted) ends the run with its error
      ++done;
      const double now = seconds();
      if (now - last_check < 0.005) continue;  // an accuracy check costs a forward pass
      last_check = now;
      const double acc = accuracy(mine.model, d);
      if (!hit && acc >= target) hit = now;
      if (!quiet && now - last_print >= print_every) {
        std::printf("t=%.2fs samples=%zu accuracy=%.3f\n", now, done * batch, acc);
        last_print = now;
      }
    }
    const double elapsed = seconds();
    const double acc = accuracy(mine.model, d);
    if (!hit && acc >= target) hit = elapsed;
    char when[32] = "none";
    if (hit) std::snprintf(when, sizeof when, "%.2fs", *hit);
    std::printf("accuracy=%.3f time_to_%d=%s samples_per_s=%.0f\n", acc,
                static_cast<int>(std::lround(target * 100)), when, done * batch / elapsed);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hogwild: %s\n", e.what());
    return 1;
  }
}
