#include "python/storages.hpp"

#include <pybind11/stl.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "ipc/error.hpp"
#include "runtime/shared_tensor.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

using Weak = c10::weak_intrusive_ptr<c10::StorageImpl>;
using Key = StorageKey;

struct Cache {
  std::mutex mu;
  std::map<Key, Weak> storages;
  std::size_t inserts_since_sweep = 0;
};
Cache& cache() {
  static auto* c = new Cache;  // never destroyed: storages may die during interpreter exit
  return *c;
}

at::Tensor base_over(const c10::Storage& s) {
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(s.device()))
      .set_(s, 0, {static_cast<std::int64_t>(s.nbytes())}, {1});
}

}  // namespace

StorageKey key_of(const c10::Storage& s) {
  const c10::Device d = s.device();
  return {static_cast<int>(d.type()), d.index(),
          reinterpret_cast<std::uintptr_t>(s.data_ptr().get()), s.nbytes()};
}

at::Tensor storage_base(const at::Tensor& t) {
  if (!t.has_storage()) {
    throw Error(Errc::invalid_argument,
                "a " + std::string(c10::toString(t.layout())) + " tensor has no storage to send");
  }
  return base_over(t.storage());
}

at::Tensor adopt(const at::Tensor& base) {
  const c10::Storage& s = base.storage();
  if (s.nbytes() == 0) return base;
  const Key key = key_of(s);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto it = c.storages.find(key); it != c.storages.end()) {
    if (c10::intrusive_ptr<c10::StorageImpl> held = it->second.lock()) {
      c10::Storage existing(std::move(held));
      // A storage moved off a dead sender has a new address: the key no longer names it.
      if (key_of(existing) == key) return base_over(existing);
    }
  }
  c.storages.insert_or_assign(key, Weak(s.getWeakStorageImpl()));
  if (++c.inserts_since_sweep >= 1024) {
    for (auto it = c.storages.begin(); it != c.storages.end();) {
      it = it->second.expired() ? c.storages.erase(it) : std::next(it);
    }
    c.inserts_since_sweep = 0;
  }
  return base;
}

bool carried_by_storage(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && !t.is_quantized() &&
         (t.is_cpu() || t.is_cuda()) && t.dim() <= 12;
}

at::Tensor prepared_for_storage(const at::Tensor& t) {
  at::Tensor data = t.is_conj() || t.is_neg() ? t.resolve_conj().resolve_neg() : t;
  if (data.is_cpu()) share_(data);
  return data;
}

namespace {

// What a message says of tensor `t` besides its storage, or None when ferry does not carry it
// (sparse, quantized, another device, too many dimensions: it is pickled by value). Else
// (storage key, the tensor whose storage travels, "dtype;offset;sizes;strides"), where a lazily
// conjugated or negated view is resolved first (those bits are not in the storage) and a CPU
// storage is moved into the arena in place. One call, since each Python attribute read costs.
py::object describe(const at::Tensor& t) {
  if (!carried_by_storage(t)) return py::none();
  const at::Tensor data = prepared_for_storage(t);
  std::string meta = std::to_string(static_cast<int>(data.scalar_type())) + ';' +
                     std::to_string(data.storage_offset()) + ';';
  for (std::int64_t d = 0; d < data.dim(); ++d) {
    meta += (d ? "," : "") + std::to_string(data.size(d));
  }
  meta += ';';
  for (std::int64_t d = 0; d < data.dim(); ++d) {
    meta += (d ? "," : "") + std::to_string(data.stride(d));
  }
  return py::make_tuple(key_of(data.storage()), data, meta);
}

std::vector<std::int64_t> numbers(const std::string& text, std::size_t& at, char end) {
  std::vector<std::int64_t> out;
  while (at < text.size() && text[at] != end) {
    std::size_t used = 0;
    out.push_back(std::stoll(text.substr(at), &used));
    at += used;
    if (at < text.size() && text[at] == ',') ++at;
  }
  if (at >= text.size() || text[at] != end) throw std::invalid_argument("truncated");
  ++at;
  return out;
}

// The view that describe()'s "dtype;offset;sizes;strides" names on `base`'s storage.
at::Tensor view_described(const at::Tensor& base, const std::string& meta) {
  try {
    const std::string text = meta + ';';  // every field ends with ';'
    std::size_t at = 0;
    const auto head = numbers(text, at, ';');  // dtype
    const auto offset = numbers(text, at, ';');
    const auto sizes = numbers(text, at, ';');
    const auto strides = numbers(text, at, ';');
    if (at != text.size()) throw std::invalid_argument("trailing fields");
    if (head.size() != 1 || offset.size() != 1 || sizes.size() != strides.size() || head[0] < 0 ||
        head[0] >= static_cast<int>(at::ScalarType::NumOptions)) {
      throw std::invalid_argument("bad fields");
    }
    const auto dtype = static_cast<at::ScalarType>(head[0]);
    return at::empty({0}, base.options().dtype(dtype))
        .set_(base.storage(), offset[0], sizes, strides);
  } catch (const std::logic_error& e) {
    throw Error(Errc::bad_record, "a tensor reference '" + meta + "' is malformed (" + e.what() +
                                      "); the message was not made by this ferry");
  }
}

}  // namespace

void bind_storages(py::module_& m) {
  m.def("storage_base", &storage_base, "the uint8 tensor over the whole storage of t");
  m.def("adopt", &adopt, "the storage this process holds for the same memory as base");
  m.def("describe", &describe, py::arg("t"),
        "None, or (storage key, tensor to send the storage of, view description) for t");
  m.def("view_described", &view_described, py::arg("base"), py::arg("meta"),
        "the view describe() described, on base's storage");
}

}  // namespace ferry::python
