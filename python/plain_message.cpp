#include "python/plain_message.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "ipc/error.hpp"
#include "python/storages.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// The payload: kPlainMagic, kVersion, then one item, each a tag and what the tag says follows
// (integers little-endian, as this process writes them: both ends are one build on one machine).
constexpr std::uint8_t kVersion = 1;
enum Tag : char {
  kNone = 'N',
  kTrue = 'T',
  kFalse = 'F',
  kInt = 'i',        // int64
  kFloat = 'd',      // double
  kComplex = 'c',    // double, double
  kStr = 's',        // u32 length, UTF-8
  kBytes = 'b',      // u32 length, bytes
  kByteArray = 'y',  // u32 length, bytes
  kTuple = 't',      // u32 count, items
  kList = 'l',       // u32 count, items
  kDict = 'm',       // u32 count, key and value each
  kTensor = 'X',     // u32 base, u8 dtype, i64 offset, u8 rank, i64 sizes[rank], strides[rank]
  kSameTensor = 'R'  // u32: the tensor of that number (in order of kTensor) once more
};
constexpr int kMaxRank = 12;

class Encoder {
 public:
  explicit Encoder(std::size_t max_bases) : max_bases_(max_bases) {
    out_.payload.push_back(static_cast<char>(kPlainMagic));
    out_.payload.push_back(static_cast<char>(kVersion));
  }

  // False: `o` is not plain (nothing is then sent this way).
  bool item(PyObject* o, int depth) {
    PyTypeObject* type = Py_TYPE(o);
    if (o == Py_None) return tag(kNone);
    if (type == &PyBool_Type) return tag(o == Py_True ? kTrue : kFalse);
    if (type == &PyLong_Type) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
      if (overflow != 0) return false;  // pickle keeps any size
      return tag(kInt) && put(static_cast<std::int64_t>(v));
    }
    if (type == &PyFloat_Type) return tag(kFloat) && put(PyFloat_AS_DOUBLE(o));
    if (type == &PyComplex_Type) {
      const Py_complex c = PyComplex_AsCComplex(o);
      return tag(kComplex) && put(c.real) && put(c.imag);
    }
    if (type == &PyUnicode_Type) {
      Py_ssize_t n = 0;
      const char* text = PyUnicode_AsUTF8AndSize(o, &n);
      if (!text) {  // a lone surrogate has no UTF-8: pickle's own escape carries it
        PyErr_Clear();
        return false;
      }
      return tag(kStr) && bytes(text, n);
    }
    if (type == &PyBytes_Type)
      return tag(kBytes) && bytes(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
    if (type == &PyByteArray_Type) {
      return tag(kByteArray) && bytes(PyByteArray_AS_STRING(o), PyByteArray_GET_SIZE(o));
    }
    if (THPVariable_CheckExact(o)) return tensor(o);
    if (depth >= kMaxDepth) return false;
    if (type == &PyTuple_Type) {
      const Py_ssize_t n = PyTuple_GET_SIZE(o);
      if (!(tag(kTuple) && count(n))) return false;
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (!item(PyTuple_GET_ITEM(o, i), depth + 1)) return false;
      }
      return true;
    }
    // A list or dict met twice is one object on arrival through pickle (and a cycle is one
    // through itself): those are pickled.
    if (type == &PyList_Type) {
      if (!containers_.insert(o).second) return false;
      const Py_ssize_t n = PyList_GET_SIZE(o);
      if (!(tag(kList) && count(n))) return false;
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(o); ++i) {  // the size as it is now
        if (!item(PyList_GET_ITEM(o, i), depth + 1)) return false;
      }
      return PyList_GET_SIZE(o) == n;
    }
    if (type == &PyDict_Type) {
      if (!containers_.insert(o).second) return false;
      const Py_ssize_t n = PyDict_GET_SIZE(o);
      if (!(tag(kDict) && count(n))) return false;
      Py_ssize_t pos = 0;
      PyObject* key = nullptr;
      PyObject* value = nullptr;
      Py_ssize_t seen = 0;
      while (PyDict_Next(o, &pos, &key, &value)) {
        if (!item(key, depth + 1) || !item(value, depth + 1)) return false;
        ++seen;
      }
      return seen == n;
    }
    return false;
  }

  PlainMessage take() { return std::move(out_); }

 private:
  bool tag(Tag t) {
    out_.payload.push_back(static_cast<char>(t));
    return true;
  }
  template <class T>
  bool put(T v) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    out_.payload.append(raw, sizeof(T));
    return true;
  }
  bool count(Py_ssize_t n) {
    if (n < 0 || static_cast<std::uint64_t>(n) > UINT32_MAX) return false;
    return put(static_cast<std::uint32_t>(n));
  }
  bool bytes(const char* data, Py_ssize_t n) {
    if (!count(n)) return false;
    out_.payload.append(data, static_cast<std::size_t>(n));
    return true;
  }

  bool tensor(PyObject* o) {
    if (const auto it = tensors_.find(o); it != tensors_.end()) {
      return tag(kSameTensor) && put(it->second);
    }
    const at::Tensor& t = THPVariable_Unpack(o);
    // Grad flags and leaves are the pickler's to keep (ferry/_pickle.py), as are tensors ferry
    // does not carry by their storage.
    if (t.requires_grad() || !carried_by_storage(t)) return false;
    const at::Tensor data = prepared_for_storage(t);
    const StorageKey key = key_of(data.storage());
    auto base = bases_.find(key);
    if (base == bases_.end()) {
      if (out_.bases.size() >= max_bases_) return false;  // no room: the pickler sends by value
      out_.bases.push_back(storage_base(data));
      base = bases_.emplace(key, static_cast<std::uint32_t>(out_.bases.size() - 1)).first;
    }
    tag(kTensor);
    put(base->second);
    put(static_cast<std::uint8_t>(data.scalar_type()));
    put(static_cast<std::int64_t>(data.storage_offset()));
    put(static_cast<std::uint8_t>(data.dim()));
    for (const std::int64_t s : data.sizes()) put(s);
    for (const std::int64_t s : data.strides()) put(s);
    tensors_.emplace(o, static_cast<std::uint32_t>(tensors_.size()));
    return true;
  }

  std::size_t max_bases_;
  PlainMessage out_;
  std::unordered_set<PyObject*> containers_;
  std::unordered_map<PyObject*, std::uint32_t> tensors_;  // in order of first appearance
  std::map<StorageKey, std::uint32_t> bases_;
};

