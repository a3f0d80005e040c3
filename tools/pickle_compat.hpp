// The pickle of a torch.save file, rewritten into opcodes every LibTorch's unpickler reads. Pure
// bytes, no LibTorch, with a test per case (test/tools/pickle_compat_test.cpp).
//
// Python pickles a list of one item with APPEND and a dict of one item with SETITEM, which LibTorch
// 1.13's unpickler does not know ("Unknown opcode for unpickling at 0x73"; 2.x knows SETITEM),
// and a collections.OrderedDict (a state_dict) as a call that 1.13 reads as None, then sets the
// state_dict's _metadata on it with BUILD. The rewrite leaves nothing for either to stumble on,
// and reads the same on 2.x.
#pragma once

#include <string>

namespace ferry::tools {

// `pickle` (protocol 2, what torch.save writes by default) with each APPEND made MARK, value,
// APPENDS and each SETITEM MARK, key, value, SETITEMS; each collections.OrderedDict() an empty
// dict; and the attributes a BUILD sets on such a dict (a state_dict's _metadata) left out.
// Returned unchanged where it holds something this does not follow (a later protocol's opcode,
// say): the unpickler then says what it finds.
std::string pickle_for_libtorch(const std::string& pickle);

}  // namespace ferry::tools
