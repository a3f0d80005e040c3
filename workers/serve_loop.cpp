#include "workers/serve_loop.hpp"

namespace ferry {

std::size_t serve(TensorQueue& in, TensorQueue& out, const MessageFn& fn) {
  std::size_t handled = 0;
  for (;;) {
    Tensors message;
    try {
      message = in.recv();
    } catch (const Error& e) {
      if (e.code() == Errc::closed || e.code() == Errc::peer_dead) {
        flush(std::chrono::seconds(5));  // replies still queued need this process alive
        return handled;
      }
      throw;
    }
    out.send(fn(message));
    ++handled;
  }
}

}  // namespace ferry
