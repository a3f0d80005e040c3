# Finds LibTorch and makes every target of the project, whether it links torch or not, follow the
# choices LibTorch was built with: the libstdc++ ABI and, for a CUDA LibTorch, the CUDA
# architectures. Included by the top-level CMakeLists.txt once the CUDA language is set up.

# A CUDA build of LibTorch (PyTorch's pip wheels) sets CMAKE_CUDA_ARCHITECTURES to OFF in the
# scope that finds it and adds its own -gencode flags for TORCH_CUDA_ARCH_LIST to CMAKE_CUDA_FLAGS
# (cmake/public/cuda.cmake), so that list is what ferry's CUDA code is compiled for. Unless the
# user gave it, it is derived from CMAKE_CUDA_ARCHITECTURES, so both spellings mean one choice.
if(FERRY_HAVE_CUDA AND NOT DEFINED TORCH_CUDA_ARCH_LIST)
  if(DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "$ENV{TORCH_CUDA_ARCH_LIST}")
  else()
    set(TORCH_CUDA_ARCH_LIST)
    foreach(_arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
      # CMake's "90" is real and virtual code (Torch's "9.0+PTX"), "90-real" real code only.
      if(_arch MATCHES "^([0-9]+)([0-9])([af]?)(-real)?$")
        set(_torch_arch "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
        if(NOT CMAKE_MATCH_4)
          string(APPEND _torch_arch "+PTX")
        endif()
        list(APPEND TORCH_CUDA_ARCH_LIST "${_torch_arch}")
      else()
        set(_unmapped_arch "${_arch}")  # an error only if the LibTorch found has CUDA (below)
        unset(TORCH_CUDA_ARCH_LIST)
        break()
      endif()
    endforeach()
  endif()
endif()

# Until LibTorch is found and says what it needs (below), C++17: a CUDA LibTorch takes the CUDA
# standard from this as it is found.
if(DEFINED CMAKE_CXX_STANDARD)
  set(_ferry_user_cxx_standard ${CMAKE_CXX_STANDARD})
else()
  set(CMAKE_CXX_STANDARD 17)
endif()
find_package(Torch REQUIRED)

# The C++ standard: the one LibTorch's headers require, C++17 at least (ferry's own). LibTorch
# states it twice: its CMake target's CXX_STANDARD property (14 in 1.13, 20 in 2.14), which CMake
# does not pass on to what links torch, and ATen.h's guard (`#error C++20 or later compatible
# compiler is required to use ATen` from 2.14 on). The higher of the two wins; a
# CMAKE_CXX_STANDARD the user gave stands if it is not lower.
set(FERRY_CXX_STANDARD 17)
get_target_property(_torch_std torch CXX_STANDARD)
if(_torch_std MATCHES "^[0-9]+$" AND NOT _torch_std EQUAL 98
   AND _torch_std GREATER FERRY_CXX_STANDARD)
  set(FERRY_CXX_STANDARD ${_torch_std})
endif()
foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${_dir}/ATen/ATen.h")
    file(STRINGS "${_dir}/ATen/ATen.h" _aten_guard REGEX "__cplusplus < 20[0-9]+L")
    if(_aten_guard MATCHES "__cplusplus < 20([0-9][0-9])[0-9][0-9]L")
      set(_aten_std ${CMAKE_MATCH_1})  # 202002L: 20
      if(_aten_std GREATER FERRY_CXX_STANDARD)
        set(FERRY_CXX_STANDARD ${_aten_std})
      endif()
    endif()
    break()
  endif()
endforeach()
if(DEFINED _ferry_user_cxx_standard)
  if(_ferry_user_cxx_standard LESS FERRY_CXX_STANDARD)
    message(FATAL_ERROR "CMAKE_CXX_STANDARD is ${_ferry_user_cxx_standard} but LibTorch "
      "${Torch_VERSION} (${Torch_DIR}) needs C++${FERRY_CXX_STANDARD}: leave it out or raise it")
  endif()
  set(FERRY_CXX_STANDARD ${_ferry_user_cxx_standard})
endif()
set(CMAKE_CXX_STANDARD ${FERRY_CXX_STANDARD})
message(STATUS "ferry: C++${FERRY_CXX_STANDARD} for LibTorch ${Torch_VERSION}; the installed targets "
  "require it of their users")

if(FERRY_HAVE_CUDA)
  if(CMAKE_CUDA_ARCHITECTURES STREQUAL "OFF" AND DEFINED _unmapped_arch)
    message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES entry '${_unmapped_arch}' has no "
      "TORCH_CUDA_ARCH_LIST equivalent, and this CUDA LibTorch compiles for that list instead: "
      "give it as well, e.g. -DTORCH_CUDA_ARCH_LIST=\"8.0;9.0\" (or use plain numbers such as "
      "80 or 90-real)")
  elseif(CMAKE_CUDA_ARCHITECTURES STREQUAL "OFF")
    message(STATUS "ferry: CUDA architectures: TORCH_CUDA_ARCH_LIST ${TORCH_CUDA_ARCH_LIST} "
                   "(a CUDA LibTorch compiles for that list)")
  else()
    message(STATUS "ferry: CUDA architectures: ${CMAKE_CUDA_ARCHITECTURES} (a CUDA LibTorch "
                   "would take TORCH_CUDA_ARCH_LIST ${TORCH_CUDA_ARCH_LIST})")
  endif()
endif()

# On Linux, TORCH_CXX_FLAGS names the libstdc++ ABI LibTorch was built with. Torch's target passes
# it only to what links torch; ferry_ipc, the tools and the tests would get the compiler's default,
# and a std::string handed between two ABIs is undefined behaviour. So it applies to every target.
set(FERRY_CXX11_ABI "")
if(TORCH_CXX_FLAGS MATCHES "-D_GLIBCXX_USE_CXX11_ABI=([^ ]*)")
  set(FERRY_CXX11_ABI "${CMAKE_MATCH_1}")
  if(NOT FERRY_CXX11_ABI MATCHES "^[01]$")
    message(FATAL_ERROR "LibTorch's TORCH_CXX_FLAGS sets _GLIBCXX_USE_CXX11_ABI to "
      "'${FERRY_CXX11_ABI}', expected 0 or 1: check the LibTorch found in ${Torch_DIR}")
  endif()
  foreach(_flags_var CMAKE_CXX_FLAGS CMAKE_CUDA_FLAGS)
    if("${${_flags_var}}" MATCHES "_GLIBCXX_USE_CXX11_ABI=([^ ]*)"
       AND NOT CMAKE_MATCH_1 STREQUAL FERRY_CXX11_ABI)
      message(FATAL_ERROR "${_flags_var} sets _GLIBCXX_USE_CXX11_ABI=${CMAKE_MATCH_1} but LibTorch "
        "(${Torch_DIR}) was built with ${FERRY_CXX11_ABI}: remove it from ${_flags_var}, ferry "
        "takes LibTorch's")
    endif()
  endforeach()
  add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${FERRY_CXX11_ABI})
  message(STATUS "ferry: C++ ABI _GLIBCXX_USE_CXX11_ABI=${FERRY_CXX11_ABI} (LibTorch's), every target")
  if(FERRY_CXX11_ABI STREQUAL "0")
    message(WARNING "LibTorch in ${Torch_DIR} uses the old libstdc++ ABI; spdlog, fmt and CLI11 "
      "from a distribution use the new one, so linking ferry against them is likely to fail: "
      "use a LibTorch built with the CXX11 ABI (PyTorch's pip wheels from 2.7 on are)")
  endif()
else()
  message(STATUS "ferry: LibTorch names no C++ ABI; the compiler's default applies")
endif()
