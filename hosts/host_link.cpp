// Built with USE_C10D_GLOO (ProcessGroupGloo.hpp declares nothing without it) and only where
// Gloo's headers are found (hosts/CMakeLists.txt). The store the links meet through is
// host_store.cpp's; the shim for what differs in the Gloo group's API between LibTorch 1.13 and
// 2.x (WorkPtr) is here, its one user.
#include "hosts/host_link.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ipc/log.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/transport/dtype.hpp"
#include "runtime/transport/tensor_view.hpp"

namespace ferry::hosts {
namespace {

// Gloo matches a pair's messages to receives per tag, in order: frames have a tag of their own,
// so that the next frame's receive can be posted before this one's payloads are.
constexpr int kFrameTag = 0;    // frames, whose receive stays posted
constexpr int kSlabTag = 1;     // slabs apart (host_frame.hpp), whose receive stays posted
constexpr int kPayloadTag = 2;  // payloads apart, whose receives are posted once their frame came

// Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that just died raises
// SIGPIPE, whose default action kills this process, where the link should only break. So the
// first link turns SIGPIPE's default into "ignore"; a handler the program set is left alone.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      ::sigemptyset(&ignore.sa_mask);
      ::sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

std::chrono::milliseconds payload_wait(std::chrono::milliseconds base, std::uint64_t bytes,
                                       double rate) {
  const double extra_ms = rate > 0 ? static_cast<double>(bytes) / rate * 1000.0 : 0.0;
  return base + std::chrono::milliseconds(static_cast<std::int64_t>(extra_ms));
}

}  // namespace

at::Tensor receive_buffer(at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  try {
    return empty_shared(sizes, options);
  } catch (const Error& e) {
    if (e.code() != Errc::shm_exhausted) throw;
    log().debug("host link: no room in shared memory for a payload ({}); ordinary memory",
                e.detail());
    return at::empty(sizes, options);
  }
}

Errc link_failure_code(std::string_view what) noexcept {
  // Gloo: "Timed out waiting 2000ms for recv operation to complete", "Application timeout caused
  // pair closure"; c10d: "Socket Timeout", "timed out"...
  for (const char* word : {"Timed out", "timed out", "Timeout", "timeout"}) {
    if (what.find(word) != std::string_view::npos) return Errc::timeout;
  }
  return Errc::peer_dead;
}

// What c10d's send and recv return: ProcessGroup::Work in 1.13, Work in 2.x.
using WorkPtr = decltype(std::declval<c10d::ProcessGroupGloo&>().recv(
    std::declval<std::vector<at::Tensor>&>(), 0, 0));

at::Tensor bytes_tensor(void* data, std::size_t n) {
  return at::from_blob(data, {static_cast<std::int64_t>(n)}, at::kByte);
}

// A frame and the slab room behind it, one buffer: a frame alone is its first kFrameBytes, a
// wide frame all of it (host_frame.hpp).
struct WideFrame {
  FrameBytes frame;
  std::array<std::uint8_t, kSlabBytes> slab;
};
static_assert(sizeof(WideFrame) == kWideFrameBytes && offsetof(WideFrame, slab) == kFrameBytes,
              "a wide frame is a frame and a slab, back to back");

// The bytes a sender puts in a slab: the payloads one after the other, then zeros.
void fill_slab(std::uint8_t* slab, const std::vector<at::Tensor>& payload) {
  std::uint8_t* to = slab;
  for (const at::Tensor& t : payload) {
    if (t.nbytes() != 0) std::memcpy(to, t.data_ptr(), t.nbytes());
    to += t.nbytes();
  }
  std::memset(to, 0, static_cast<std::size_t>(slab + kSlabBytes - to));
}

struct HostLink::Impl {
  std::string name;
  int peer = 0;
  LinkOptions options;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  // A frame (and its slab, wide or apart) is sent from `sending`, under send_mu; `announced_wide`:
  // whether this side's last frame announced its next as wide.
  std::unique_ptr<WideFrame> sending = std::make_unique<WideFrame>();
  bool announced_wide = false;
  // Frames and slabs apart are received into two buffers each (under recv_mu), one of which has
  // its receive posted from the first recv() on while the other is read: what the peer sends
  // next finds its receive posted, and does not wait for word of it. A frame's receive is posted
  // as wide as the frame before it announced (`frame_wide`). Declared after `group` so that the
  // posted receives go before the group does.
  std::array<std::unique_ptr<WideFrame>, 2> recv_frames = {std::make_unique<WideFrame>(),
                                                           std::make_unique<WideFrame>()};
  int frame_posted = 0;
  bool frame_wide = false;
  WorkPtr frame_work;
  std::array<std::vector<std::uint8_t>, 2> recv_slabs = {std::vector<std::uint8_t>(kSlabBytes),
                                                         std::vector<std::uint8_t>(kSlabBytes)};
  int slab_posted = 0;
  WorkPtr slab_work;
  std::mutex send_mu, recv_mu;
  std::atomic<bool> broken{false};
  std::string why;  // the first failure, under fail_mu
  std::mutex fail_mu;

