#include "tools/task_inputs.hpp"

#include <utility>

#include "runtime/worker_protocol.hpp"
#include "tools/bad_input.hpp"
#include "tools/torch_save_file.hpp"

namespace ferry::tools {

const char* const kInputShapes =
    "a tensor (one task), or a list, tuple or dict with one task per item, each item a tensor or "
    "a list, tuple or dict of tensors (that task's inputs, in order)";

namespace {

// A value as Python names its type: "a str", "an empty list".
std::string python_kind(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isBool()) return "a bool";
  if (v.isInt()) return "an int";
  if (v.isDouble()) return "a float";
  if (v.isString()) return "a str";
  if (v.isTensor()) return "a tensor";
  if (v.isList()) return v.toListRef().empty() ? "an empty list" : "a list";
  if (v.isTuple()) return v.toTupleRef().elements().empty() ? "an empty tuple" : "a tuple";
  if (v.isGenericDict()) return v.toGenericDict().empty() ? "an empty dict" : "a dict";
  return "a " + v.tagKind();
}

// The items of a list or tuple.
std::vector<c10::IValue> items_of(const c10::IValue& v) {
  if (v.isList()) {
    const auto items = v.toListRef();
    return std::vector<c10::IValue>(items.begin(), items.end());
  }
  const auto& items = v.toTupleRef().elements();
  return std::vector<c10::IValue>(items.begin(), items.end());
}

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  std::vector<ferry::Tensors> tasks(const c10::IValue& v) {
    std::vector<ferry::Tensors> out;
    if (v.isTensor()) {
      out.push_back({v.toTensor()});
    } else if (v.isList() || v.isTuple()) {
      const std::vector<c10::IValue> items = items_of(v);
      for (std::size_t i = 0; i < items.size(); ++i) {
        out.push_back(task(items[i], "[" + std::to_string(i) + "]"));
      }
    } else if (v.isGenericDict()) {
      for (const auto& item : v.toGenericDict()) {
        out.push_back(task(item.value(), key(item.key(), "")));
      }
    } else {
      refuse(v, "");
    }
    return out;
  }

 private:
  // One task's tensors from `v`, found at `where`.
  ferry::Tensors task(const c10::IValue& v, const std::string& where) {
    ferry::Tensors t;
    if (v.isTensor()) {
      t.push_back(v.toTensor());
    } else if ((v.isList() && !v.toListRef().empty()) ||
               (v.isTuple() && !v.toTupleRef().elements().empty())) {
      const std::vector<c10::IValue> items = items_of(v);
      for (std::size_t i = 0; i < items.size(); ++i) {
        t.push_back(tensor(items[i], where + "[" + std::to_string(i) + "]"));
      }
    } else if (v.isGenericDict() && !v.toGenericDict().empty()) {
      for (const auto& item : v.toGenericDict()) {
        t.push_back(tensor(item.value(), key(item.key(), where)));
      }
    } else {
      refuse(v, where);
    }
    if (t.size() > protocol::kMaxTensorsPerTask) {
      throw BadInput("--input '" + path_ + "' holds " + std::to_string(t.size()) +
                     " tensors for the task at " + where + "; a task takes at most " +
                     std::to_string(protocol::kMaxTensorsPerTask) +
                     " (stack or concatenate them, or split the task)");
    }
    return t;
  }

  at::Tensor tensor(const c10::IValue& v, const std::string& where) {
    if (!v.isTensor()) refuse(v, where);
    return v.toTensor();
  }

  // Where a dict's item is: "['x']". Its key must be a str.
  std::string key(const c10::IValue& k, const std::string& where) {
    if (!k.isString()) {
      throw BadInput("--input '" + path_ + "' holds a dict with " + python_kind(k) + " key" +
                     (where.empty() ? "" : " at " + where) +
                     "; a dict's keys must be str. It takes " + kInputShapes);
    }
    return where + "['" + k.toStringRef() + "']";
  }

  [[noreturn]] void refuse(const c10::IValue& v, const std::string& where) {
    throw BadInput("--input '" + path_ + "' holds " + python_kind(v) +
                   (where.empty() ? "" : " at " + where) + "; it takes " + kInputShapes);
  }

  std::string path_;
};

}  // namespace

std::vector<ferry::Tensors> load_inputs(const std::string& path) {
  return Reader(path).tasks(read_torch_save(path));
}

}  // namespace ferry::tools
