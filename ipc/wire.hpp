// The wire record: one fixed-size, versioned description of a tensor that lives in a peer's
// shared memory, and the decoder that validates it before anything is built from it.
//
// ipc knows no LibTorch: dtypes are ferry's own stable codes, mapped to at::ScalarType by the
// runtime adapter. A record is plain data (memcpy-able, no pointers); every field a receiver
// uses is checked against what the receiver actually mapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry::wire {

inline constexpr std::uint32_t kMagic = 0x59525246;  // "FRRY"
// 2: the CUDA section; 3: bytes in the record; 4: how a CUDA receiver is ordered (sync, flag_value)
inline constexpr std::uint16_t kVersion = 4;
inline constexpr int kMaxDims = 12;

// Stable dtype codes. Never renumber: they are on the wire.
enum class DType : std::uint8_t {
  uint8 = 1,
  int8,
  int16,
  int32,
  int64,
  float16,
  float32,
  float64,
  complex32,
  complex64,
  complex128,
  bool_,
  bfloat16,
  uint16,
  uint32,
  uint64,
  float8_e5m2,
  float8_e4m3fn,
  float8_e5m2fnuz,
  float8_e4m3fnuz,
};
// Bytes per element of a known dtype, 0 for an unknown code.
std::size_t element_size(std::uint8_t dtype) noexcept;
const char* dtype_name(std::uint8_t dtype) noexcept;

enum class DeviceType : std::uint8_t { cpu = 0, cuda = 1 };

// flags
inline constexpr std::uint32_t kFlagCopied = 1u << 0;        // sender copied it on send
inline constexpr std::uint32_t kFlagEmptyMessage = 1u << 1;  // a message of no tensors
// A CUDA tensor staged through shared memory (copy-on-send through the CPU transport): the
// record describes host bytes, and the receiver moves them to the device named by device_uuid.
inline constexpr std::uint32_t kFlagToDevice = 1u << 2;
// A CUDA tensor in virtual-memory chunks (expandable segments), passed by fd: segment_seq names
// the owner's bundle of chunk fds (ipc/cuda/span_export.hpp), cuda_base and segment_size the
// span, cuda_buffer_id its digest; mem_handle is unused.
inline constexpr std::uint32_t kFlagByFd = 1u << 3;
// A small CPU tensor whose bytes are in the record itself (inline_bytes(), block_length of them,
// at most kInlineBytes), the view contiguous from storage_offset 0: a copy the sender makes
// anyway, with no block, no segment and no lease (those fields are zero).
inline constexpr std::uint32_t kFlagInline = 1u << 4;

// How a CUDA record's receiver is ordered after its sender's last write (Record::sync; the
// values are ipc/cuda/sync_policy.hpp's cuda::Sync):
inline constexpr std::uint8_t kSyncNone = 0;    // the sender's stream was idle: nothing to wait for
inline constexpr std::uint8_t kSyncEvent = 1;   // wait on the interprocess event in event_handle
inline constexpr std::uint8_t kSyncMemop = 2;   // wait until flag slot event_slot >= flag_value
inline constexpr std::uint8_t kSyncSynced = 3;  // the sender synchronised its stream
// event_slot of a CUDA record that names neither an event nor a flag slot (sync none, synced).
inline constexpr std::uint32_t kNoEvent = 0xffffffffu;
// Slots of a sender's flag buffer (ipc/cuda/timeline.hpp's Timeline::kSlots): a memop record's
// event_slot is below it.
inline constexpr std::uint32_t kFlagSlots = 4096;
// The segment number under which an owner publishes its CUDA lease ledger.
inline constexpr std::uint32_t kCudaLedgerSeq = 0xfffffffeu;

struct Record {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint8_t dtype;
  std::uint8_t rank;
  std::uint16_t msg_index;  // this tensor's position in its message
  std::uint16_t msg_count;  // tensors in the message (0 only with kFlagEmptyMessage)
  std::uint32_t flags;
  std::uint8_t device_type;
  std::int8_t device_index;
  std::uint8_t reserved[2];
  std::uint8_t device_uuid[16];  // CUDA device UUID; zero for CPU

  // Where the bytes are: a block of the owner's segment. For a CUDA tensor the "segment" is the
  // owner's cudaMalloc allocation: segment_seq is 0, segment_size the allocation's length, and
  // block_offset where the storage starts in it; the lease is in the owner's CUDA ledger.
  std::uint64_t owner_token;  // the owner process's random token (see process_token())
  std::int32_t owner_pid;
  std::uint32_t segment_seq;  // which of the owner's segments (0 is the owner's lease ledger)
  std::uint64_t segment_size;
  std::uint64_t block_offset;  // bytes from the segment start; the tensor's storage starts here
  std::uint64_t block_length;  // bytes of storage the receiver may touch

  // The lease that keeps the block alive while the receiver holds it.
  std::uint32_t lease_slot;
  std::uint32_t lease_gen;

  // The view: element offset into the storage, sizes and strides in elements.
  std::int64_t storage_offset;
  std::int64_t sizes[kMaxDims];
  std::int64_t strides[kMaxDims];

  // CUDA section (device_type == cuda; all zero otherwise).
  std::uint8_t mem_handle[64];   // cudaIpcMemHandle_t of the allocation
  std::uint64_t cuda_base;       // the allocation's address in the owner
  std::uint64_t cuda_buffer_id;  // the allocation's buffer id in the owner (never reused)
  // Sync event: the cudaIpcEventHandle_t to wait on; sync memop: the cudaIpcMemHandle_t of the
  // owner's flag buffer on this device (exported once, opened once per receiver).
  std::uint8_t event_handle[64];
  std::uint32_t event_slot;  // the event's index in the owner's pool, the flag's slot, or kNoEvent
  std::uint8_t sync;         // kSync*: how the receiver waits for the owner's last write
  std::uint8_t sync_reserved[3];
  std::uint64_t flag_value;        // sync memop: the flag holds at least this once it is written
  std::uint64_t owner_pid_ns;      // with owner_pid and owner_boot_id: the owner's identity
  std::uint8_t owner_boot_id[16];  // as the import cache keys it
};
static_assert(sizeof(Record) % 8 == 0, "records are copied in 8-byte words");

// An inline record (kFlagInline) keeps its bytes where a CUDA record has its CUDA section.
inline constexpr std::size_t kInlineOffset = offsetof(Record, mem_handle);
inline constexpr std::size_t kInlineBytes = sizeof(Record) - kInlineOffset;
inline std::uint8_t* inline_bytes(Record& r) noexcept {
  return reinterpret_cast<std::uint8_t*>(&r) + kInlineOffset;
}
inline const std::uint8_t* inline_bytes(const Record& r) noexcept {
  return reinterpret_cast<const std::uint8_t*>(&r) + kInlineOffset;
}

// Fills the invariant header fields (magic, version) and zeroes the rest.
Record make_record() noexcept;

// Checks everything that needs no mapping: magic, version, dtype, rank, message framing, device,
// sizes >= 0, strides >= 0, and that the view's byte extent fits in block_length without
// overflow. Returns "" when valid, else a message naming the bad field and its value.
std::string validate(const Record& r);

// Checks the location against the segment the receiver mapped (for a CUDA tensor: the
// allocation it opened): its size matches segment_size and the block lies inside it without
// overflow. Returns "" when valid.
std::string validate_location(const Record& r, std::size_t mapped_size);

// Bytes from the storage start to one past the view's last element (0 for an empty tensor),
// or -1 on overflow. Assumes validate()'s per-field checks passed.
std::int64_t view_extent_bytes(const Record& r) noexcept;

}  // namespace ferry::wire
