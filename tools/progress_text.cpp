#include "tools/progress_text.hpp"

#include <cmath>
#include <cstdio>

namespace ferry::tools {
namespace {

std::string format(const char* fmt, double a, double b = 0) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, a, b);
  return buf;
}

}  // namespace

std::string rate_text(double per_s) {
  if (per_s >= 1.0 || per_s <= 0.0) {
    return format(per_s >= 100 ? "%.0f tasks/s" : "%.1f tasks/s", per_s);
  }
  if (per_s * 60 >= 1.0) return format("%.1f tasks/min", per_s * 60);
  return format("%.1f tasks/h", per_s * 3600);
}

std::string duration_text(double s) {
  if (s < 60) return format("%.1f s", s);
  const long total = std::lround(s);
  if (total < 3600) return format("%.0f min %02.0f s", total / 60, total % 60);
  return format("%.0f h %02.0f min", total / 3600, (total % 3600) / 60);
}

std::string progress_text(std::size_t done, std::size_t total, std::size_t failed,
                          double elapsed_s) {
  const double pct = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100;
  std::string s = std::to_string(done) + "/" + std::to_string(total) + " tasks (" +
                  format(pct > 0 && pct < 1 ? "%.1f%%" : "%.0f%%", pct) + "), " +
                  std::to_string(failed) + " failed";
  if (done > 0 && elapsed_s > 0) {
    const double rate = static_cast<double>(done) / elapsed_s;
    s += ", " + rate_text(rate);
  }
  s += ", " + duration_text(elapsed_s) + " elapsed";
  if (done > 0 && done < total && elapsed_s > 0) {
    const double left = elapsed_s * static_cast<double>(total - done) / static_cast<double>(done);
    s += ", about " + duration_text(left) + " left";
  }
  return s;
}

std::size_t tenth_of(std::size_t done, std::size_t total) {
  return total ? 10 * done / total : 10;
}

bool pipe_line_due(std::size_t done, std::size_t total, std::size_t last_tenth,
                   double since_last_line_s, double every_s) {
  if (done == total) return last_tenth != 10;
  return tenth_of(done, total) != last_tenth || since_last_line_s >= every_s;
}

std::string ready_text(const std::vector<std::string>& starts,
                       const std::vector<std::string>& devices, double seconds) {
  // [(start, [(device, count)])] in order of first appearance.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>> groups;
  for (std::size_t i = 0; i < starts.size() && i < devices.size(); ++i) {
    auto g = groups.begin();
    while (g != groups.end() && g->first != starts[i]) ++g;
    if (g == groups.end()) g = groups.insert(g, {starts[i], {}});
    auto d = g->second.begin();
    while (d != g->second.end() && d->first != devices[i]) ++d;
    if (d == g->second.end()) {
      g->second.push_back({devices[i], 1});
    } else {
      ++d->second;
    }
  }
  std::string s =
      std::to_string(starts.size()) + (starts.size() == 1 ? " worker ready (" : " workers ready (");
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    s += (gi ? "; " : "") + groups[gi].first + ": ";
    for (std::size_t di = 0; di < groups[gi].second.size(); ++di) {
      const auto& [device, n] = groups[gi].second[di];
      s += (di ? ", " : "") + (n > 1 ? std::to_string(n) + " " : std::string()) + device;
    }
  }
  return s + ") in " + duration_text(seconds);
}

}  // namespace ferry::tools
