// ferry-worker: the worker executable a supervisor spawns, with the built-in tasks.
#include "workers/worker_loop.hpp"

int main(int argc, char** argv) {
  return ferry::worker_main(argc, argv);
}
