// What a wire record's carrier requires of it (internal). validate() checks what every record
// shares; each carrier (a cpu tensor in shared memory, one inline in its record, a cuda tensor)
// has its rules in a file of its own, wire_<carrier>.cpp, found through the table in
// wire_rules.cpp: a new transport adds its file and a row there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry::wire {

struct Record;

// One carrier's rules. Each check returns "" when valid, else a message naming the bad field.
struct CarrierRules {
  // Whether `r` travels this way (its device type, its flags).
  bool (*carries)(const Record& r);
  // Its device, flags and the fields this carrier uses or leaves zero, before the view.
  std::string (*check)(const Record& r);
  // Its view, once the common checks found its `extent` (bytes) within block_length; null: none.
  std::string (*check_view)(const Record& r, std::int64_t extent);
};

// The rules of the carrier that takes `r`; null when none does (an unknown device type).
const CarrierRules* carrier_rules(const Record& r) noexcept;

// wire_cpu.cpp: a cpu tensor in a block of its owner's segment.
bool carries_cpu(const Record& r);
std::string check_cpu(const Record& r);
// What any cpu record's device must be, wherever its bytes are (the inline carrier's too).
std::string check_cpu_device(const Record& r);

// wire_inline.cpp: a small cpu tensor whose bytes are in its record (kFlagInline).
bool carries_inline(const Record& r);
std::string check_inline(const Record& r);
std::string check_inline_view(const Record& r, std::int64_t extent);

// wire_cuda.cpp: a cuda tensor, by IPC handle or by fd.
bool carries_cuda(const Record& r);
std::string check_cuda(const Record& r);

// Field values as error texts show them.
std::string i64(std::int64_t v);
std::string u64(std::uint64_t v);
std::string hex32(std::uint32_t v);  // 0x0000002a
bool all_zero(const std::uint8_t* p, std::size_t n);

}  // namespace ferry::wire
