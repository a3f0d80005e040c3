// A worker executable of the user's own, built against the installed ferry::worker.
#include "workers/worker_loop.hpp"

int main(int argc, char** argv) {
  return ferry::worker_main(argc, argv);
}
