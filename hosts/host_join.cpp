#include "hosts/host_join.hpp"

#include <nlohmann/json.hpp>

#include <cstring>
#include <exception>
#include <thread>

#include "ipc/log.hpp"

namespace ferry::hosts {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

constexpr const char* kJobKey = "ferry/job";
constexpr const char* kCountKey = "ferry/hosts";
constexpr const char* kHeadRefused = "head-refused";  // a host's "proof" for a head that failed
constexpr const char* kDeclined = "declined: ";       // a host's "proof" when it cannot serve
constexpr std::size_t kMaxReason = 400;               // of a declining host's reason, in a log
constexpr milliseconds kPoll{20};

std::string key(std::uint64_t n, const char* step) {
  return "ferry/join/" + std::to_string(n) + "/" + step;
}
std::string context(const std::string& job, std::uint64_t n) {
  return job + "/" + std::to_string(n);
}
// The head's answer covers the setup too, so a setup changed in the store fails it; the context
// holds no newline, so the two parts cannot be shifted into each other.
std::string head_context(const std::string& ctx, const std::string& setup) {
  return ctx + "\n" + setup;
}

std::string hex(const std::uint8_t* p, std::size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}
template <std::size_t N>
bool unhex(const std::string& s, std::array<std::uint8_t, N>& out) {
  if (s.size() != 2 * N) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}

void put(c10d::Store& store, const std::string& k, const std::string& v) {
  store.set(k, std::vector<std::uint8_t>(v.begin(), v.end()));
}

// The value of `k` once it is set; Error(timeout) naming `waiting_for` otherwise.
std::string take(c10d::Store& store, const std::string& k, milliseconds timeout,
                 const std::string& waiting_for) {
  try {
    store.wait({k}, timeout);
    const std::vector<std::uint8_t> v = store.get(k);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    throw Error(Errc::timeout, "waiting " + std::to_string(timeout.count()) + " ms for " +
                                   waiting_for + ": " + failure_text(e));
  }
}

}  // namespace

std::string workers_setup(const std::string& workers, const std::string& extra_json) {
  json setup = json::parse(extra_json);
  setup["workers"] = workers;
  return setup.dump();
}

void require_workers(const std::string& setup, const std::string& workers) {
  std::string theirs;
  try {
    theirs = json::parse(setup).at("workers").get<std::string>();
  } catch (const std::exception&) {
    throw Error(Errc::handshake, "the head's setup is not one of ferry's (is it a newer ferry?)");
  }
  if (theirs == workers) return;
  const std::string how = theirs == "python"  ? "python3 -m ferry host"
                          : theirs == "ferry" ? "ferry host"
                                              : "a host of kind '" + theirs + "'";
  throw Error(Errc::handshake, "the head's job needs " + theirs + " workers and this host runs " +
                                   workers + " ones: join it with `" + how + "`");
}

HeadDoor::HeadDoor(c10::intrusive_ptr<c10d::Store> store, Secret secret, LinkOptions link_options,
                   std::string setup)
    : store_(std::move(store)),
      secret_(std::move(secret)),
      link_options_(std::move(link_options)),
      setup_(std::move(setup)) {
  const Challenge id = make_challenge();
  job_ = hex(id.data(), 16);
  put(*store_, kJobKey, job_);
  store_->add(kCountKey, 0);  // the counter exists before the first host looks
}