class Decoder {
 public:
  Decoder(const char* data, std::size_t size, const std::vector<at::Tensor>& bases)
      : at_(data), end_(data + size), bases_(bases) {}

  py::object all() {
    const auto magic = get<std::uint8_t>("the magic byte");
    const auto version = get<std::uint8_t>("the version");
    if (magic != kPlainMagic || version != kVersion) {
      fail("it begins " + std::to_string(magic) + ", " + std::to_string(version) +
           ", not a plain message of version " + std::to_string(kVersion));
    }
    py::object o = item(0);
    if (at_ != end_) fail(std::to_string(end_ - at_) + " bytes follow the object");
    return o;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(Errc::bad_record, "a plain message is malformed (" + why +
                                      "); the message was not made by this ferry");
  }

  template <class T>
  T get(const char* what) {
    if (static_cast<std::size_t>(end_ - at_) < sizeof(T))
      fail("it ends inside " + std::string(what));
    T v;
    std::memcpy(&v, at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }

  const char* span(std::uint32_t n, const char* what) {
    if (static_cast<std::size_t>(end_ - at_) < n) fail("it ends inside " + std::string(what));
    const char* p = at_;
    at_ += n;
    return p;
  }

  static py::object checked(PyObject* made) {
    if (!made) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(made);
  }

  py::object item(int depth) {
    const char t = get<char>("a tag");
    switch (t) {
      case kNone:
        return py::none();
      case kTrue:
        return py::bool_(true);
      case kFalse:
        return py::bool_(false);
      case kInt:
        return checked(PyLong_FromLongLong(get<std::int64_t>("an int")));
      case kFloat:
        return checked(PyFloat_FromDouble(get<double>("a float")));
      case kComplex: {
        const double re = get<double>("a complex");
        return checked(PyComplex_FromDoubles(re, get<double>("a complex")));
      }
      case kStr: {
        const auto n = get<std::uint32_t>("a str's length");
        const char* p = span(n, "a str");
        PyObject* s = PyUnicode_DecodeUTF8(p, n, "strict");
        if (!s) {
          PyErr_Clear();
          fail("a str is not UTF-8");
        }
        return py::reinterpret_steal<py::object>(s);
      }
      case kBytes: {
        const auto n = get<std::uint32_t>("a bytes' length");
        return checked(PyBytes_FromStringAndSize(span(n, "a bytes"), n));
      }
      case kByteArray: {
        const auto n = get<std::uint32_t>("a bytearray's length");
        return checked(PyByteArray_FromStringAndSize(span(n, "a bytearray"), n));
      }
      case kTuple:
      case kList: {
        if (depth >= kMaxDepth) fail("containers nest deeper than " + std::to_string(kMaxDepth));
        const auto n = get<std::uint32_t>("a count");
        // Each item takes a byte at least: a count beyond what is left is no message of ours,
        // and must not allocate first.
        if (n > static_cast<std::size_t>(end_ - at_)) fail("a count of " + std::to_string(n));
        py::object seq = checked(t == kTuple ? PyTuple_New(n) : PyList_New(n));
        for (std::uint32_t i = 0; i < n; ++i) {
          PyObject* x = item(depth + 1).release().ptr();
          if (t == kTuple) {
            PyTuple_SET_ITEM(seq.ptr(), i, x);
          } else {
            PyList_SET_ITEM(seq.ptr(), i, x);
          }
        }
        return seq;
      }
      case kDict: {
        if (depth >= kMaxDepth) fail("containers nest deeper than " + std::to_string(kMaxDepth));
        const auto n = get<std::uint32_t>("a count");
        if (n > static_cast<std::size_t>(end_ - at_)) fail("a count of " + std::to_string(n));
        py::object d = checked(PyDict_New());
        for (std::uint32_t i = 0; i < n; ++i) {
          py::object k = item(depth + 1);
          py::object v = item(depth + 1);
          if (PyDict_SetItem(d.ptr(), k.ptr(), v.ptr()) != 0) throw py::error_already_set();
        }
        return d;
      }
      case kTensor:
        return tensor();
      case kSameTensor: {
        const auto i = get<std::uint32_t>("a tensor's number");
        if (i >= made_.size()) fail("tensor " + std::to_string(i) + " before it was made");
        return made_[i];
      }
      default:
        fail("tag " + std::to_string(static_cast<unsigned char>(t)));
    }
  }

  py::object tensor() {
    const auto base = get<std::uint32_t>("a tensor's base");
    const auto dtype = get<std::uint8_t>("a tensor's dtype");
    const auto offset = get<std::int64_t>("a tensor's offset");
    const auto rank = get<std::uint8_t>("a tensor's rank");
    if (base >= bases_.size()) {
      fail("base " + std::to_string(base) + " of " + std::to_string(bases_.size()));
    }
    if (dtype >= static_cast<int>(at::ScalarType::NumOptions)) {
      fail("dtype " + std::to_string(dtype));
    }
    if (rank > kMaxRank || offset < 0) {
      fail("rank " + std::to_string(rank) + ", offset " + std::to_string(offset));
    }
    std::int64_t sizes[kMaxRank];
    std::int64_t strides[kMaxRank];
    for (int d = 0; d < rank; ++d) sizes[d] = get<std::int64_t>("a tensor's sizes");
    for (int d = 0; d < rank; ++d) strides[d] = get<std::int64_t>("a tensor's strides");
    const at::Tensor& b = adopted(base);
    at::Tensor view;
    try {
      view = at::empty({0}, b.options().dtype(static_cast<at::ScalarType>(dtype)))
                 .set_(b.storage(), offset, at::IntArrayRef(sizes, rank),
                       at::IntArrayRef(strides, rank));
    } catch (const c10::Error& e) {
      fail(std::string("a tensor's view does not fit its storage: ") + e.what_without_backtrace());
    }
    made_.push_back(checked(THPVariable_Wrap(std::move(view))));
    return made_.back();
  }

  const at::Tensor& adopted(std::uint32_t i) {
    if (adopted_.empty()) adopted_.resize(bases_.size());
    if (!adopted_[i].defined()) adopted_[i] = adopt(bases_[i]);
    return adopted_[i];
  }

  const char* at_;
  const char* end_;
  const std::vector<at::Tensor>& bases_;
  std::vector<at::Tensor> adopted_;
  std::vector<py::object> made_;
};

}  // namespace

