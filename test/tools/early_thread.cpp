// LD_PRELOAD'ed into `ferry run` by its signal test: a thread started before main(), as a GPU
// driver's, a profiler's or a library constructor's is, with SIGINT and SIGTERM unblocked. The
// kernel may hand a process-directed signal to such a thread; the test sends it there on purpose.
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>

namespace {

void* sleep_forever(void*) {
  ::prctl(PR_SET_NAME, "ferry-early", 0, 0, 0);  // how the test finds it in /proc
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  ::pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
  for (;;) ::pause();
  return nullptr;
}

__attribute__((constructor)) void start_early_thread() {
  ::unsetenv("LD_PRELOAD");  // ferry run's workers start without it
  pthread_t t;
  if (::pthread_create(&t, nullptr, sleep_forever, nullptr) == 0) ::pthread_detach(t);
}

}  // namespace
