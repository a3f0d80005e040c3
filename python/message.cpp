#include "python/message.hpp"

#include <cstring>

#include "ipc/error.hpp"
#include "python/plain_message.hpp"
#include "runtime/shared_tensor.hpp"

namespace py = pybind11;

namespace ferry::python {

Tensors pack_message(const py::bytes& payload, const std::vector<at::Tensor>& bases) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(payload.ptr(), &data, &size) != 0) throw py::error_already_set();
  return pack_message(data, static_cast<std::size_t>(size), bases);
}

Tensors pack_message(const char* data, std::size_t size, const std::vector<at::Tensor>& bases) {
  Tensors message;
  message.reserve(bases.size() + 1);
  // Written once, where it travels cheapest (an empty task's call and result fit a record).
  message.push_back(empty_for_sending(static_cast<std::int64_t>(size)));
  if (size > 0) std::memcpy(message.back().data_ptr(), data, size);
  message.insert(message.end(), bases.begin(), bases.end());
  return message;
}

namespace {

void check_message(const Tensors& message) {
  if (message.empty() || message[0].scalar_type() != at::kByte || message[0].dim() != 1 ||
      !message[0].is_cpu() || !message[0].is_contiguous()) {
    throw Error(Errc::bad_record,
                "the message is not a ferry Python message (no payload first); was it sent by "
                "C++ TensorQueue::send to a Python queue?");
  }
}

}  // namespace

py::tuple unpack_message(Tensors message) {
  check_message(message);
  const at::Tensor& p = message[0];
  py::bytes payload(static_cast<const char*>(p.data_ptr()), static_cast<std::size_t>(p.numel()));
  py::list bases;
  for (std::size_t i = 1; i < message.size(); ++i) bases.append(std::move(message[i]));
  return py::make_tuple(std::move(payload), std::move(bases));
}

py::tuple unpack_object(Tensors message) {
  check_message(message);
  const auto* data = static_cast<const char*>(message[0].data_ptr());
  const auto size = static_cast<std::size_t>(message[0].numel());
  if (!is_plain(data, size)) return unpack_message(std::move(message));
  const std::vector<at::Tensor> bases(message.begin() + 1, message.end());
  return py::make_tuple(decode_plain(data, size, bases));
}

}  // namespace ferry::python
