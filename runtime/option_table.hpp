// The options of a pool and of a host, declared once (docs/options.md): each one's name in C++,
// Python and on both command lines, its type, unit, range, default and one line of help, and
// where it applies. `ferry run`'s and `ferry host`'s flags, `python3 -m ferry host`'s, the range
// checks of PoolOptions in C++ and in Python, and docs/options.md are made from it; a test
// (test/python/test_options.py) fails when any of them differs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// Where an option applies: bits of OptionSpec::uses.
enum OptionUse : unsigned {
  kUsePool = 1,   // ferry.Pool's keyword (and PoolOptions in C++)
  kUseServe = 2,  // python3 -m ferry host, and ferry.serve_host's keyword
  kUseHost = 4,   // ferry host
  kUseRun = 8,    // ferry run
};

enum class OptionKind {
  count,    // a whole number in [least, most]
  seconds,  // Python: seconds (float); on a command line: milliseconds (the flag ends in -ms)
  flag,     // on or off (Python: a bool; a command line: on|off)
  text,     // a string: a path, an address, a name
  list,     // comma-separated on a command line; a list in Python
  choice,   // one of `choices`
};

struct OptionSpec {
  const char* key;     // the option's one name in these docs and messages
  const char* python;  // ferry.Pool's / serve_host's keyword ("" where it has none)
  const char* cli;     // the flag on both command lines ("" where none)
  OptionKind kind;
  double least, most;    // the range (count: as given; seconds: in milliseconds)
  const char* fallback;  // the default, in words as the docs give it
  const char* help;      // one line
  unsigned uses;
  const char* choices = "";  // choice: "auto|fork|spawn"
};

// Every option, in the order the docs list them.
const std::vector<OptionSpec>& option_table();
// The option `key`; Error(invalid_argument) for a key not in the table (a bug of ferry's).
const OptionSpec& option(std::string_view key);
// Error(invalid_argument) "PYTHON=VALUE: give LEAST to MOST ..." (the flag's name where the
// option has no keyword) where `value` is outside the option's range; returns `value`.
std::int64_t checked(const OptionSpec& o, std::int64_t value);

}  // namespace ferry
