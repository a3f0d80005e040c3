#include "tools/pickle_compat.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::tools {
namespace {

// How an opcode's argument follows it in the stream (Python's pickletools names them).
enum class Arg { none, fixed, len1, len4, line, two_lines };

struct Shape {
  Arg arg;
  std::size_t bytes = 0;  // for Arg::fixed
};

// The opcodes of protocols 0 to 2, and 3's bytes; nullopt for any other (protocol 4's frames, say).
std::optional<Shape> shape_of(unsigned char op) {
  static const std::pair<std::string_view, Shape> kShapes[] = {
      {"(.012NRabd}elo]st)uQ\x81\x85\x86\x87\x88\x89", {Arg::none}},
      {"Khq\x80\x82", {Arg::fixed, 1}},
      {"M\x83", {Arg::fixed, 2}},
      {"Jjr\x84", {Arg::fixed, 4}},
      {"G", {Arg::fixed, 8}},
      {"UC\x8a", {Arg::len1}},
      {"TXB\x8b", {Arg::len4}},
      {"ILFSVPgp", {Arg::line}},
      {"ci", {Arg::two_lines}},
  };
  for (const auto& [ops, shape] : kShapes) {
    if (ops.find(static_cast<char>(op)) != std::string_view::npos) return shape;
  }
  return std::nullopt;
}

// What the rewrite needs to know of a value on the unpickler's stack: where the opcodes that made
// it begin, and whether it is one of the things it rewrites.
enum class Kind { mark, value, ordered_dict_class, empty_tuple, ordered_dict };
struct Item {
  std::size_t start;
  Kind kind;
};

// Bytes [at, at + len) of the pickle replaced by `with`.
struct Edit {
  std::size_t at, len;
  std::string with;
};

class Rewrite {
 public:
  explicit Rewrite(const std::string& p) : p_(p) {}

  // The edits, or nullopt where the pickle holds something this does not follow.
  std::optional<std::vector<Edit>> edits() {
    for (std::size_t at = 0; at < p_.size();) {
      const auto op = static_cast<unsigned char>(p_[at]);
      const std::optional<std::size_t> next = end_of(at);
      if (!next || !step(op, at, *next)) return std::nullopt;
      if (op == '.') return std::move(edits_);
      at = *next;
    }
    return std::nullopt;  // no STOP
  }

  // Whether every memo entry read outside the dropped bytes was stored outside them too.
  bool memo_intact(const std::vector<std::pair<std::size_t, std::size_t>>& dropped) const {
    auto inside = [&](std::size_t at) {
      auto it = std::upper_bound(dropped.begin(), dropped.end(), std::make_pair(at, SIZE_MAX));
      return it != dropped.begin() && at < std::prev(it)->second;
    };
    for (const auto& [at, slot] : gets_) {
      if (inside(at)) continue;
      const auto puts = puts_.find(slot);
      if (puts == puts_.end()) return false;
      auto put = std::lower_bound(puts->second.begin(), puts->second.end(), at);
      if (put == puts->second.begin() || inside(*std::prev(put))) return false;
    }
    return true;
  }

 private:
  // Where the opcode at `at` and its argument end; nullopt past the end or for an unknown opcode.
  std::optional<std::size_t> end_of(std::size_t at) const {
    const std::optional<Shape> s = shape_of(static_cast<unsigned char>(p_[at]));
    if (!s) return std::nullopt;
    std::size_t end = at + 1;
    switch (s->arg) {
      case Arg::none:
        break;
      case Arg::fixed:
        end += s->bytes;
        break;
      case Arg::len1:
        if (end + 1 > p_.size()) return std::nullopt;
        end += 1 + static_cast<unsigned char>(p_[end]);
        break;
      case Arg::len4:
        if (end + 4 > p_.size()) return std::nullopt;
        end += 4 + little_endian(end, 4);
        break;
      case Arg::line:
      case Arg::two_lines:
        for (int lines = s->arg == Arg::line ? 1 : 2; lines > 0; --lines) {
          end = p_.find('\n', end);
          if (end == std::string::npos) return std::nullopt;
          ++end;
        }
        break;
    }
    if (end > p_.size()) return std::nullopt;
    return end;
  }

