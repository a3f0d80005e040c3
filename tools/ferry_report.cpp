#include "tools/ferry_report.hpp"

#include <unistd.h>

#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "ipc/cuda/gate.hpp"
#include "ipc/units.hpp"
#include "tools/progress_text.hpp"

namespace ferry::tools {
namespace {

using Seconds = std::chrono::duration<double>;
using nlohmann::json;

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

// What this process moved by CUDA IPC: batches staged on a device and the results it opened.
json cuda_summary() {
  const ferry::TransportStats t = ferry::transport_stats();
  json reasons = json::object();
  for (int r = 0; r < static_cast<int>(ferry::CopyReason::count_); ++r) {
    if (t.copies_by_reason[r]) {
      reasons[ferry::copy_reason_name(static_cast<ferry::CopyReason>(r))] = t.copies_by_reason[r];
    }
  }
  return {{"tensors_sent_zero_copy", t.cuda_tensors_zero_copy},
          {"bytes_sent_zero_copy", t.cuda_bytes_zero_copy},
          {"handles_exported", t.cuda_handles_exported},
          {"handles_opened", t.cuda_handles_opened},
          {"handle_cache_hits", t.cuda_handle_cache_hits},
          {"idle_sends", t.cuda_idle_sends},
          {"memop_writes", t.cuda_memop_writes},
          {"events_recorded", t.cuda_events_recorded},
          {"event_pool_syncs", t.cuda_event_pool_syncs},
          {"memop_waits", t.cuda_memop_waits},
          {"copies_by_reason", reasons},
          // Why this process called into CUDA, if it did: a supervisor that did cannot fork.
          {"ferry_entered",
           ferry::cuda::first_entry() ? json(ferry::cuda::first_entry()) : json(nullptr)}};
}

// The bytes of inputs and results, zero-copy and copied, over every worker.
struct Moved {
  std::uint64_t in_zc = 0, in_cp = 0, out_zc = 0, out_cp = 0;
  explicit Moved(const ferry::PoolStats& s)
      : in_zc(s.input_bytes_zero_copy), in_cp(s.input_bytes_copied) {
    for (const auto& w : s.workers) {
      out_zc += w.bytes_zero_copy;
      out_cp += w.bytes_copied;
    }
  }
};

// Why results were copied, where the user may wonder: shared allocations were turned off, or the
// results are small, which are copied by design (docs/supervisor.md, "Shared allocations").
std::string why_results_copied(const RunArgs& a, const ferry::PoolStats& s) {
  std::uint64_t tensors = 0, bytes = 0;
  for (const auto& w : s.workers) {
    tensors += w.tensors_copied;
    bytes += w.bytes_copied;
  }
  if (tensors == 0) return "";
  if (a.shared_allocations == "off") return " (--shared-allocations off)";
  const std::uint64_t line = ferry::shared_allocation_threshold();
  if (bytes / tensors >= line) return "";
  return " (" + ferry::format_bytes(bytes / tensors) + " a result: under " +
         ferry::format_bytes(line) + ", results are copied by design)";
}

void print_json(const RunArgs& a, const RunOutcome& r) {
  const ferry::PoolStats& s = r.stats;
  const Moved m(s);
  const double rate = static_cast<double>(r.done) / std::max(r.seconds, 1e-9);
  json workers = json::array();
  for (const auto& w : s.workers) {
    workers.push_back({{"id", w.id},
                       {"device", w.device},
                       {"start", w.start},
                       {"pid", w.pid},
                       {"tasks", w.tasks_done},
                       {"failed", w.tasks_failed},
                       {"lost", w.tasks_lost},
                       {"restarts", w.restarts},
                       {"replaced", w.replaced},
                       {"timeouts", w.timeouts},
                       {"given_up", w.given_up},
                       {"last_exit", w.last_exit},
                       {"bytes_zero_copy", w.bytes_zero_copy},
                       {"bytes_copied", w.bytes_copied}});
  }
  json doc = {
      {"task", a.task},
      {"tasks", r.done},
      {"failed", r.errors.size()},
      {"retried", s.retried},
      {"seconds", r.seconds},
      {"tasks_per_second", rate},
      {"latency_ms",
       {{"p50", percentile(r.latencies, 0.5) * 1e3}, {"p99", percentile(r.latencies, 0.99) * 1e3}}},
      {"inputs", {{"bytes_zero_copy", m.in_zc}, {"bytes_copied", m.in_cp}}},
      {"results", {{"bytes_zero_copy", m.out_zc}, {"bytes_copied", m.out_cp}}},
      {"cuda", cuda_summary()},
      {"workers", workers},
      {"errors", r.errors},
      {"broken", r.broken}};
  if (r.hosts) {
    doc["hosts"] = {
        {"joined", r.hosts->joined}, {"lost", r.hosts->lost}, {"refused", r.hosts->refused}};
  }
  std::printf("%s\n", doc.dump(2).c_str());
}

void print_text(const RunArgs& a, const RunOutcome& r) {
  const ferry::PoolStats& s = r.stats;
  const Moved m(s);
  const double rate = static_cast<double>(r.done) / std::max(r.seconds, 1e-9);
  std::printf("ferry run: task '%s' on %zu worker(s), %zu tasks in %.2f s\n", a.task.c_str(),
              s.workers.size(), r.done, r.seconds);
  std::printf("  throughput  %.1f tasks/s, %zu failed, %llu retried\n", rate, r.errors.size(),
              static_cast<unsigned long long>(s.retried));
  std::printf("  latency     p50 %.2f ms, p99 %.2f ms (hand-over to result)\n",
              percentile(r.latencies, 0.5) * 1e3, percentile(r.latencies, 0.99) * 1e3);
  if (r.hosts) {
    std::printf("  hosts       %llu joined, %llu lost, %llu refused\n",
                static_cast<unsigned long long>(r.hosts->joined),
                static_cast<unsigned long long>(r.hosts->lost),
                static_cast<unsigned long long>(r.hosts->refused));
  }
  std::printf("  inputs      %s zero-copy, %s copied\n", ferry::format_bytes(m.in_zc).c_str(),
              ferry::format_bytes(m.in_cp).c_str());
  std::printf("  results     %s zero-copy, %s copied%s\n", ferry::format_bytes(m.out_zc).c_str(),
              ferry::format_bytes(m.out_cp).c_str(), why_results_copied(a, s).c_str());
  int width = 8;  // a host's slot names the host and its devices
  for (const auto& w : s.workers) width = std::max(width, static_cast<int>(w.device.size()));
  std::printf("  %-6s %-*s %-6s %8s %7s %8s %11s %11s\n", "worker", width, "device", "start",
              "tasks", "failed", "restarts", "zero-copy", "copied");
  for (const auto& w : s.workers) {
    std::printf("  %-6d %-*s %-6s %8llu %7llu %8llu %11s %11s\n", w.id, width, w.device.c_str(),
                w.start.c_str(), static_cast<unsigned long long>(w.tasks_done),
                static_cast<unsigned long long>(w.tasks_failed),
                static_cast<unsigned long long>(w.restarts),
                ferry::format_bytes(w.bytes_zero_copy).c_str(),
                ferry::format_bytes(w.bytes_copied).c_str());
  }
  for (const auto& w : s.workers) {
    if (w.given_up) {
      std::printf("  worker %d (%s) given up; its last start: %s\n", w.id, w.device.c_str(),
                  w.last_exit.c_str());
    }
  }
  if (!a.output.empty() && r.complete()) {
    std::printf("  wrote %zu results to %s\n", r.results.size(), a.output.c_str());
  }
}

}  // namespace

Progress::Progress(std::size_t total) : total_(total), tty_(::isatty(2) == 1) {}

void Progress::update(std::size_t done, std::size_t failed) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = Seconds(now - start_).count();
  if (tty_) {
    if (done != total_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 30;
    const int filled = total_ ? static_cast<int>(width * done / total_) : width;
    // \x1b[K clears what a longer line before this one left at its end.
    std::fprintf(stderr, "\r[%s%s] %s\x1b[K", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(),
                 progress_text(done, total_, failed, elapsed).c_str());
    if (done == total_) std::fprintf(stderr, "\n");
    return;
  }
  if (!pipe_line_due(done, total_, last_tenth_, Seconds(now - last_).count())) return;
  last_tenth_ = tenth_of(done, total_);
  last_ = now;
  std::fprintf(stderr, "ferry: %s\n", progress_text(done, total_, failed, elapsed).c_str());
}

void print_failures(const RunOutcome& r) {
  // A task failed because the pool broke ends with the pool's error, said once below.
  const std::string& why = r.broken_detail;
  std::vector<const std::string*> own;
  for (const auto& e : r.errors) {
    const bool with_pool = !why.empty() && e.size() >= why.size() &&
                           e.compare(e.size() - why.size(), why.size(), why) == 0;
    if (!with_pool) own.push_back(&e);
  }
  for (std::size_t i = 0; i < std::min<std::size_t>(own.size(), 5); ++i) {
    std::fprintf(stderr, "%s\n", own[i]->c_str());
  }
  if (own.size() > 5) std::fprintf(stderr, "... and %zu more failures\n", own.size() - 5);
  if (r.broken.empty()) return;
  const std::size_t with_pool = r.errors.size() - own.size();
  std::fprintf(stderr, "%s", r.broken.c_str());
  if (with_pool > 0) std::fprintf(stderr, " (%zu task(s) failed with it)", with_pool);
  std::fprintf(stderr, "\n");
}

void print_summary(const RunArgs& a, const RunOutcome& r) {
  if (a.json) {
    print_json(a, r);
  } else {
    print_text(a, r);
  }
}

// The lists go untagged: torch::jit::pickle_save tags each with torch.jit._pickle.restore_type_tag
// (or build_tensorlist), a global that torch.load's weights_only unpickler refuses, and
// weights_only=True is its default from PyTorch 2.6 on.
void save_results(const std::string& path, const std::vector<ferry::Tensors>& results) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& r : results) {
    if (r.size() == 1) {
      list.push_back(r[0].cpu());
    } else {
      c10::impl::GenericList inner(c10::AnyType::get());  // c10::List<Tensor> would be tagged
      for (const auto& t : r) inner.push_back(t.cpu());
      list.push_back(inner);
    }
  }
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* p, std::size_t n) { pickled.insert(pickled.end(), p, p + n); }, nullptr,
      nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(list);
  pickler.stop();
  // The zip archive torch.save writes, as torch::jit::pickle_save makes it.
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw BadInput("cannot write --output '" + path + "': " + std::strerror(errno));
  {
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* p, std::size_t n) -> std::size_t {
      f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
      return f ? n : 0;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                       zip);
    zip.writeEndOfFile();
  }
  f.flush();
  if (!f) throw BadInput("cannot write --output '" + path + "': " + std::strerror(errno));
}

}  // namespace ferry::tools
