// The main() of every Catch2 test binary, for Catch2 2.x and 3.x alike (test/catch.hpp): 2.x
// compiles its runner into the one file that defines CATCH_CONFIG_RUNNER, 3.x has it in its
// library already and ignores the macro.
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"

int main(int argc, char* argv[]) {
  return Catch::Session().run(argc, argv);
}