  std::size_t little_endian(std::size_t at, std::size_t bytes) const {
    std::size_t v = 0;
    for (std::size_t i = bytes; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(p_[at + i]);
    return v;
  }

  // The memo slot a PUT or GET at `at` names.
  std::size_t slot(unsigned char op, std::size_t at, std::size_t end) const {
    if (op == 'q' || op == 'h') return static_cast<unsigned char>(p_[at + 1]);
    if (op == 'r' || op == 'j') return little_endian(at + 1, 4);
    return std::strtoull(p_.substr(at + 1, end - at - 2).c_str(), nullptr, 10);
  }

  std::optional<Item> pop() {
    if (stack_.empty() || stack_.back().kind == Kind::mark) return std::nullopt;
    Item top = stack_.back();
    stack_.pop_back();
    return top;
  }

  // Pops up to and including the topmost MARK, and says where that MARK was.
  std::optional<std::size_t> pop_mark() {
    while (!stack_.empty() && stack_.back().kind != Kind::mark) stack_.pop_back();
    if (stack_.empty()) return std::nullopt;
    const std::size_t at = stack_.back().start;
    stack_.pop_back();
    return at;
  }

  // Follows the opcode at `at` (its argument ends at `end`) on the stack; false where the stack
  // does not hold what it takes.
  bool step(unsigned char op, std::size_t at, std::size_t end) {
    switch (op) {
      case 0x80:  // PROTO
      case '.':   // STOP
        return true;
      case '(':
        stack_.push_back({at, Kind::mark});
        return true;
      case 'q':
      case 'r':
      case 'p': {  // PUT: the top of the stack into a memo slot
        if (stack_.empty()) return false;
        const std::size_t s = slot(op, at, end);
        puts_[s].push_back(at);
        const Kind k = stack_.back().kind;
        memo_[s] = k == Kind::ordered_dict_class || k == Kind::empty_tuple ? k : Kind::value;
        return true;
      }
      case 'h':
      case 'j':
      case 'g': {  // GET
        const std::size_t s = slot(op, at, end);
        gets_.emplace_back(at, s);
        const auto it = memo_.find(s);
        stack_.push_back({at, it == memo_.end() ? Kind::value : it->second});
        return true;
      }
      case 'c': {  // GLOBAL
        const bool od = p_.compare(at + 1, end - at - 1, "collections\nOrderedDict\n") == 0;
        stack_.push_back({at, od ? Kind::ordered_dict_class : Kind::value});
        return true;
      }
      case ')':
        stack_.push_back({at, Kind::empty_tuple});
        return true;
      case '0':  // POP: a value, or a MARK
        if (stack_.empty()) return false;
        stack_.pop_back();
        return true;
      case '1':  // POP_MARK
        return pop_mark().has_value();
      case '2':  // DUP
        if (stack_.empty()) return false;
        stack_.push_back({at, Kind::value});
        return true;
      case 't':
      case 'l':
      case 'd':
      case 'i':
      case 'o': {  // a value from the items above a MARK
        const std::optional<std::size_t> mark = pop_mark();
        if (!mark) return false;
        stack_.push_back({*mark, Kind::value});
        return true;
      }
      case 'e':
      case 'u':  // APPENDS, SETITEMS: into the list or dict below the MARK
        return pop_mark().has_value() && !stack_.empty();
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
        std::optional<Item> first;
        for (int n = op - 0x84; n > 0; --n) {
          first = pop();
          if (!first) return false;
        }
        stack_.push_back({first->start, Kind::value});
        return true;
      }
      case 'a':  // APPEND
        return append(at);
      case 'Q': {  // BINPERSID
        const std::optional<Item> id = pop();
        if (!id) return false;
        stack_.push_back({id->start, Kind::value});
        return true;
      }
      case 'R':
      case 0x81:  // REDUCE, NEWOBJ
        return call(op, at);
      case 's':  // SETITEM
        return set_item(at);
      case 'b':  // BUILD
        return build(at);
      default:  // the opcodes that push one value made from their argument alone
        stack_.push_back({at, Kind::value});
        return true;
    }
  }

