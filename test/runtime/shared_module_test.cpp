// share_module / share_optimizer / adopt_shared: a module's and an optimizer's state moved into
// shared memory in place, seen by a forked child, and adopted by a module built elsewhere.
#include "runtime/shared_module.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include "../catch.hpp"

#include "../test_util.hpp"
#include "ipc/error.hpp"
#include "runtime/shared_tensor.hpp"

using ferry::Errc;
using ferry::Error;

namespace {

torch::nn::Sequential small_net() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8),
                               torch::nn::Linear(8, 2));
}

// One optimizer step on random data.
void train_step(torch::nn::Sequential& net, torch::optim::Optimizer& opt) {
  opt.zero_grad();
  net->forward(at::randn({16, 4})).pow(2).mean().backward();
  opt.step();
}

}  // namespace

TEST_CASE("share_module moves parameters and buffers in place, the optimizer keeps working",
          "[shared_module]") {
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), 0.1);
  const at::Tensor w0 = net->parameters()[0];
  const void* impl = w0.unsafeGetTensorImpl();
  const at::Tensor before = w0.detach().clone();

  const ferry::NamedTensors shared = ferry::share_module(*net, "net.");
  // Every parameter and buffer, by its dotted name (BatchNorm's running stats included).
  CHECK(shared.size() == net->parameters().size() + net->buffers().size());
  CHECK(shared.count("net.0.weight") == 1);
  CHECK(shared.count("net.1.running_mean") == 1);
  for (const auto& [name, t] : shared) {
    INFO(name);
    CHECK(ferry::is_shared(t));
    CHECK_FALSE(t.requires_grad());  // the data; gradients stay each process's own
  }
  for (const auto& p : net->parameters()) CHECK(ferry::is_shared(p));
  CHECK(net->parameters()[0].unsafeGetTensorImpl() == impl);  // the same tensor object
  CHECK(net->parameters()[0].equal(before));
  CHECK(net->parameters()[0].requires_grad());

  train_step(net, opt);  // the optimizer writes the shared memory in place
  CHECK_FALSE(net->parameters()[0].equal(before));
  CHECK(shared.at("net.0.weight").equal(net->parameters()[0]));
  CHECK(ferry::is_shared(net->parameters()[0]));
  CHECK_FALSE(ferry::is_shared(net->parameters()[0].grad()));

  // Sharing again changes nothing.
  const void* data = net->parameters()[0].data_ptr();
  ferry::share_module(*net);
  CHECK(net->parameters()[0].data_ptr() == data);
}

TEST_CASE("a shared module written by a forked child is seen by its parent", "[shared_module]") {
  auto net = small_net();
  ferry::share_module(*net);
  torch::optim::SGD opt(net->parameters(), 0.5);
  const at::Tensor before = net->parameters()[0].detach().clone();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    train_step(net, opt);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK_FALSE(net->parameters()[0].equal(before));
}

TEST_CASE("share_optimizer makes each known optimizer's state in shared memory",
          "[shared_module]") {
  auto net = small_net();
  ferry::share_module(*net);
  const std::size_t n = net->parameters().size();

  SECTION("Adam: exp_avg and exp_avg_sq, written in place by step()") {
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    const auto s = ferry::share_optimizer(opt);
    CHECK(s.size() == 2 * n);
    const at::Tensor m = s.at("optimizer.0.exp_avg");
    CHECK(ferry::is_shared(m));
    CHECK(m.sizes() == net->parameters()[0].sizes());
    CHECK(m.abs().sum().item<float>() == 0);
    train_step(net, opt);
    CHECK(m.abs().sum().item<float>() > 0);  // the optimizer used the shared tensor
    CHECK(ferry::share_optimizer(opt).at("optimizer.0.exp_avg").data_ptr() == m.data_ptr());
  }
  SECTION("Adam with amsgrad and AdamW") {
    torch::optim::Adam ams(net->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
    CHECK(ferry::share_optimizer(ams).size() == 3 * n);
    torch::optim::AdamW adamw(net->parameters());
    CHECK(ferry::share_optimizer(adamw, "w.").count("w.3.exp_avg_sq") == 1);
  }
  SECTION("SGD: momentum buffers only when there is momentum") {
    torch::optim::SGD plain(net->parameters(), 0.1);
    CHECK(ferry::share_optimizer(plain).empty());
    torch::optim::SGD momentum(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto s = ferry::share_optimizer(momentum);
    CHECK(s.size() == n);
    train_step(net, momentum);
    CHECK(s.at("optimizer.1.momentum_buffer").abs().sum().item<float>() > 0);
  }
  SECTION("RMSprop and Adagrad") {
    torch::optim::RMSprop rms(net->parameters(),
                              torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
    CHECK(ferry::share_optimizer(rms).size() == 3 * n);
    torch::optim::Adagrad ada(net->parameters(),
                              torch::optim::AdagradOptions(0.1).initial_accumulator_value(0.25));
    const auto s = ferry::share_optimizer(ada);
    CHECK(s.size() == n);
    CHECK(s.at("optimizer.0.sum").min().item<float>() == 0.25f);  // its own initial value
    CHECK(ferry::is_shared(s.at("optimizer.0.sum")));
  }
  SECTION("another optimizer is refused with the way out") {
    torch::optim::LBFGS lbfgs(net->parameters());
    try {
      ferry::share_optimizer(lbfgs);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("SGD, Adam") && Catch::Contains("share_"));
    }
  }
}

TEST_CASE("adopt_shared makes another module and optimizer use the shared tensors",
          "[shared_module]") {
  auto net = small_net();
  torch::optim::Adam opt(net->parameters());
  ferry::NamedTensors shared = ferry::share_module(*net, "model.");
  shared.merge(ferry::share_optimizer(opt));

  auto other = small_net();  // built the same way, as a worker builds it
  torch::optim::Adam other_opt(other->parameters());
  ferry::adopt_shared(*other, shared, "model.");
  ferry::adopt_shared(other_opt, shared);
  for (std::size_t i = 0; i < net->parameters().size(); ++i) {
    CHECK(other->parameters()[i].data_ptr() == net->parameters()[i].data_ptr());
    CHECK(other->parameters()[i].requires_grad());
  }
  train_step(other, other_opt);  // the other's step is the first's too
  CHECK(other->parameters()[0].equal(net->parameters()[0]));
  CHECK(shared.at("optimizer.0.exp_avg").abs().sum().item<float>() > 0);

  SECTION("a missing name or another shape is an error naming it") {
    auto wrong = torch::nn::Sequential(torch::nn::Linear(4, 9), torch::nn::BatchNorm1d(9),
                                       torch::nn::Linear(9, 2));
    try {
      ferry::adopt_shared(*wrong, shared, "model.");
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("model.0.weight") && Catch::Contains("[9, 4]"));
    }
    try {
      ferry::adopt_shared(*other, shared, "elsewhere.");
      FAIL("no error");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("no shared tensor named 'elsewhere.0.weight'"));
    }
  }
}

TEST_CASE("a shared module's memory goes back to the arena when the module goes",
          "[shared_module]") {
  const auto before = ferry::arena_stats();
  {
    torch::nn::Linear big(512, 512);
    ferry::share_module(*big);
    CHECK(ferry::arena_stats().bytes_in_use >= before.bytes_in_use + 512 * 512 * 4);
  }
  CHECK(ferry::arena_stats().bytes_in_use == before.bytes_in_use);
}
