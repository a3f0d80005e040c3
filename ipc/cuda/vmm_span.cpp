#include "ipc/cuda/vmm_span.hpp"

#include <cstdio>
#include <cstring>

namespace ferry::cuda {
namespace {

constexpr std::uint32_t kSpanMagic = 0x4e415053;  // "SPAN"

struct Header {
  std::uint32_t magic;
  std::uint32_t count;
  std::uint64_t base;
  std::uint64_t size;
  std::uint64_t digest;
};
struct Entry {
  std::uint64_t base;
  std::uint64_t size;
  std::uint64_t buffer_id;
};

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string plan_span(std::uint64_t addr, std::uint64_t length, const ChunkAt& chunk_at,
                      Span* out) {
  *out = Span{};
  const std::uint64_t end = addr + (length == 0 ? 1 : length);
  std::uint64_t at = addr;
  while (at < end) {
    if (out->chunks.size() == kMaxSpanChunks) {
      return "its bytes lie across more than " + std::to_string(kMaxSpanChunks) +
             " physical allocations";
    }
    Chunk c;
    if (Status s = chunk_at(at, &c); !s.ok())
      return "locating the allocation at " + hex(at) + ": " + s.error;
    if (c.size == 0 || at < c.base || at >= c.base + c.size) {
      return "the allocation found for " + hex(at) + " does not contain it";
    }
    if (!c.fd_exportable) return "its memory was not made for export by file descriptor";
    if (!out->chunks.empty()) {
      const Chunk& last = out->chunks.back();
      if (c.base != last.base + last.size) return "its bytes lie across a gap in the address space";
      if (c.device != last.device) return "its bytes lie on more than one device";
    }
    out->chunks.push_back(c);
    at = c.base + c.size;
  }
  out->base = out->chunks.front().base;
  out->size = at - out->base;
  out->digest = span_digest(out->chunks);
  return "";
}

std::uint64_t span_digest(const std::vector<Chunk>& chunks) noexcept {
  // FNV-1a over the fields, then a final mix: equal spans give equal digests in every process.
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto add = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  for (const Chunk& c : chunks) {
    add(c.base);
    add(c.size);
    add(c.buffer_id);
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

std::string encode_span(const Span& s) {
  const Header h{kSpanMagic, static_cast<std::uint32_t>(s.chunks.size()), s.base, s.size, s.digest};
  std::string out(sizeof h + s.chunks.size() * sizeof(Entry), '\0');
  std::memcpy(out.data(), &h, sizeof h);
  for (std::size_t i = 0; i < s.chunks.size(); ++i) {
    const Entry e{s.chunks[i].base, s.chunks[i].size, s.chunks[i].buffer_id};
    std::memcpy(out.data() + sizeof h + i * sizeof e, &e, sizeof e);
  }
  return out;
}

std::string decode_span(const std::string& bytes, Span* out) {
  *out = Span{};
  Header h{};
  if (bytes.size() < sizeof h)
    return "a span description of " + std::to_string(bytes.size()) + " bytes is too short";
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kSpanMagic) return "not a span description (magic " + hex(h.magic) + ")";
  if (h.count == 0 || h.count > kMaxSpanChunks ||
      bytes.size() != sizeof h + std::size_t{h.count} * sizeof(Entry)) {
    return "a span description of " + std::to_string(bytes.size()) + " bytes cannot hold " +
           std::to_string(h.count) + " chunks";
  }
  out->base = h.base;
  out->size = h.size;
  out->digest = h.digest;
  for (std::uint32_t i = 0; i < h.count; ++i) {
    Entry e{};
    std::memcpy(&e, bytes.data() + sizeof h + i * sizeof e, sizeof e);
    Chunk c;
    c.base = e.base;
    c.size = e.size;
    c.buffer_id = e.buffer_id;
    c.fd_exportable = true;
    out->chunks.push_back(c);
  }
  return "";
}

std::string check_span(const Span& s, std::uint64_t granularity) {
  if (s.chunks.empty()) return "a span of no chunks";
  std::uint64_t at = s.base;
  for (const Chunk& c : s.chunks) {
    if (c.base != at)
      return "chunk at " + hex(c.base) + " does not follow the one before (" + hex(at) + ")";
    if (c.size == 0 || (granularity != 0 && c.size % granularity != 0)) {
      return "chunk at " + hex(c.base) + " of " + std::to_string(c.size) +
             " bytes is not a whole number of " + std::to_string(granularity) + "-byte granules";
    }
    at += c.size;
  }
  if (at - s.base != s.size)
    return "the chunks cover " + std::to_string(at - s.base) + " bytes, the span says " +
           std::to_string(s.size);
  if (span_digest(s.chunks) != s.digest) return "the chunks do not match the span's digest";
  return "";
}

}  // namespace ferry::cuda
