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

find_package(Torch REQUIRED)

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
