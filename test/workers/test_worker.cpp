// ferry-test-worker: a custom worker executable (built-in tasks plus test/workers/test_tasks.cpp),
// built the way docs/embedding.md tells users to build theirs.
#include "workers/worker_loop.hpp"

int main(int argc, char** argv) {
  return ferry::worker_main(argc, argv);
}