  // Breaks the link for good, keeping the first reason it broke for later calls to name.
  void break_for(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(fail_mu);
      if (why.empty()) why = reason;
    }
    broken.store(true);
    log().debug("host link {}: broken: {}", name, reason);
  }

  // Breaks the link and throws what `e` means.
  [[noreturn]] void fail(const std::exception& e, const char* doing) {
    const std::string what = failure_text(e);
    break_for(std::string(doing) + ": " + what);
    throw Error(link_failure_code(what),
                "host link " + name + ": " + doing + " failed: " + what + "; the link is given up");
  }

  void check_usable() {
    if (!broken.load()) return;
    std::lock_guard<std::mutex> lock(fail_mu);
    throw Error(link_failure_code(why), "host link " + name + " is broken (" + why +
                                            "); a host that failed is not "
                                            "reused: it joins again under a new link");
  }

  template <class Op>
  void wait_for(Op op, std::chrono::milliseconds timeout, const char* doing) {
    try {
      op()->wait(timeout);
    } catch (const std::exception& e) {
      fail(e, doing);
    }
  }

  // Posts a receive of `n` bytes into `data` for the peer's next message on `tag`.
  WorkPtr post(void* data, std::size_t n, int tag, const char* doing) {
    std::vector<at::Tensor> one = {bytes_tensor(data, n)};
    try {
      return group->recv(one, peer, tag);
    } catch (const std::exception& e) {
      fail(e, doing);
    }
  }

  // Posts the next receive while the one that just completed is still being read. A peer that
  // sent its last message and closed makes that post fail: the link breaks (the next use says
  // so), but what already arrived is still delivered.
  template <class Post>
  void post_ahead(Post post) {
    try {
      post();
    } catch (const Error& e) {
      log().debug("host link {}: {}", name, e.detail());
    }
  }

  // Posts the receive of the next frame, `wide` or not, into recv_frames[which].
  void post_frame(int which, bool wide) {
    frame_work = post(recv_frames[which].get(), wide ? kWideFrameBytes : kFrameBytes, kFrameTag,
                      "posting a frame's receive");
    frame_posted = which;
    frame_wide = wide;
  }

  // Posts the receive of the next slab into recv_slabs[which].
  void post_slab(int which) {
    slab_work = post(recv_slabs[which].data(), kSlabBytes, kSlabTag, "posting a slab's receive");
    slab_posted = which;
  }

  // Waits for the posted slab, posts the other buffer's receive at once (the sender of the next
  // slab need not wait for this one to be read) and returns the full one.
  const std::vector<std::uint8_t>& take_slab() {
    wait_for([&] { return slab_work; },
             payload_wait(options.timeout, kSlabBytes, options.min_bytes_per_s),
             "receiving a slab");
    const int full = slab_posted;
    post_ahead([&] { post_slab(1 - full); });
    return recv_slabs[full];
  }
};

