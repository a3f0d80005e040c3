// Memory passed by file descriptor between real processes, as expandable-segment CUDA tensors
// travel: the segment server's bundles, and a span exported, fetched, imported and mapped. On
// machines without a GPU the memory is host_vmm()'s (memfds mapped into reserved address space):
// the same code, fds and processes as on a device, with host pages for device memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../catch.hpp"

#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "../test_util.hpp"
#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/span_export.hpp"
#include "ipc/cuda/span_import.hpp"
#include "ipc/cuda/vmm_api.hpp"
#include "ipc/error.hpp"
#include "ipc/process.hpp"
#include "ipc/segment_server.hpp"

namespace ferry::cuda {
namespace {

using namespace std::chrono_literals;

void need(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void need_ok(const Status& s, const std::string& doing) {
  need(s.ok(), doing + ": " + s.error);
}

// An owner's expandable segment on the host: `count` chunks of `chunk` bytes, each its own
// allocation, mapped back to back in one reservation, chunk i filled with byte 'a' + i.
struct HostSegment {
  VmmOps& ops = host_vmm();
  std::uint64_t chunk = 0, base = 0, size = 0;
  std::vector<std::uint64_t> handles;
  HostSegment(int count, std::uint64_t pages) {
    need_ok(ops.granularity(0, &chunk), "granularity");
    chunk *= pages;
    size = chunk * static_cast<std::uint64_t>(count);
    need_ok(ops.reserve(size, chunk, &base), "reserve");
    for (int i = 0; i < count; ++i) {
      std::uint64_t h = 0;
      need_ok(ops.create(0, chunk, &h), "create");
      need_ok(ops.map(0, base + i * chunk, chunk, h), "map");
      need_ok(ops.release(h), "release");  // the mapping holds it, as an allocator's does
      std::memset(reinterpret_cast<void*>(base + i * chunk), 'a' + i, chunk);
    }
  }
  ~HostSegment() {
    for (std::uint64_t off = 0; off < size; off += chunk) (void)ops.unmap(base + off, chunk);
    (void)ops.free_reservation(base, size);
  }
  Span span(std::uint64_t offset, std::uint64_t length) const {
    Span s;
    const std::string why = plan_span(
        base + offset, length, [this](std::uint64_t a, Chunk* c) { return ops.chunk_at(a, c); },
        &s);
    need(why.empty(), why);
    return s;
  }
};

// The fds this process has open on host_vmm's memfds.
int memfds_open() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().find("memfd:ferry-vmm") != std::string::npos) ++n;
  }
  return n;
}

// A peer asking for bundle `seq` is refused: it was withdrawn.
void expect_withdrawn(pid_t owner, std::uint64_t token, std::uint32_t seq) {
  test::in_child([&] {
    try {
      (void)fetch_bundle(owner, token, seq, 5000ms);
    } catch (const Error& e) {
      need(e.code() == Errc::fd_transfer, e.what());
      return;
    }
    need(false, "a withdrawn bundle was fetched");
  });
}

TEST_CASE("segment server: a bundle of fds and bytes is fetched by a peer, and gone once withdrawn",
          "[vmm]") {
  auto bundle = std::make_shared<FdBundle>();
  for (char c : {'x', 'y', 'z'}) {
    UniqueFd fd(::memfd_create("bundle-test", MFD_CLOEXEC));
    REQUIRE(fd);
    REQUIRE(::write(fd.get(), &c, 1) == 1);
    bundle->fds.push_back(std::move(fd));
  }
  bundle->bytes = "three files";
  constexpr std::uint32_t kSeq = kFirstSpanSeq + 0x1000;
  publish_bundle(kSeq, bundle);
  const pid_t owner = ::getpid();
  const std::uint64_t token = process_token();
  test::in_child([&] {
    FdBundle got = fetch_bundle(owner, token, kSeq, 5000ms);
    need(got.bytes == "three files", "the bytes");
    need(got.fds.size() == 3, "three fds");
    std::string seen;
    for (const UniqueFd& fd : got.fds) {
      char c = 0;
      need(::pread(fd.get(), &c, 1, 0) == 1, "read");
      seen += c;
    }
    need(seen == "xyz", "the same files, in order: " + seen);
  });
  withdraw_segment(kSeq);
  expect_withdrawn(owner, token, kSeq);
}

TEST_CASE("vmm by fd: a span across chunks maps contiguously in a peer, zero-copy", "[vmm]") {
  HostSegment seg(4, 2);
  // From the middle of chunk 1 to the middle of chunk 2: a tensor lying across two allocations.
  const std::uint64_t offset = seg.chunk + seg.chunk / 2;
  const Span span = seg.span(offset, seg.chunk);
  REQUIRE(span.chunks.size() == 2);
  SpanExports exports(host_vmm());
  std::shared_ptr<SpanExport> e = exports.get(span);
  CHECK(exports.fds_exported() == 2);
  const pid_t owner = ::getpid();
  const std::uint64_t token = process_token();
  const ProcessIdentity owner_id = this_process();
  test::in_child([&] {
    FdBundle b = fetch_bundle(owner, token, e->seq(), 5000ms);
    Span got;
    need(decode_span(b.bytes, &got) == "", "decode");
    SpanImports imports(host_vmm());
    std::uint64_t va = 0;
    need_ok(imports.map(owner_id, 0, got, std::move(b.fds), &va), "map");
    const auto* p = reinterpret_cast<const char*>(va + (seg.base + offset - span.base));
    need(p[0] == 'b' && p[seg.chunk / 2 - 1] == 'b', "chunk 1's bytes");
    need(p[seg.chunk / 2] == 'c' && p[seg.chunk - 1] == 'c', "chunk 2's bytes, right after");
    // Written here, seen by the owner: the same memory, not a copy.
    reinterpret_cast<char*>(va)[seg.chunk] = 'W';
    need(imports.chunks_imported_now() == 2, "two imports");
    need_ok(imports.unmap(va), "unmap");
    need(imports.chunks_imported_now() == 0 && imports.spans_mapped_now() == 0, "all released");
  });
  CHECK(reinterpret_cast<const char*>(seg.base)[2 * seg.chunk] == 'W');
}

