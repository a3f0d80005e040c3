#include "runtime/shared_module.hpp"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include "ipc/error.hpp"
#include "runtime/shared_tensor.hpp"

namespace ferry {
namespace {

// The optimizer's key for a parameter's state: a string of the TensorImpl's address in LibTorch
// 1.x, the address itself in 2.x.
template <class Map>
typename Map::key_type state_key(const Map&, const at::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream s;  // what c10::guts::to_string(p.unsafeGetTensorImpl()) writes
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return static_cast<typename Map::key_type>(p.unsafeGetTensorImpl());
  }
}

// A tensor field of a parameter's state, by name.
struct Slot {
  const char* name;
  at::Tensor* tensor;
};

// What one optimizer class keeps per parameter: how to make it as its first step() would, and
// where its tensors are. `make` returns null where the first step() would make no state.
struct Kind {
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(
      const at::Tensor& p, const torch::optim::OptimizerOptions& group)>
      make;
  std::function<std::vector<Slot>(torch::optim::OptimizerParamState&)> slots;
};

at::Tensor zeros_of(const at::Tensor& p) {
  return at::zeros_like(p, at::MemoryFormat::Preserve);
}

template <class State, class Options, class Make, class Slots>
Kind kind(Make make, Slots slots) {
  return Kind{
      [make](const at::Tensor& p, const torch::optim::OptimizerOptions& group)
          -> std::unique_ptr<torch::optim::OptimizerParamState> {
        return make(p, static_cast<const Options&>(group));
      },
      [slots](torch::optim::OptimizerParamState& s) { return slots(static_cast<State&>(s)); }};
}

// Adam and AdamW keep the same fields under two classes.
template <class State, class Options>
Kind adam_kind() {
  return kind<State, Options>(
      [](const at::Tensor& p, const Options& o) {
        auto s = std::make_unique<State>();
        s->step(0);
        s->exp_avg(zeros_of(p));
        s->exp_avg_sq(zeros_of(p));
        if (o.amsgrad()) s->max_exp_avg_sq(zeros_of(p));
        return s;
      },
      [](State& s) {
        return std::vector<Slot>{{"exp_avg", &s.exp_avg()},
                                 {"exp_avg_sq", &s.exp_avg_sq()},
                                 {"max_exp_avg_sq", &s.max_exp_avg_sq()}};
      });
}

Kind kind_of(torch::optim::Optimizer& optimizer) {
  namespace o = torch::optim;
  if (dynamic_cast<o::AdamW*>(&optimizer)) return adam_kind<o::AdamWParamState, o::AdamWOptions>();
  if (dynamic_cast<o::Adam*>(&optimizer)) return adam_kind<o::AdamParamState, o::AdamOptions>();
  if (dynamic_cast<o::SGD*>(&optimizer)) {
    return kind<o::SGDParamState, o::SGDOptions>(
        [](const at::Tensor& p, const o::SGDOptions& opt) -> std::unique_ptr<o::SGDParamState> {
          if (opt.momentum() == 0) return nullptr;  // plain SGD keeps no state
          auto s = std::make_unique<o::SGDParamState>();
          s->momentum_buffer(zeros_of(p));
          return s;
        },
        [](o::SGDParamState& s) {
          return std::vector<Slot>{{"momentum_buffer", &s.momentum_buffer()}};
        });
  }
  if (dynamic_cast<o::RMSprop*>(&optimizer)) {
    return kind<o::RMSpropParamState, o::RMSpropOptions>(
        [](const at::Tensor& p, const o::RMSpropOptions& opt) {
          auto s = std::make_unique<o::RMSpropParamState>();
          s->step(0);
          s->square_avg(zeros_of(p));
          if (opt.momentum() > 0) s->momentum_buffer(zeros_of(p));
          if (opt.centered()) s->grad_avg(zeros_of(p));
          return s;
        },
        [](o::RMSpropParamState& s) {
          return std::vector<Slot>{{"square_avg", &s.square_avg()},
                                   {"momentum_buffer", &s.momentum_buffer()},
                                   {"grad_avg", &s.grad_avg()}};
        });
  }
  if (dynamic_cast<o::Adagrad*>(&optimizer)) {
    return kind<o::AdagradParamState, o::AdagradOptions>(
        [](const at::Tensor& p, const o::AdagradOptions& opt) {
          auto s = std::make_unique<o::AdagradParamState>();  // its constructor made it already
          s->step(0);
          s->sum(at::full_like(p, opt.initial_accumulator_value(), at::MemoryFormat::Preserve));
          return s;
        },
        [](o::AdagradParamState& s) {
          return std::vector<Slot>{{"sum", &s.sum()}};
        });
  }
  throw Error(Errc::invalid_argument,
              "share_optimizer knows SGD, Adam, AdamW, RMSprop and Adagrad, not this optimizer "
              "(LBFGS or a class of your own); share its state tensors with ferry::share_ and "
              "PoolOptions::shared yourself");
}

// Calls fn("<prefix><i>.<field>", slot) for every state tensor of every parameter, i counting
// parameters across groups; state missing is made first, as the first step() would make it.
template <class Fn>
void each_state_tensor(torch::optim::Optimizer& optimizer, const std::string& prefix, Fn fn) {
  const Kind k = kind_of(optimizer);
  auto& state = optimizer.state();
  std::size_t i = 0;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const std::string name = prefix + std::to_string(i++);
      auto key = state_key(state, p);
      auto it = state.find(key);
      if (it == state.end()) {
        auto made = k.make(p, group.has_options() ? group.options() : optimizer.defaults());
        if (!made) continue;
        it = state.emplace(std::move(key), std::move(made)).first;
      }
      for (const Slot& s : k.slots(*it->second)) {
        if (s.tensor->defined()) fn(name + "." + s.name, *s.tensor);
      }
    }
  }
}