HostLink::HostLink(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                   int rank, LinkOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (rank != 0 && rank != 1) {
    throw Error(Errc::invalid_argument,
                "HostLink rank " + std::to_string(rank) + ": 0 is the head, 1 the host");
  }
  ignore_sigpipe_once();
  impl_->name = prefix;
  impl_->peer = 1 - rank;
  impl_->options = std::move(options);
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create(impl_->options.join_timeout);
    opts->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(impl_->options.address));
    opts->threads = 1;  // sends and receives wait on the caller's thread; one is enough
    auto scoped = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(scoped, rank, 2, opts);
  } catch (const std::exception& e) {
    const std::string what = failure_text(e);
    throw Error(link_failure_code(what) == Errc::timeout ? Errc::timeout : Errc::system,
                "host link " + prefix + ": joining as " + (rank == 0 ? "head" : "host") + " on " +
                    impl_->options.address + " failed: " + what +
                    "; check that the peer joins within " +
                    std::to_string(impl_->options.join_timeout.count()) +
                    " ms and that this address reaches it");
  }
}

HostLink::~HostLink() = default;

bool HostLink::broken() const noexcept {
  return impl_->broken.load();
}
const std::string& HostLink::name() const noexcept {
  return impl_->name;
}

void HostLink::send(FrameKind kind, std::uint64_t seq, const std::string& body,
                    const std::vector<at::Tensor>& tensors) {
  Frame f;
  f.kind = kind;
  f.seq = seq;
  f.body = body;
  std::vector<at::Tensor> payload;
  payload.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || !(t.device().is_cpu() || t.is_cuda()) || t.layout() != at::kStrided) {
      throw Error(Errc::invalid_argument,
                  "host link " + impl_->name + ": tensor " + std::to_string(i) +
                      " is not a dense CPU or CUDA tensor; move it with .cpu() (or .to_dense()) "
                      "first");
    }
    TensorShape shape;
    shape.dtype = to_wire_dtype(t.scalar_type());
    shape.sizes.assign(t.sizes().begin(), t.sizes().end());
    f.tensors.push_back(std::move(shape));
    if (t.is_cuda()) {
      // No NCCL link (docs/multi-host.md, "CUDA tensors between hosts"): the bytes go through
      // this host's memory, and the copy is counted like every other fallback.
      try {
        payload.push_back(t.contiguous().cpu());
      } catch (const std::exception& e) {
        // A failed copy is this message's, not the link's: the task fails, the link goes on.
        throw Error(Errc::invalid_argument, "host link " + impl_->name + ": tensor " +
                                                std::to_string(i) + " could not be copied off " +
                                                t.device().str() + ": " + failure_text(e));
      }
      detail::count_copy(CopyReason::other_host, payload.back().nbytes());
    } else {
      payload.push_back(t.contiguous());
    }
  }
  std::size_t total = 0;
  for (const at::Tensor& t : payload) total += t.nbytes();
  // A frame that cannot be encoded is refused below whatever this says.
  const std::size_t room =
      f.tensors.size() <= kMaxFrameTensors ? frame_room(f.tensors.size(), f.body.size()) : 0;
  const Carrier carrier = payload_carrier(total, room);
  if (carrier == Carrier::frame) {
    f.payload.reserve(total);
    for (const at::Tensor& t : payload) {
      if (t.nbytes() != 0) f.payload.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    }
  }

  std::lock_guard<std::mutex> lock(impl_->send_mu);
  impl_->check_usable();
  const MessagePlan plan = plan_message(carrier, impl_->announced_wide);
  f.next_wide = plan.announce_wide;
  WideFrame& out = *impl_->sending;
  out.frame = encode_frame(f);  // before anything is sent: a refusal breaks nothing
  if (carrier == Carrier::slab) {
    fill_slab(out.slab.data(), payload);
  } else if (plan.wide) {
    fill_slab(out.slab.data(), {});
  }
  const auto timeout = impl_->options.timeout;
  // Each message is waited for before the next is posted: posting the frame's and the slab's
  // sends together and then waiting for both cost a stream of 64 KiB messages half its bandwidth
  // in interleaved runs (host_link_test cannot tell; ferry-hosts-bench can).
  auto send_one = [&](at::Tensor t, int tag, const char* doing) {
    const auto wait = payload_wait(timeout, t.nbytes(), impl_->options.min_bytes_per_s);
    std::vector<at::Tensor> one = {std::move(t)};
    impl_->wait_for([&] { return impl_->group->send(one, impl_->peer, tag); }, wait, doing);
  };
  send_one(bytes_tensor(&out, plan.wide ? kWideFrameBytes : kFrameBytes), kFrameTag,
           plan.wide ? "sending a wide frame" : "sending a frame");
  impl_->announced_wide = plan.announce_wide;
  if (plan.slab_apart) {
    send_one(bytes_tensor(out.slab.data(), kSlabBytes), kSlabTag, "sending a slab");
  } else if (carrier == Carrier::apart) {
    for (const at::Tensor& t : payload) {
      if (t.nbytes() == 0) continue;  // nothing to send; the receiver skips it too
      send_one(t, kPayloadTag, "sending a payload");
    }
  }
}