std::optional<PlainMessage> encode_plain(py::handle obj, std::size_t max_bases) {
  Encoder e(max_bases);
  if (!e.item(obj.ptr(), 0)) return std::nullopt;
  return e.take();
}

bool is_plain(const char* payload, std::size_t size) noexcept {
  return size > 0 && static_cast<std::uint8_t>(payload[0]) == kPlainMagic;
}

py::object decode_plain(const char* payload, std::size_t size,
                        const std::vector<at::Tensor>& bases) {
  return Decoder(payload, size, bases).all();
}

void bind_plain_message(py::module_& m) {
  m.def(
      "encode_plain",
      [](py::handle obj, std::size_t max_bases) -> py::object {
        std::optional<PlainMessage> p = encode_plain(obj, max_bases);
        if (!p) return py::none();
        py::list bases;
        for (at::Tensor& b : p->bases) bases.append(std::move(b));
        return py::make_tuple(py::bytes(p->payload), std::move(bases));
      },
      py::arg("obj"), py::arg("max_bases"),
      "(payload, bases) for a plain object (tensors and plain data), or None: pickle it");
  m.def(
      "decode_plain",
      [](const py::bytes& payload, const std::vector<at::Tensor>& bases) {
        char* data = nullptr;
        Py_ssize_t size = 0;
        if (PyBytes_AsStringAndSize(payload.ptr(), &data, &size) != 0) {
          throw py::error_already_set();
        }
        return decode_plain(data, static_cast<std::size_t>(size), bases);
      },
      py::arg("payload"), py::arg("bases"), "the object encode_plain() encoded");
  m.attr("PLAIN_MAGIC") = kPlainMagic;
}

}  // namespace ferry::python
