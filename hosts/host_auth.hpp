// How the hosts of one job prove to each other that they hold the job's shared secret, without
// sending it (docs/multi-host.md, "The secret").
//
// c10d's TCPStore has no authentication, and a task can be code (TorchScript), so a host gets no
// work, and the head takes no results, before both have proved the secret. Each side sends a
// fresh random challenge through the store and answers the other's with
//   HMAC-SHA256(secret, "ferry-host-v1" | role | context | challenge asked | challenge sent)
// where role is the prover's and context names the join (the job and the host's number). A
// recorded answer is useless for another challenge (fresh on each side), another join (context)
// or the other direction (role): it cannot be replayed or reflected. Nothing is encrypted: the
// network must be trusted not to read or alter payloads; the secret only keeps strangers from
// joining.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::hosts {

inline constexpr std::size_t kChallengeBytes = 32;
inline constexpr std::size_t kProofBytes = 32;  // SHA-256
inline constexpr std::size_t kMinSecretBytes = 16;
inline constexpr const char* kSecretEnv = "FERRY_SECRET";
inline constexpr const char* kSecretFileEnv = "FERRY_SECRET_FILE";

using Challenge = std::array<std::uint8_t, kChallengeBytes>;
using Proof = std::array<std::uint8_t, kProofBytes>;

enum class Role : std::uint8_t { head = 1, host = 2 };

// The job's secret: at least 16 bytes, one trailing newline dropped. Never printed.
class Secret {
 public:
  // From a file only its owner can read or write (mode 0600 or stricter, like ssh's keys).
  // Error(invalid_argument) names the file and what to do: missing, empty, too short, or open to
  // others.
  static Secret from_file(const std::string& path);
  // From the environment variable `name` (read whole, never printed); Error(invalid_argument)
  // when unset, empty or too short.
  static Secret from_env(const char* name = kSecretEnv);
  // From the file `path` when given, else the file FERRY_SECRET_FILE names, else FERRY_SECRET
  // itself; Error(invalid_argument) naming all three when none is there.
  static Secret load(const std::string& path);
  // For tests and callers that hold the bytes already; the same length rule.
  static Secret from_bytes(std::string bytes, const std::string& origin);

  const std::string& bytes() const noexcept { return bytes_; }

 private:
  explicit Secret(std::string bytes) : bytes_(std::move(bytes)) {}
  std::string bytes_;
};

// 32 bytes from the kernel's random source (getrandom); Error(system) if it fails.
Challenge make_challenge();

// The answer of `prover` to the challenge `asked` of its peer, `sent` being its own challenge.
Proof prove(const Secret& secret, Role prover, std::string_view context, const Challenge& asked,
            const Challenge& sent);

// Whether `proof` is the answer `prover` owes, compared in constant time.
bool verify(const Secret& secret, Role prover, std::string_view context, const Challenge& asked,
            const Challenge& sent, const Proof& proof);

}  // namespace ferry::hosts