Message HostLink::recv(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(impl_->recv_mu);
  impl_->check_usable();
  // At the first receive, not when the link is made: a peer that joins and leaves at once (a
  // host that declines its work) must not fail the making of the link, only its use.
  if (!impl_->frame_work.defined()) {
    impl_->post_slab(0);
    impl_->post_frame(0, false);
  }
  const int full = impl_->frame_posted;
  const bool wide = impl_->frame_wide;
  impl_->wait_for([&] { return impl_->frame_work; }, timeout,
                  wide ? "waiting for a wide frame" : "waiting for a frame");
  const WideFrame& in = *impl_->recv_frames[full];
  Message m;
  std::vector<at::ScalarType> dtypes;
  try {
    m.frame = decode_frame(in.frame, impl_->options.max_payload_bytes);
    for (const TensorShape& shape : m.frame.tensors) dtypes.push_back(from_wire_dtype(shape.dtype));
  } catch (const Error& e) {
    impl_->break_for(e.detail());  // what follows it cannot be told apart from a payload
    throw Error(Errc::bad_record, "host link " + impl_->name + ": " + e.detail());
  }
  // The next frame's receive goes up before this one is read any further.
  impl_->post_ahead([&] { impl_->post_frame(1 - full, m.frame.next_wide); });
  const Carrier carrier = carrier_of(m.frame);
  // The bytes the tensors are copied from, one after the other, unless they come apart.
  const std::uint8_t* carried = nullptr;
  if (carrier == Carrier::frame) {
    carried = reinterpret_cast<const std::uint8_t*>(m.frame.payload.data());
  } else if (carrier == Carrier::slab) {
    carried = wide ? in.slab.data() : impl_->take_slab().data();
  }
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    const auto& sizes = m.frame.tensors[i].sizes;
    at::Tensor t = impl_->options.allocate ? impl_->options.allocate(sizes, dtypes[i])
                                           : receive_buffer(sizes, dtypes[i]);
    const auto n = static_cast<std::uint64_t>(t.nbytes());
    if (carried != nullptr) {
      if (n != 0) std::memcpy(t.data_ptr(), carried, n);
      carried += n;
    } else if (n != 0) {
      std::vector<at::Tensor> one = {t};
      impl_->wait_for([&] { return impl_->group->recv(one, impl_->peer, kPayloadTag); },
                      payload_wait(impl_->options.timeout, n, impl_->options.min_bytes_per_s),
                      "receiving a payload");
    }
    m.tensors.push_back(std::move(t));
  }
  m.frame.payload.clear();  // it is in the tensors now
  return m;
}

}  // namespace ferry::hosts
