// Which chunks a tensor's bytes lie in, when its memory comes from CUDA's virtual memory
// management (expandable segments): plain code with no CUDA calls, so every rule is tested on
// machines without a GPU.
//
// An expandable segment is one address range mapped chunk by chunk (LibTorch maps 2 or 20 MiB
// at a time), so a tensor may lie across several physical allocations. It travels as a span:
// the run of chunks that covers its bytes, contiguous in the owner. The owner passes one fd per
// chunk; the receiver reserves address space for the span alone and maps each chunk at its
// offset, so a view costs only the address space of the chunks it touches (not, as a whole
// segment's mirror would, the segment's).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ipc/cuda/vmm_api.hpp"

namespace ferry::cuda {

// The most chunks a span may have: the fds of one span travel in one control message. Larger
// tensors (2.5 GiB in LibTorch's 20 MiB chunks) are copied, with the reason not_exportable.
inline constexpr std::size_t kMaxSpanChunks = 128;

struct Span {
  std::uint64_t base = 0;    // the first chunk's base in the owner
  std::uint64_t size = 0;    // the chunks' sizes together
  std::uint64_t digest = 0;  // names these very chunks: one freed and mapped anew changes it
  std::vector<Chunk> chunks;
};

using ChunkAt = std::function<Status(std::uint64_t addr, Chunk* out)>;

// The span holding the bytes [addr, addr + length): the chunk at addr and those after it, each
// starting where the last ends. Returns "" with *out filled, or why the bytes cannot travel by
// fd (a chunk not made for fd export, a gap, another device, too many chunks, a failed call).
std::string plan_span(std::uint64_t addr, std::uint64_t length, const ChunkAt& chunk_at, Span* out);

// A 64-bit digest of the chunks' places, sizes and buffer ids, in order.
std::uint64_t span_digest(const std::vector<Chunk>& chunks) noexcept;

// The bytes that ride with a span's fds, and back. decode_span returns "" or what is wrong.
std::string encode_span(const Span& s);
std::string decode_span(const std::string& bytes, Span* out);

// The receiver's check before it maps anything: the chunks are contiguous from base, fill size
// exactly, are whole multiples of `granularity`, and the digest is theirs. "" or what is wrong.
std::string check_span(const Span& s, std::uint64_t granularity);

}  // namespace ferry::cuda
