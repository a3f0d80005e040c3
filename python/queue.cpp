// ferry._C.TensorQueue: the queue of Python messages (ferry/_queue.py builds Queue on it).
#include "python/queue.hpp"

#include <pybind11/stl.h>

#include "python/message.hpp"
#include "python/plain_message.hpp"

namespace py = pybind11;

namespace ferry::python {

void bind_queue(py::module_& m) {
  py::class_<TensorQueue>(m, "TensorQueue")
      .def_static(
          "create",
          [](std::uint32_t capacity, std::uint32_t max_messages) {
            return TensorQueue::create({capacity, max_messages});
          },
          py::arg("capacity"), py::arg("max_messages") = 0,
          "a new queue of `capacity` tensors in flight, `max_messages` messages (0: no bound)")
      .def_static("attach", &TensorQueue::attach, py::arg("fd"), py::arg("announced") = false,
                  py::arg("custody_fd") = -1,
                  "the queue whose fds were inherited or received (they are duplicated); "
                  "`announced`: the sender of the fds announced this process")
      .def("announce", &TensorQueue::announce,
           "counts one process on its way to the queue (before a fork or a pickle)")
      .def("expire_announced", &TensorQueue::expire_announced, py::arg("pid"),
           "ends the announcement of child `pid`, which exited before it attached; whether one "
           "ended")
      .def("hold", &TensorQueue::hold, py::arg("announced") = false,
           "counts this process as one that may put or get; ends an announce() if `announced`")
      .def(
          "put",
          [](TensorQueue& q, const py::bytes& payload, const std::vector<at::Tensor>& bases,
             std::optional<double> timeout) {
            send_message(payload, bases, timeout,
                         [&](Tensors message, auto ms) { q.send(message, ms); });
          },
          py::arg("payload"), py::arg("bases"), py::arg("timeout") = py::none(),
          "sends one message; blocks while the queue is full")
      .def(
          "put_plain",
          [](TensorQueue& q, py::handle obj, std::optional<double> timeout) -> py::object {
            const auto ms = to_timeout(timeout);
            std::optional<PlainMessage> plain = encode_plain(obj, q.capacity() - 1);
            if (!plain) return py::none();
            Tensors message =
                pack_message(plain->payload.data(), plain->payload.size(), plain->bases);
            bool sent = true;
            {
              py::gil_scoped_release unlocked;  // once, for the whole send
              try {
                q.send(message, ms);
              } catch (const Error& e) {
                if (e.code() != Errc::timeout) throw;
                sent = false;
              }
            }
            return py::bool_(sent);
          },
          py::arg("obj"), py::arg("timeout") = py::none(),
          "sends a plain object (python/plain_message.hpp) in one call: True, False when "
          "`timeout` passed first, None when it is not plain (pickle it and put())")
      .def(
          "get",
          [](TensorQueue& q, std::optional<double> timeout) -> py::object {
            const auto ms = to_timeout(timeout);
            std::optional<Tensors> message;
            {
              py::gil_scoped_release unlocked;
              message = q.try_recv(ms);
            }
            if (!message) return py::none();
            return unpack_object(std::move(*message));
          },
          py::arg("timeout") = py::none(),
          "None when `timeout` passed first; else (object,) for a plain message, or "
          "(payload, bases) for one to unpickle")
      .def("shutdown", &TensorQueue::close, "closes the queue for every process")
      .def("messages", &TensorQueue::messages, "messages queued now")
      .def("max_messages", &TensorQueue::max_messages)
      .def("capacity", &TensorQueue::capacity)
      .def("fd", &TensorQueue::fd)
      .def("custody_fd", &TensorQueue::custody_fd);
}

}  // namespace ferry::python