void check_same(const std::string& name, const at::Tensor& mine, const at::Tensor& shared) {
  if (mine.sizes() != shared.sizes() || mine.scalar_type() != shared.scalar_type() ||
      mine.device() != shared.device()) {
    throw Error(Errc::invalid_argument,
                "shared tensor '" + name + "' is " + c10::str(shared.sizes()) + " " +
                    c10::toString(shared.scalar_type()) + " on " + shared.device().str() +
                    " but here it is " + c10::str(mine.sizes()) + " " +
                    c10::toString(mine.scalar_type()) + " on " + mine.device().str() +
                    "; build the module the same way on both sides");
  }
}

const at::Tensor& find_shared(const NamedTensors& shared, const std::string& name,
                              const char* what) {
  auto it = shared.find(name);
  if (it == shared.end()) {
    throw Error(Errc::invalid_argument, std::string("no shared tensor named '") + name + "' for " +
                                            what + " (" + std::to_string(shared.size()) +
                                            " shared; check the prefix and that both sides build "
                                            "the same module and optimizer)");
  }
  return it->second;
}

template <class Fn>
void each_tensor(torch::nn::Module& module, const std::string& prefix, Fn fn) {
  for (auto& item : module.named_parameters(/*recurse=*/true))
    fn(prefix + item.key(), item.value());
  for (auto& item : module.named_buffers(/*recurse=*/true)) fn(prefix + item.key(), item.value());
}

}  // namespace

NamedTensors share_module(torch::nn::Module& module, const std::string& prefix) {
  NamedTensors out;
  each_tensor(module, prefix, [&](const std::string& name, at::Tensor& t) {
    if (!t.defined()) return;  // an optional buffer left unset
    share_(t);
    out.emplace(name, t.detach());  // the data: gradients stay each process's own
  });
  return out;
}

NamedTensors share_optimizer(torch::optim::Optimizer& optimizer, const std::string& prefix) {
  NamedTensors out;
  each_state_tensor(optimizer, prefix, [&](const std::string& name, at::Tensor& t) {
    share_(t);
    out.emplace(name, t);
  });
  return out;
}

void adopt_shared(torch::nn::Module& module, const NamedTensors& shared,
                  const std::string& prefix) {
  at::NoGradGuard no_grad;
  each_tensor(module, prefix, [&](const std::string& name, at::Tensor& t) {
    if (!t.defined()) return;
    const at::Tensor& s = find_shared(shared, name, "this module");
    check_same(name, t, s);
    t.set_data(s);  // the same tensor object (the optimizer's, autograd's) over shared memory
  });
}

void adopt_shared(torch::optim::Optimizer& optimizer, const NamedTensors& shared,
                  const std::string& prefix) {
  each_state_tensor(optimizer, prefix, [&](const std::string& name, at::Tensor& t) {
    const at::Tensor& s = find_shared(shared, name, "this optimizer");
    check_same(name, t, s);
    t = s;
  });
}

}  // namespace ferry
