// The rewrite of torch.save's pickles for LibTorch 1.13's unpickler (tools/pickle_compat.hpp),
// opcode by opcode (octal escapes: a hex one would take the letters after it). Each pickle below is
// what Python's pickle.dumps(..., protocol=2) writes, and each rewrite reads back the same in
// Python. test/tools/ferry_cli_test.cpp reads real files.
#include "tools/pickle_compat.hpp"

#include <string>

#include "../catch.hpp"

using ferry::tools::pickle_for_libtorch;
using namespace std::string_literals;

TEST_CASE("pickle: a dict of one item gets MARK before its key and SETITEMS for SETITEM",
          "[tools]") {
  // {'a': 1}
  CHECK(pickle_for_libtorch("\200\002}q\000X\001\000\000\000aq\001K\001s."s) ==
        "\200\002}q\000(X\001\000\000\000aq\001K\001u."s);
}

TEST_CASE("pickle: a list of one item gets MARK before it and APPENDS for APPEND", "[tools]") {
  CHECK(pickle_for_libtorch("\200\002]q\000K\001a."s) == "\200\002]q\000(K\001e."s);  // [1]
  // [[1]]: the outer MARK goes before the whole inner list.
  CHECK(pickle_for_libtorch("\200\002]q\000]q\001K\001aa."s) == "\200\002]q\000(]q\001(K\001ee."s);
}

TEST_CASE("pickle: collections.OrderedDict() is an empty dict, and a BUILD on it goes", "[tools]") {
  CHECK(pickle_for_libtorch("\200\002ccollections\nOrderedDict\nq\000)Rq\001."s) ==
        "\200\002}q\001."s);
  // A state_dict's _metadata, set by BUILD, with the dict of one item inside it.
  CHECK(
      pickle_for_libtorch(
          "\200\002ccollections\nOrderedDict\nq\000)Rq\001}q\002X\001\000\000\000mq\003K\001sb."s) ==
      "\200\002}q\001."s);
  // [OrderedDict()]: the MARK of the APPEND stays before the dict that replaced the call.
  CHECK(pickle_for_libtorch("\200\002]q\000ccollections\nOrderedDict\nq\001)Rq\002a."s) ==
        "\200\002]q\000(}q\002e."s);
}

TEST_CASE("pickle: what needs no rewrite, or cannot have one, is returned as it is", "[tools]") {
  const std::string list = "\200\002]q\000(K\001K\002e."s;  // [1, 2]: MARK and APPENDS already
  CHECK(pickle_for_libtorch(list) == list);
  const std::string protocol4 = "\200\004\225\005\000\000\000\000\000\000\000]\224K\001a."s;
  CHECK(pickle_for_libtorch(protocol4) == protocol4);  // FRAME is not an opcode this follows
  const std::string cut = "\200\002]q\000K\001a"s;     // no STOP
  CHECK(pickle_for_libtorch(cut) == cut);
  // [OrderedDict() with state {'v': 1}, 'v']: the 'v' stored in the state dropped is read after
  // it, so leaving the state out would lose it.
  const std::string memo =
      "\200\002]q\000(ccollections\nOrderedDict\nq\001)Rq\002}q\003X\001\000\000\000vq\004K\001sbh\004e."s;
  CHECK(pickle_for_libtorch(memo) == memo);
}
