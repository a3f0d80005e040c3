# A wheel's build: `pip install --no-build-isolation .` or `pip wheel`, through scikit-build-core
# (pyproject.toml), which sets SKBUILD and names the Python that runs pip (Python_EXECUTABLE).
# Everything a wheel changes about the build is here; included by the top-level CMakeLists.txt
# before anything is looked for. The wheel is built for that Python's torch:
#   - its LibTorch, from torch.utils.cmake_prefix_path where that torch ships one (pip's does;
#     a distribution's python3-torch goes with the system's LibTorch, which is then found);
#   - its CUDA: the CUDA sources are built when that torch has CUDA, by a toolkit of the same
#     major version, and not otherwise (the user may still choose with FERRY_WITH_CUDA);
#   - the Python package, an error if it cannot be built; no tests, benchmarks or examples;
#   - laid out in site-packages as ferry/ (the package), ferry/bin (ferry, ferry-shm,
#     ferry-worker), ferry/lib (the libraries and the CMake package) and ferry/include.
if(NOT SKBUILD)
  return()
endif()

if(NOT Python_EXECUTABLE)
  message(FATAL_ERROR "SKBUILD is set but Python_EXECUTABLE is not: build the wheel with pip "
    "(pip install --no-build-isolation .), which names the Python it is for")
endif()
set(_probe [=[
import sysconfig, torch, torch.utils
print(torch.__version__)
print(torch.version.cuda or "")
print(torch.utils.cmake_prefix_path)
print(sysconfig.get_path("platlib"))
]=])
execute_process(COMMAND "${Python_EXECUTABLE}" -c "${_probe}" RESULT_VARIABLE _rc
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "ferry is built against the torch of the Python that runs pip "
    "(${Python_EXECUTABLE}), and that Python cannot import torch:\n${_err}\n"
    "Install torch into that environment first, then: pip install --no-build-isolation .\n"
    "(Without --no-build-isolation pip builds in a fresh environment of its own, without the "
    "torch ferry must match.)")
endif()
string(REPLACE "\n" ";" _out "${_out}")
list(GET _out 0 FERRY_WHEEL_TORCH_VERSION)
list(GET _out 1 FERRY_WHEEL_TORCH_CUDA)
list(GET _out 2 _torch_cmake_prefix)
list(GET _out 3 FERRY_WHEEL_PLATLIB)  # where the wheel goes: a torch there is reached relatively
if(FERRY_WHEEL_TORCH_CUDA)
  set(_with " with CUDA ${FERRY_WHEEL_TORCH_CUDA}")
else()
  set(_with " without CUDA")
endif()
message(STATUS "ferry: a wheel for ${Python_EXECUTABLE}: torch ${FERRY_WHEEL_TORCH_VERSION}${_with}")

# That torch's own LibTorch, where it ships one, before any other on the machine.
if(NOT DEFINED Torch_DIR AND EXISTS "${_torch_cmake_prefix}/Torch/TorchConfig.cmake")
  set(Torch_DIR "${_torch_cmake_prefix}/Torch" CACHE PATH "LibTorch of the wheel's torch")
endif()

if(NOT DEFINED FERRY_WITH_CUDA)
  if(FERRY_WHEEL_TORCH_CUDA)
    set(FERRY_WITH_CUDA ON CACHE STRING "Build the CUDA sources: that torch has CUDA")
  else()
    set(FERRY_WITH_CUDA OFF CACHE STRING "Build the CUDA sources: that torch has no CUDA")
  endif()
endif()
set(FERRY_PYTHON ON CACHE STRING "A wheel is the Python package")
set(FERRY_PYTHON_EXECUTABLE "${Python_EXECUTABLE}" CACHE FILEPATH "The Python the wheel is for")
set(FERRY_BUILD_TESTS OFF CACHE BOOL "A wheel has no tests or benchmarks")
set(FERRY_BUILD_EXAMPLES OFF CACHE BOOL "A wheel has no examples")

# The layout in site-packages (the install prefix): GNUInstallDirs and python/CMakeLists.txt take
# these as given.
set(CMAKE_INSTALL_BINDIR ferry/bin CACHE PATH "Executables, inside the package")
set(CMAKE_INSTALL_LIBDIR ferry/lib CACHE PATH "Libraries, inside the package")
set(CMAKE_INSTALL_INCLUDEDIR ferry/include CACHE PATH "Headers, inside the package")
set(FERRY_PYTHON_INSTALL_DIR "." CACHE STRING "The package's parent: site-packages itself")

# Every core, whichever generator pip's backend found. It prefers Ninja, which runs a job per
# core by itself; without Ninja it falls back to make and runs `cmake --build` with no job count,
# so make compiled one source at a time (minutes of a single cc1plus on a machine without
# ninja-build). `cmake --build` runs the cache's CMAKE_MAKE_PROGRAM: here a wrapper that asks make
# for a job per core the build may use. A count the user gives (CMAKE_BUILD_PARALLEL_LEVEL, or
# -Cbuild.tool-args=-jN) comes after it on make's command line and wins.
if(CMAKE_GENERATOR MATCHES "Makefiles")
  if(NOT CMAKE_MAKE_PROGRAM MATCHES "ferry-parallel-make$")
    set(FERRY_WHEEL_MAKE "${CMAKE_MAKE_PROGRAM}" CACHE FILEPATH "make, behind the wrapper" FORCE)
  endif()
  set(_wrapper "${CMAKE_BINARY_DIR}/ferry-parallel-make")
  file(WRITE "${_wrapper}"
    "#!/bin/sh\n# Written by tools/cmake/wheel.cmake: make with a job per usable core.\n"
    "exec \"${FERRY_WHEEL_MAKE}\" -j\"$(nproc 2>/dev/null || echo 1)\" \"$@\"\n")
  file(CHMOD "${_wrapper}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
    GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(CMAKE_MAKE_PROGRAM "${_wrapper}" CACHE FILEPATH "make with a job per core" FORCE)
endif()

# Called once CUDA is set up: a torch with CUDA needs ferry's CUDA code compiled by a toolkit of
# its own major version (the runtime API's handles and structures change across majors).
function(ferry_wheel_check_cuda)
  if(NOT FERRY_WHEEL_TORCH_CUDA OR NOT FERRY_HAVE_CUDA)
    return()
  endif()
  string(REGEX MATCH "^[0-9]+" _torch_major "${FERRY_WHEEL_TORCH_CUDA}")
  string(REGEX MATCH "^[0-9]+" _nvcc_major "${CMAKE_CUDA_COMPILER_VERSION}")
  if(NOT _torch_major STREQUAL _nvcc_major)
    message(FATAL_ERROR "torch ${FERRY_WHEEL_TORCH_VERSION} was built with CUDA "
      "${FERRY_WHEEL_TORCH_CUDA} but ${CMAKE_CUDA_COMPILER} is CUDA "
      "${CMAKE_CUDA_COMPILER_VERSION}: point CUDACXX at a CUDA ${_torch_major} nvcc, or build "
      "without CUDA: pip install --no-build-isolation "
      "--config-settings=cmake.define.FERRY_WITH_CUDA=OFF .")
  endif()
endfunction()