std::optional<Joined> HeadDoor::admit(milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const milliseconds step = link_options_.join_timeout;
  for (;;) {
    if (static_cast<std::uint64_t>(store_->add(kCountKey, 0)) < next_) {
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(kPoll);
      continue;
    }
    const std::uint64_t n = next_++;
    const std::string ctx = context(job_, n);
    HostInfo info;
    std::string why;
    try {
      const json hello = json::parse(
          take(*store_, key(n, "hello"), step, "host " + std::to_string(n) + "'s hello"));
      info.name = hello.at("name").get<std::string>();
      info.address = hello.at("address").get<std::string>();
      info.devices = hello.at("devices").get<std::vector<std::string>>();
      info.capacity = hello.at("capacity").get<std::size_t>();
      if (info.capacity < 1 || info.capacity > kMaxHostCapacity) {
        throw Error(Errc::handshake, "a capacity of " + std::to_string(info.capacity) +
                                         " tasks, outside 1.." + std::to_string(kMaxHostCapacity));
      }
      Challenge theirs{};
      if (!unhex(hello.at("challenge").get<std::string>(), theirs)) {
        throw Error(Errc::handshake, "a malformed challenge");
      }
      const Challenge mine = make_challenge();
      const Proof answer = prove(secret_, Role::head, head_context(ctx, setup_), theirs, mine);
      put(*store_, key(n, "head"),
          json{{"challenge", hex(mine.data(), mine.size())},
               {"proof", hex(answer.data(), answer.size())},
               {"setup", setup_}}
              .dump());
      const std::string said = take(*store_, key(n, "proof"), step, "its proof");
      Proof proof{};
      if (said == kHeadRefused) {
        why = "it found the head's answer wrong: the head's secret differs from the host's";
      } else if (said.rfind(kDeclined, 0) == 0) {
        why = "it cannot serve this job: " + said.substr(std::strlen(kDeclined), kMaxReason);
      } else if (!unhex(said, proof) || !verify(secret_, Role::host, ctx, mine, theirs, proof)) {
        why = "its answer is wrong: it does not hold this job's secret";
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    const std::string who = "host " + std::to_string(n) + " (" +
                            (info.name.empty() ? "unnamed" : info.name) + " at " +
                            (info.address.empty() ? "unknown address" : info.address) + ")";
    if (!why.empty()) {
      ++refused_;
      try {
        put(*store_, key(n, "verdict"), "refused");
      } catch (const std::exception&) {
        // Only a courtesy to the host, which times out without it; the refusal stands.
      }
      log().warn("refused {}: {}", who, why);
      continue;
    }
    put(*store_, key(n, "verdict"), "admitted");
    Joined j;
    j.number = n;
    j.host = std::move(info);
    try {
      j.link =
          std::make_unique<HostLink>(store_, "ferry/link/" + std::to_string(n), 0, link_options_);
    } catch (const Error& e) {
      ++refused_;
      log().warn("admitted {}, but its link failed: {}", who, e.detail());
      continue;
    }
    log().info("admitted {}", who);
    return j;
  }
}

Joined join_head(const c10::intrusive_ptr<c10d::Store>& store, const Secret& secret, HostInfo self,
                 LinkOptions link_options, milliseconds timeout, const AcceptSetup& accept) {
  const std::string job = take(*store, kJobKey, timeout, "the head's job id");
  const auto n = static_cast<std::uint64_t>(store->add(kCountKey, 1));
  const std::string ctx = context(job, n);
  const Challenge mine = make_challenge();
  put(*store, key(n, "hello"),
      json{{"name", self.name},
           {"address", self.address},
           {"devices", self.devices},
           {"capacity", self.capacity},
           {"challenge", hex(mine.data(), mine.size())}}
          .dump());
  const std::string said = take(*store, key(n, "head"), timeout, "the head's answer");
  Challenge theirs{};
  Proof head_proof{};
  std::string setup;
  bool head_ok = false;
  try {
    const json head = json::parse(said);
    setup = head.at("setup").get<std::string>();
    head_ok = unhex(head.at("challenge").get<std::string>(), theirs) &&
              unhex(head.at("proof").get<std::string>(), head_proof) &&
              verify(secret, Role::head, head_context(ctx, setup), mine, theirs, head_proof);
  } catch (const std::exception&) {
    head_ok = false;
  }
  if (!head_ok) {
    put(*store, key(n, "proof"), kHeadRefused);
    throw Error(Errc::handshake,
                "the head behind this store does not hold this job's secret (its answer to "
                "this host's challenge is wrong, or the job's setup was altered in the store): "
                "nothing was sent to it; check that the head and this host use the same secret "
                "file");
  }
  if (accept) {
    try {
      accept(setup);
    } catch (const std::exception& e) {
      put(*store, key(n, "proof"), kDeclined + failure_text(e));
      throw;
    }
  }
  const Proof answer = prove(secret, Role::host, ctx, theirs, mine);
  put(*store, key(n, "proof"), hex(answer.data(), answer.size()));
  const std::string verdict = take(*store, key(n, "verdict"), timeout, "the head's verdict");
  if (verdict != "admitted") {
    throw Error(Errc::handshake,
                "the head refused this host: its secret differs from the head's; give every "
                "host the head's secret file (or FERRY_SECRET)");
  }
  Joined j;
  j.number = n;
  j.host = std::move(self);
  j.setup = std::move(setup);
  j.link = std::make_unique<HostLink>(store, "ferry/link/" + std::to_string(n), 1,
                                      std::move(link_options));
  return j;
}

}  // namespace ferry::hosts
