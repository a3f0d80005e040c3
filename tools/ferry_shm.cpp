// ferry-shm: why shared memory will or will not work here, and what was left behind.
//
//   ferry-shm [check] [--need SIZE] [--workers N] [--json]   exit 0 ok, 1 warning, 2 failure
//   ferry-shm ls [--json] [--all]
//   ferry-shm clean [--dry-run] [--force] [--older-than DURATION]
//
// The checks and the census are library code (ipc/diag/shm_check.hpp, ipc/diag/shm_census.hpp) so
// the supervisor runs the same at start-up; this file only parses options and prints.
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "ipc/diag/shm_census.hpp"
#include "ipc/diag/shm_check.hpp"
#include "ipc/error.hpp"
#include "ipc/units.hpp"
#include "ipc/version.hpp"

namespace {

constexpr int kExitBadInput = 2;

struct Style {
  bool color = false;
  std::string paint(const std::string& s, const char* code) const {
    return color ? std::string("\033[") + code + "m" + s + "\033[0m" : s;
  }
  std::string verdict(ferry::Verdict v) const {
    const char* codes[] = {"32", "33", "1;31"};
    return paint(ferry::verdict_name(v), codes[static_cast<int>(v)]);
  }
  std::string state(ferry::SegmentState s) const {
    const char* codes[] = {"32", "1;31", "33"};
    return paint(ferry::segment_state_name(s), codes[static_cast<int>(s)]);
  }
};

// Colours on a terminal only, and never when NO_COLOR is set (no-color.org).
Style make_style() {
  const char* term = std::getenv("TERM");
  Style s;
  s.color =
      ::isatty(STDOUT_FILENO) && !std::getenv("NO_COLOR") && !(term && std::string(term) == "dumb");
  return s;
}

// Pads to `width` visible characters; colour codes take no room on screen.
std::string pad(const std::string& shown, std::size_t visible, std::size_t width) {
  return shown + std::string(width > visible ? width - visible : 0, ' ');
}

std::string age(std::int64_t mtime) {
  if (mtime <= 0) return "-";
  const std::int64_t s = std::max<std::int64_t>(0, std::time(nullptr) - mtime);
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  if (s < 2 * 86400) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string yes_no(bool b) {
  return b ? "yes" : "no";
}

void print_cuda(const ferry::cuda::CudaStatus& s) {
  if (s.devices.empty()) return;
  std::printf("\n  %-7s %-28s %-40s %-4s %-18s %-4s %s\n", "DEVICE", "NAME", "UUID", "CC", "MODE",
              "IPC", "IPC EVENTS");
  static const char* const kModes[] = {"default", "exclusive_thread", "prohibited",
                                       "exclusive_process"};
  for (const auto& d : s.devices) {
    const char* mode = d.compute_mode >= 0 && d.compute_mode < 4 ? kModes[d.compute_mode] : "?";
    std::printf("  cuda:%-2d %-28s %-40s %d.%-2d %-18s %-4s %s\n", d.index, d.name.c_str(),
                d.uuid.c_str(), d.major, d.minor, mode, yes_no(d.legacy_ipc).c_str(),
                yes_no(d.ipc_events).c_str());
  }
  if (s.peer_access.size() > 1) {
    std::printf("\n  peer access (row can map column):\n        ");
    for (std::size_t j = 0; j < s.peer_access.size(); ++j) std::printf(" %-4zu", j);
    std::printf("\n");
    for (std::size_t i = 0; i < s.peer_access.size(); ++i) {
      std::printf("  %-5zu ", i);
      for (std::size_t j = 0; j < s.peer_access.size(); ++j) {
        std::printf(" %-4s", i == j ? "-" : yes_no(s.peer_access[i][j]).c_str());
      }
      std::printf("\n");
    }
  }
}

int run_check(const ferry::ShmCheckOptions& opt, bool json, const Style& style) {
  const ferry::ShmReport r = ferry::check_shm(opt);
  if (json) {
    std::printf("%s\n", ferry::to_json(r).c_str());
    return r.exit_code();
  }
  const std::string where = r.backing == "memfd" ? "memfd segments" : "segments in " + r.dir;
  std::printf("ferry-shm check: %s, %u workers, need %s of shared memory and about %llu fds\n\n",
              where.c_str(), r.workers, ferry::format_bytes(r.need_bytes).c_str(),
              static_cast<unsigned long long>(r.fds_needed));
  std::size_t name_w = 5;
  for (const auto& i : r.items) name_w = std::max(name_w, i.name.size());
  std::printf("  %s  %-7s %s\n", pad("CHECK", 5, name_w).c_str(), "VERDICT", "FINDING");
  for (const auto& i : r.items) {
    std::printf(
        "  %s  %s %s\n", pad(i.name, i.name.size(), name_w).c_str(),
        pad(style.verdict(i.verdict), std::strlen(ferry::verdict_name(i.verdict)), 7).c_str(),
        i.summary.c_str());
    if (i.verdict != ferry::Verdict::ok && !i.remedy.empty()) {
      std::printf("  %s  %-7s %s\n", std::string(name_w, ' ').c_str(), "",
                  style.paint("fix: " + i.remedy, "1").c_str());
    }
  }
  if (r.cuda) print_cuda(*r.cuda);
  std::printf("\nverdict: %s\n", style.verdict(r.overall()).c_str());
  return r.exit_code();
}

std::string owner_of(const ferry::ShmSegment& s) {
  if (!s.holders.empty()) {
    std::string out;
    for (std::size_t i = 0; i < s.holders.size() && i < 3; ++i) {
      out += (i ? "," : "") + std::to_string(s.holders[i]);
    }
    return s.holders.size() > 3 ? out + ",..." : out;
  }
  return s.name_pid ? std::to_string(s.name_pid) : "-";
}

int run_ls(const std::string& dir, bool json, bool all, const Style& style) {
  const ferry::ShmCensus c = ferry::take_shm_census(dir);
  if (json) {
    std::printf("%s\n", ferry::to_json(c, all).c_str());
    return 0;
  }
  std::vector<const ferry::ShmSegment*> shown;
  for (const auto& s : c.segments) {
    if (all || s.kind != "other") shown.push_back(&s);
  }
  if (shown.empty()) {
    std::printf("no ferry or torch segments in %s or in memfds%s\n", c.dir.c_str(),
                all ? "" : " (--all lists every file)");
  } else {
    std::size_t name_w = 4;
    for (const auto* s : shown) name_w = std::max(name_w, s->name.size());
    std::printf("  %-8s %-5s %10s %10s %-12s %-4s %s  %s\n", "STATE", "KIND", "SIZE", "IN MEMORY",
                "OWNER", "AGE", pad("NAME", 4, name_w).c_str(), "WHY");
    std::uint64_t orphaned = 0, orphaned_bytes = 0, total = 0;
    for (const auto* s : shown) {
      const char* state = ferry::segment_state_name(s->state);
      std::printf("  %s %-5s %10s %10s %-12s %-4s %s  %s\n",
                  pad(style.state(s->state), std::strlen(state), 8).c_str(), s->kind.c_str(),
                  s->size ? ferry::format_bytes(s->size).c_str() : "?",
                  ferry::format_bytes(s->allocated).c_str(), owner_of(*s).c_str(),
                  s->named ? age(s->mtime).c_str() : "-",
                  pad(s->name, s->name.size(), name_w).c_str(), s->reason.c_str());
      total += s->allocated;
      if (s->state == ferry::SegmentState::orphaned) {
        ++orphaned;
        orphaned_bytes += s->allocated;
      }
    }
    const auto memfds = std::count_if(shown.begin(), shown.end(),
                                      [](const ferry::ShmSegment* s) { return s->memfd; });
    std::printf("\n%zu segment(s) in %s", shown.size() - static_cast<std::size_t>(memfds),
                c.dir.c_str());
    if (memfds) std::printf(" and %zu memfd(s)", static_cast<std::size_t>(memfds));
    std::printf(", %s in memory", ferry::format_bytes(total).c_str());
    if (orphaned) {
      std::printf("; %llu orphaned (%s): ferry-shm clean removes them",
                  static_cast<unsigned long long>(orphaned),
                  ferry::format_bytes(orphaned_bytes).c_str());
    }
    std::printf("\n");
  }
  if (!c.unreadable.empty()) {
    std::printf("note: %s; what they might hold is shown as unknown\n",
                c.unreadable_reason.c_str());
  }
  return 0;
}

int run_clean(const ferry::ShmCleanOptions& opt) {
  const ferry::ShmCleanResult r = ferry::clean_shm(opt);
  const char* verb = opt.dry_run ? "would remove" : "removed";
  for (const auto& s : r.removed) {
    std::printf("%s %s (%s, %s%s)\n", verb, s.name.c_str(),
                ferry::format_bytes(s.allocated).c_str(), s.force_removable ? "forced: " : "",
                s.reason.c_str());
  }
  for (const auto& e : r.errors) std::fprintf(stderr, "ferry-shm: cannot remove %s\n", e.c_str());
  std::size_t forcible = 0;
  for (const auto& s : r.kept) {
    std::printf("kept %s (%s, unknown: %s)\n", s.name.c_str(),
                ferry::format_bytes(s.allocated).c_str(), s.reason.c_str());
    forcible += s.force_removable ? 1 : 0;
  }
  std::printf("%s %s in %zu %s segment(s)\n", opt.dry_run ? "would free" : "freed",
              ferry::format_bytes(r.bytes_freed).c_str(), r.removed.size(),
              opt.force ? "orphaned or forced" : "orphaned");
  if (forcible > 0) {
    std::printf(
        "%zu kept segment(s) have a dead creator: clean --force removes them (safe for "
        "every process that already holds them; see docs/ferry-shm.md)\n",
        forcible);
  }
  return r.errors.empty() ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-shm: diagnose shared-memory limits, find and clean leftover segments"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", ferry::version());
  std::string dir;  // empty: $FERRY_SHM_DIR or /dev/shm, read inside the try below
  std::string need_text;
  unsigned workers = 0;
  bool json = false, all = false, dry_run = false, no_reserve = false, no_cuda = false;
  bool force = false;
  std::string older_text;

  // `check` is the default, so its options are accepted without the word too.
  auto add_check_options = [&](CLI::App* a) {
    a->add_option("--dir", dir,
                  "check segments as files in this directory (default: where the job's would "
                  "go: memfds, or $FERRY_SHM_DIR or /dev/shm; FERRY_SHM_BACKING)");
    a->add_option("--need", need_text,
                  "shared memory to reserve and check, e.g. 512M, 1.5GiB (default: what ferry "
                  "run would use with --workers workers)");
    a->add_option("--workers", workers, "planned workers (default: one per hardware thread)")
        ->check(CLI::PositiveNumber);
    a->add_flag("--json", json, "one JSON document instead of the table");
    a->add_flag("--no-reserve", no_reserve, "estimate from free space instead of reserving");
    a->add_flag("--no-cuda", no_cuda, "skip the CUDA probe");
  };
  add_check_options(&app);
  CLI::App* check = app.add_subcommand("check", "can this job use shared memory? (the default)");
  add_check_options(check);
  CLI::App* ls = app.add_subcommand("ls", "ferry's and PyTorch's segments, their owners and state");
  ls->add_option("--dir", dir, "shm directory (default: $FERRY_SHM_DIR or /dev/shm)");
  ls->add_flag("--json", json, "one JSON document instead of the table");
  ls->add_flag("--all", all, "also list files that are neither ferry's nor PyTorch's");
  CLI::App* clean = app.add_subcommand("clean", "remove orphaned segments (owner provably dead)");
  clean->add_option("--dir", dir, "shm directory (default: $FERRY_SHM_DIR or /dev/shm)");
  clean->add_flag("--dry-run", dry_run, "say what would be removed, remove nothing");
  clean->add_flag("--force", force,
                  "also remove unknown segments whose named creator is dead, when only other "
                  "processes' unreadable fds or maps kept them unknown");
  clean->add_option("--older-than", older_text,
                    "only segments not modified for this long: 30s, 10m, 2h, 1d");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }

  const Style style = make_style();
  try {
    if (ls->parsed()) return run_ls(dir, json, all, style);
    if (clean->parsed()) {
      ferry::ShmCleanOptions opt;
      opt.dir = dir;
      opt.dry_run = dry_run;
      opt.force = force;
      if (!older_text.empty()) opt.older_than = ferry::parse_duration(older_text);
      return run_clean(opt);
    }
    ferry::ShmCheckOptions opt;
    opt.dir = dir;
    opt.workers = workers;
    opt.need_bytes = need_text.empty() ? 0 : ferry::parse_bytes(need_text);
    if (!need_text.empty() && opt.need_bytes == 0) {
      throw ferry::Error(ferry::Errc::invalid_argument, "--need must be more than 0 bytes");
    }
    opt.reserve = !no_reserve;
    opt.cuda = !no_cuda;
    return run_check(opt, json, style);
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry-shm: %s\n", e.detail().c_str());
    return kExitBadInput;
  }
}
