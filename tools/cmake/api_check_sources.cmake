# Sources that this build does not compile itself, as object libraries that nothing builds
# (EXCLUDE_FROM_ALL): CMake still writes their commands to compile_commands.json, which is what
# `make api-check` (tools/api_check.py) compiles. Each gets the flags of the build that does
# compile it elsewhere, as near as this project's targets allow.

# The CPU-only stand-ins for the CUDA sources, compiled instead of them when there is no nvcc.
if(FERRY_HAVE_CUDA)
  add_library(ferry_api_check_ipc OBJECT EXCLUDE_FROM_ALL
    ipc/cuda/devices_none.cpp ipc/cuda/ipc_api_none.cpp ipc/cuda/vmm_api_none.cpp)
  target_link_libraries(ferry_api_check_ipc PRIVATE ferry_ipc ferry_warnings)
endif()

if(FERRY_BUILD_TESTS)
  # The wire fuzzer and its seed generator, which test/CMakeLists.txt builds with clang++.
  add_library(ferry_api_check_fuzz OBJECT EXCLUDE_FROM_ALL
    test/ipc/wire_fuzz.cpp test/ipc/wire_corpus/make_seeds.cpp)
  target_link_libraries(ferry_api_check_fuzz PRIVATE ferry_ipc ferry_warnings)

  # The separate project that test/consumer/run.sh builds against an installed ferry.
  add_library(ferry_api_check_consumer OBJECT EXCLUDE_FROM_ALL
    test/consumer/main.cpp test/consumer/my_tasks.cpp test/consumer/my_worker.cpp)
  target_link_libraries(ferry_api_check_consumer PRIVATE ferry_worker ferry_warnings)
  target_compile_definitions(ferry_api_check_consumer PRIVATE MY_WORKER="my-worker")
endif()