  // REDUCE or NEWOBJ: collections.OrderedDict() becomes an empty dict (its items follow).
  bool call(unsigned char op, std::size_t at) {
    const std::optional<Item> args = pop();
    const std::optional<Item> callable = pop();
    if (!args || !callable) return false;
    if (op == 'R' && callable->kind == Kind::ordered_dict_class &&
        args->kind == Kind::empty_tuple) {
      edits_.push_back({callable->start, at + 1 - callable->start, "}"});
      stack_.push_back({callable->start, Kind::ordered_dict});
    } else {
      stack_.push_back({callable->start, Kind::value});
    }
    return true;
  }

  // APPEND: MARK before its value, APPENDS in its place.
  bool append(std::size_t at) {
    const std::optional<Item> value = pop();
    if (!value || stack_.empty()) return false;
    edits_.push_back({value->start, 0, "("});
    edits_.push_back({at, 1, "e"});
    return true;
  }

  // SETITEM: MARK before its key, SETITEMS in its place.
  bool set_item(std::size_t at) {
    const std::optional<Item> value = pop();
    const std::optional<Item> key = pop();
    if (!value || !key || stack_.empty()) return false;
    edits_.push_back({key->start, 0, "("});
    edits_.push_back({at, 1, "u"});
    return true;
  }

  // BUILD: on a dict that was an OrderedDict, the state (a state_dict's _metadata) is left out.
  bool build(std::size_t at) {
    const std::optional<Item> state = pop();
    if (!state || stack_.empty()) return false;
    if (stack_.back().kind == Kind::ordered_dict) {
      edits_.push_back({state->start, at + 1 - state->start, ""});
    }
    return true;
  }

  const std::string& p_;
  std::vector<Item> stack_;
  std::vector<Edit> edits_;
  std::map<std::size_t, Kind> memo_;                       // the kinds the rewrite cares for
  std::map<std::size_t, std::vector<std::size_t>> puts_;   // slot: where it is stored, in order
  std::vector<std::pair<std::size_t, std::size_t>> gets_;  // where a slot is read, and which
};

}  // namespace

std::string pickle_for_libtorch(const std::string& pickle) {
  Rewrite rewrite(pickle);
  std::optional<std::vector<Edit>> edits = rewrite.edits();
  if (!edits || edits->empty()) return pickle;
  // In order, a MARK before the value it precedes even where that value is replaced, and the
  // longer of two ranges from one place first: the edits inside a range replaced go with it.
  std::stable_sort(edits->begin(), edits->end(), [](const Edit& a, const Edit& b) {
    if (a.at != b.at) return a.at < b.at;
    if ((a.len == 0) != (b.len == 0)) return a.len == 0;
    return a.len > b.len;
  });
  std::string out;
  out.reserve(pickle.size() + edits->size());
  std::vector<std::pair<std::size_t, std::size_t>> dropped;  // [begin, end) of the bytes replaced
  std::size_t pos = 0;
  for (const Edit& e : *edits) {
    if (e.at < pos) continue;
    out.append(pickle, pos, e.at - pos);
    out += e.with;
    pos = e.at + e.len;
    if (e.len > 0) dropped.emplace_back(e.at, pos);
  }
  out.append(pickle, pos, std::string::npos);
  // A memo entry stored in bytes now gone but read elsewhere: this pickle is not one to rewrite.
  return rewrite.memo_intact(dropped) ? out : pickle;
}

}  // namespace ferry::tools
