#include "python/hosts.hpp"

#if FERRY_HAVE_HOSTS
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <limits>
#include <optional>

#include "hosts/head_hub.hpp"
#include "hosts/host_serve.hpp"
#include "hosts/launch_meeting.hpp"
#include "ipc/error.hpp"
#include "python/durations.hpp"
#include "python/message.hpp"
#include "python/pool.hpp"
#endif

namespace py = pybind11;

namespace ferry::python {

#if FERRY_HAVE_HOSTS
namespace {

using namespace ferry::hosts;
using namespace pybind11::literals;

constexpr const char* kWorkers = "python";  // the setup's "workers": ferry.Pool's
// The one key of a head's setup that reaches a host's workers (python.path stays the host's own:
// the head's paths mean nothing on another machine; shared objects cannot cross hosts).
constexpr const char* kInitializer = "python.initializer";

std::chrono::milliseconds ms(double seconds, const char* what) {
  return seconds_to_ms(what, seconds, Zero::refused);
}

// A stop request from Python (a signal handler, serve_host's `stop`) to the serving thread.
struct StopFlag {
  std::atomic<bool> value{false};
};

// A host joined to a head, its pool not yet started: the head's setup says what its workers need.
struct JoinedHead {
  Joined joined;
  ServeOptions serve;
};

// The head's setup for ferry.Pool's hosts: {"workers": "python", "python.initializer": ...}.
std::string python_setup(const std::optional<std::string>& initializer) {
  nlohmann::json extra = nlohmann::json::object();
  if (initializer) extra[kInitializer] = *initializer;
  return workers_setup(kWorkers, extra.dump());
}

// This host's workers' config: its own, plus what the head's setup gives them.
std::map<std::string, std::string> worker_config(const std::string& setup,
                                                 std::map<std::string, std::string> config) {
  const nlohmann::json s = nlohmann::json::parse(setup);
  if (s.contains(kInitializer)) config[kInitializer] = s.at(kInitializer).get<std::string>();
  return config;
}

py::dict hub_stats(const HeadHub& hub) {
  const HubStats s = hub.stats();
  return py::dict("joined"_a = s.joined, "refused"_a = s.refused, "lost"_a = s.lost,
                  "live"_a = s.live);
}

}  // namespace

void bind_hosts(py::module_& m) {
  m.attr("has_hosts") = true;
  m.def("python_setup", &python_setup, py::arg("initializer"),
        "the setup a ferry.Pool head gives joining hosts");

  py::class_<HeadHub, RemoteWorkers, std::shared_ptr<HeadHub>>(m, "Hub")
      .def(
          py::init([](const std::string& listen, const std::string& secret_file,
                      double join_timeout, double heartbeat, double lost_after, std::string setup) {
            const Endpoint at = parse_endpoint(listen, true);
            HubOptions h;
            h.address = at.address;
            h.port = at.port;
            h.secret = Secret::load(secret_file);
            h.join_timeout = ms(join_timeout, "join_timeout");
            h.heartbeat = ms(heartbeat, "heartbeat");
            h.lost_after = ms(lost_after, "lost_after");
            h.setup = std::move(setup);
            py::gil_scoped_release unlocked;
            return std::make_shared<HeadHub>(std::move(h));
          }),
          py::arg("listen"), py::arg("secret_file"), py::arg("join_timeout"), py::arg("heartbeat"),
          py::arg("lost_after"), py::arg("setup"))
      .def("port", &HeadHub::port)
      .def("stats", &hub_stats)
      .def(
          "wait_for_hosts",
          [](const HeadHub& hub, std::size_t hosts, std::optional<double> timeout) {
            auto t = to_timeout(timeout);
            if (t.count() < 0) t = std::chrono::milliseconds(std::numeric_limits<int>::max());
            py::gil_scoped_release unlocked;
            return hub.wait_for_hosts(hosts, t);
          },
          py::arg("hosts"), py::arg("timeout"));

  py::class_<StopFlag>(m, "StopFlag")
      .def(py::init<>())
      .def("set", [](StopFlag& f) { f.value = true; })
      .def("is_set", [](const StopFlag& f) { return f.value.load(); });

  py::class_<JoinedHead>(m, "JoinedHead")
      .def_property_readonly("number", [](const JoinedHead& j) { return j.joined.number; })
      .def_property_readonly("address", [](const JoinedHead& j) { return j.joined.host.address; })
      .def_property_readonly("capacity", [](const JoinedHead& j) { return j.joined.host.capacity; })
      .def(
          "serve",
          [](JoinedHead& j, PoolOptions options, StopFlag& stop) {
            if (!j.joined.link) throw Error(Errc::closed, "this host has served its head already");
            options.devices = j.joined.host.devices;
            options.config = worker_config(j.joined.setup, std::move(options.config));
            PoolOptions o = python_pool_options(std::move(options));
            py::gil_scoped_release unlocked;
            std::optional<Pool> pool;
            auto link = std::move(j.joined.link);
            struct Close {  // what is left runs again elsewhere: the head retries it
              std::optional<Pool>& pool;
              ~Close() {
                if (pool) pool->close(Shutdown::Cancel);
              }
            } close{pool};
            const ServeEnd end = serve_head(
                [&]() -> Pool& {
                  pool.emplace(std::move(o));
                  return *pool;
                },
                *link, j.serve, stop.value);
            return std::string(end == ServeEnd::head_left ? "head_left" : "stopped");
          },
          py::arg("options"), py::arg("stop"),
          "starts this host's workers as the head's setup says and serves the head until one "
          "side leaves: 'head_left' or 'stopped'");

  py::class_<Launch>(m, "Launch", "what torchrun, srun or env:// variables told this process")
      .def_property_readonly("launcher",
                             [](const Launch& l) { return std::string(launcher_name(l.by)); })
      .def_readonly("rank", &Launch::rank)
      .def_readonly("world_size", &Launch::world_size)
      .def_readonly("head", &Launch::head)
      .def_readonly("port", &Launch::port)
      .def_readonly("agent_store", &Launch::agent_store)
      .def_readonly("restart", &Launch::restart)
      .def_readonly("run_id", &Launch::run_id)
      .def("__repr__", [](const Launch& l) { return "<ferry launch: " + l.describe() + ">"; })
      .def("describe", &Launch::describe);
  m.def(
      "read_launch", [] { return read_launch(process_environment()); },
      "this process's launch, or None where no launcher started it (or its world is one)");
  m.def(
      "launch_listen_address",
      [](const Launch& l) {
        return launch_head_address(l) + ":" + std::to_string(launch_listen_port(l));
      },
      py::arg("launch"), "rank 0's ADDRESS:PORT to listen on (port 0: any free one)");
  m.def(
      "announce_launch_head",
      [](const Launch& l, const std::string& address, std::uint16_t port, double timeout) {
        const auto t = ms(timeout, "join_timeout");
        py::gil_scoped_release unlocked;
        announce_launch_head(l, address, port, t);
      },
      py::arg("launch"), py::arg("address"), py::arg("port"), py::arg("timeout"),
      "rank 0, listening: says where in torchrun's store, where there is one");
  m.def(
      "find_launch_head",
      [](const Launch& l, double timeout) {
        const auto t = ms(timeout, "join_timeout");
        py::gil_scoped_release unlocked;
        const Endpoint e = find_launch_head(l, t);
        return e.address + ":" + std::to_string(e.port);
      },
      py::arg("launch"), py::arg("timeout"), "every other rank: the head's ADDRESS:PORT");
  m.def(
      "join_head",
      [](const std::string& join, const std::string& secret_file, std::string name,
         std::string address, std::vector<std::string> devices, int inflight, double join_timeout,
         double heartbeat, double lost_after) {
        const Endpoint head = parse_endpoint(join, false);
        const Secret secret = Secret::load(secret_file);
        HostInfo self;
        self.name = std::move(name);
        self.address = address.empty() ? address_towards(head.address) : std::move(address);
        self.devices = std::move(devices);
        self.capacity = self.devices.size() * static_cast<std::size_t>(inflight);
        LinkOptions link;
        link.address = self.address;
        link.timeout = ms(lost_after, "lost_after");
        link.join_timeout = ms(join_timeout, "join_timeout");
        JoinedHead j;
        j.serve.heartbeat = ms(heartbeat, "heartbeat");
        j.serve.lost_after = link.timeout;
        const auto timeout = link.join_timeout;
        py::gil_scoped_release unlocked;
        j.joined = join_head(connect_store(head.address, head.port, timeout), secret,
                             std::move(self), std::move(link), timeout,
                             [](const std::string& setup) { require_workers(setup, kWorkers); });
        return j;
      },
      py::arg("join"), py::arg("secret_file"), py::arg("name"), py::arg("address"),
      py::arg("devices"), py::arg("maxtasks_inflight"), py::arg("join_timeout"),
      py::arg("heartbeat"), py::arg("lost_after"),
      "joins the head at ADDRESS:PORT, proving the secret; the host's pool starts in serve()");
}
#else
void bind_hosts(py::module_& m) {
  m.attr("has_hosts") = false;
}
#endif

}  // namespace ferry::python