TEST_CASE("vmm by fd: each chunk is imported once per peer, however many spans map it", "[vmm]") {
  HostSegment seg(3, 1);
  SpanExports exports(host_vmm());
  auto a = exports.get(seg.span(0, seg.chunk + 1));              // chunks 0, 1
  auto b = exports.get(seg.span(seg.chunk, seg.chunk + 1));      // chunks 1, 2
  auto again = exports.get(seg.span(seg.chunk / 2, seg.chunk));  // chunks 0, 1 again
  CHECK(again == a);  // a live export is reused, not exported anew
  CHECK(exports.fds_exported() == 4);
  const pid_t owner = ::getpid();
  const std::uint64_t token = process_token();
  const ProcessIdentity owner_id = this_process();
  test::in_child([&] {
    const int inherited = memfds_open();  // the owner's fds, copied by fork
    SpanImports imports(host_vmm());
    auto map = [&](const SpanExport& x) {
      FdBundle fetched = fetch_bundle(owner, token, x.seq(), 5000ms);
      std::uint64_t va = 0;
      need_ok(imports.map(owner_id, 0, x.span(), std::move(fetched.fds), &va), "map");
      return va;
    };
    const std::uint64_t va = map(*a);
    const std::uint64_t vb = map(*b);
    need(imports.chunks_imported_now() == 3, "chunk 1 imported once for both spans");
    need(imports.chunks_imported_total() == 3, "three imports in all");
    need(reinterpret_cast<const char*>(va)[seg.chunk] == 'b' &&
             reinterpret_cast<const char*>(vb)[0] == 'b',
         "both spans see chunk 1");
    need_ok(imports.unmap(va), "unmap a");
    need(imports.chunks_imported_now() == 2, "chunk 0 released, chunk 1 still mapped by b");
    need_ok(imports.unmap(vb), "unmap b");
    need(imports.chunks_imported_now() == 0, "nothing left");
    need(memfds_open() == inherited, "no fd of the owner's memory left here");
  });
}

TEST_CASE("vmm by fd: an export lasts while it is held, and then pins nothing", "[vmm]") {
  const int before = memfds_open();
  std::uint32_t seq = 0;
  {
    HostSegment seg(2, 1);
    SpanExports exports(host_vmm());
    auto e = exports.get(seg.span(0, 2 * seg.chunk));
    seq = e->seq();
    CHECK(memfds_open() == before + 4);  // two mappings, two exported fds
    e.reset();                           // the last lease let go: withdrawn
    CHECK(memfds_open() == before + 2);
    auto fresh = exports.get(seg.span(0, 2 * seg.chunk));
    CHECK(fresh->seq() != seq);  // exported anew, under a new seq
    seq = fresh->seq();
  }
  // The segment unmapped and its export gone: no fd keeps its memory.
  CHECK(memfds_open() == before);
  const pid_t owner = ::getpid();
  const std::uint64_t token = process_token();
  expect_withdrawn(owner, token, seq);
}

TEST_CASE("vmm by fd: a span that fails to map leaves nothing mapped or imported", "[vmm]") {
  HostSegment seg(2, 1);
  const Span span = seg.span(0, 2 * seg.chunk);
  SpanImports imports(host_vmm());
  std::uint64_t va = 0;
  SECTION("fewer fds than chunks") {
    std::vector<UniqueFd> fds;
    UniqueFd one;
    REQUIRE(host_vmm().export_fd(span.chunks[0], &one).ok());
    fds.push_back(std::move(one));
    CHECK_THAT(imports.map(this_process(), 0, span, std::move(fds), &va).error,
               Catch::Contains("2 chunks but 1 fds"));
  }
  SECTION("the second chunk's fd cannot be mapped") {
    std::vector<UniqueFd> fds;
    UniqueFd first;
    REQUIRE(host_vmm().export_fd(span.chunks[0], &first).ok());
    fds.push_back(std::move(first));
    fds.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    CHECK_FALSE(imports.map(this_process(), 0, span, std::move(fds), &va).ok());
  }
  SECTION("a span whose digest is not its chunks'") {
    Span bad = span;
    bad.digest ^= 1;
    std::vector<UniqueFd> fds(2);
    CHECK_THAT(imports.map(this_process(), 0, bad, std::move(fds), &va).error,
               Catch::Contains("digest"));
  }
  CHECK(imports.chunks_imported_now() == 0);
  CHECK(imports.spans_mapped_now() == 0);
}

}  // namespace
}  // namespace ferry::cuda
