# The RUNPATH of ferry's installed binaries and libraries: ferry's own library folder, and every
# folder outside the system's own that the build links a dependency from. A pip LibTorch
# (site-packages/torch/lib) or spdlog in a prefix of its own lies on no path the loader searches,
# and a binary without that folder does not start (exit 127). Included by the top-level
# CMakeLists.txt once LibTorch and spdlog are found; FERRY_DEPENDENCY_RPATH is the list of folders.
#
# Two ways in, as neither covers every case: CMAKE_INSTALL_RPATH_USE_LINK_PATH adds the folder of
# every library linked, but only those outside the source and build trees (a venv inside the
# checkout holding pip's torch would be left out); the folders of LibTorch, spdlog and fmt are
# added by name here, wherever they are.

# The folder of each library an imported target stands for, in any configuration it has.
function(ferry_imported_dirs out)
  set(dirs)
  foreach(target IN LISTS ARGN)
    if(NOT TARGET ${target})
      continue()
    endif()
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(SHARED|UNKNOWN)_LIBRARY$")
      continue()
    endif()
    get_target_property(configs ${target} IMPORTED_CONFIGURATIONS)
    set(props IMPORTED_LOCATION)
    foreach(config IN LISTS configs)
      string(TOUPPER "${config}" config)
      list(APPEND props IMPORTED_LOCATION_${config})
    endforeach()
    foreach(prop IN LISTS props)
      get_target_property(location ${target} ${prop})
      if(location)
        get_filename_component(dir "${location}" DIRECTORY)
        list(APPEND dirs "${dir}")
      endif()
    endforeach()
  endforeach()
  set(${out} ${dirs} PARENT_SCOPE)
endfunction()

ferry_imported_dirs(_dep_dirs torch torch_cpu c10 spdlog::spdlog fmt::fmt)
list(APPEND _dep_dirs "${TORCH_INSTALL_PREFIX}/lib")

# The loader's own folders stay out: an RUNPATH entry there would only shadow ld.so.cache.
set(_system_dirs ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES} ${CMAKE_PLATFORM_IMPLICIT_LINK_DIRECTORIES}
  /lib /lib64 /usr/lib /usr/lib64 /usr/local/lib)
if(CMAKE_LIBRARY_ARCHITECTURE)
  list(APPEND _system_dirs /lib/${CMAKE_LIBRARY_ARCHITECTURE} /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
endif()
set(_system_real)
foreach(_dir IN LISTS _system_dirs)
  get_filename_component(_real "${_dir}" REALPATH)
  list(APPEND _system_real "${_real}")
endforeach()

set(FERRY_DEPENDENCY_RPATH)
foreach(_dir IN LISTS _dep_dirs)
  get_filename_component(_real "${_dir}" REALPATH)
  if(EXISTS "${_real}" AND NOT _real IN_LIST _system_real)
    list(APPEND FERRY_DEPENDENCY_RPATH "${_dir}")
  endif()
endforeach()
list(REMOVE_DUPLICATES FERRY_DEPENDENCY_RPATH)

# A wheel (tools/cmake/wheel.cmake) also reaches a pip torch in the same site-packages by a
# relative path, so the environment may move; the absolute folder stays as the fallback, for a
# torch elsewhere (a venv made with --system-site-packages).
set(_wheel_torch_lib "")
if(FERRY_WHEEL_PLATLIB)
  get_filename_component(_torch_lib_real "${TORCH_INSTALL_PREFIX}/lib" REALPATH)
  get_filename_component(_platlib_real "${FERRY_WHEEL_PLATLIB}" REALPATH)
  string(FIND "${_torch_lib_real}" "${_platlib_real}/" _at)
  if(_at EQUAL 0)
    file(RELATIVE_PATH _wheel_torch_lib "${_platlib_real}" "${_torch_lib_real}")
  endif()
endif()

# ferry_install_rpath(OUT DIR): the RUNPATH of a binary installed in DIR (relative to the prefix):
# ferry's library folder relative to it, then a wheel's torch relative to it, then the
# dependencies' folders.
function(ferry_install_rpath out dir)
  cmake_path(SET _from NORMALIZE "/${dir}")
  cmake_path(SET _lib NORMALIZE "/${CMAKE_INSTALL_LIBDIR}")
  file(RELATIVE_PATH _to_lib "${_from}" "${_lib}")
  set(_rpath "$ORIGIN/${_to_lib}")
  if(_wheel_torch_lib)
    file(RELATIVE_PATH _to_torch "${_from}" "/${_wheel_torch_lib}")
    list(APPEND _rpath "$ORIGIN/${_to_torch}")
  endif()
  list(APPEND _rpath ${FERRY_DEPENDENCY_RPATH})
  set(${out} "${_rpath}" PARENT_SCOPE)
endfunction()

# Executables and libraries alike: BINDIR and LIBDIR lie at one depth under one folder (bin and
# lib, ferry/bin and ferry/lib), so BINDIR's path to LIBDIR also leads from LIBDIR to itself.
ferry_install_rpath(CMAKE_INSTALL_RPATH "${CMAKE_INSTALL_BINDIR}")
set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)
if(FERRY_DEPENDENCY_RPATH)
  message(STATUS "ferry: installed binaries also look for libraries in ${FERRY_DEPENDENCY_RPATH}")
endif()
