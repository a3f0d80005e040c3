# The libraries ferry builds against besides LibTorch: spdlog, CLI11 and nlohmann-json. Someone
# installing with pip cannot be expected to have them. The system's copies are used where it has
# them; where it lacks some, configuring stops before anything is compiled, with one message that
# names every missing library and the package that provides it. Included by the top-level
# CMakeLists.txt before LibTorch is looked for, so the message comes first.
find_package(Threads REQUIRED)

# name|Debian and Ubuntu package|Fedora package|conda-forge package
set(_ferry_dependencies
  "spdlog|libspdlog-dev|spdlog-devel|spdlog"
  "CLI11|libcli11-dev|cli11-devel|cli11"
  "nlohmann_json|nlohmann-json3-dev|json-devel|nlohmann_json")
set(_missing_names)
set(_missing_debian)
set(_missing_fedora)
set(_missing_conda)
foreach(_dep IN LISTS _ferry_dependencies)
  string(REPLACE "|" ";" _dep "${_dep}")
  list(GET _dep 0 _name)
  find_package(${_name} QUIET)
  if(NOT ${_name}_FOUND)
    list(GET _dep 1 _debian)
    list(GET _dep 2 _fedora)
    list(GET _dep 3 _conda)
    list(APPEND _missing_names ${_name})
    list(APPEND _missing_debian ${_debian})
    list(APPEND _missing_fedora ${_fedora})
    list(APPEND _missing_conda ${_conda})
  endif()
endforeach()
if(_missing_names)
  list(JOIN _missing_names ", " _names)
  list(JOIN _missing_debian " " _debian)
  list(JOIN _missing_fedora " " _fedora)
  list(JOIN _missing_conda " " _conda)
  message(FATAL_ERROR "ferry builds against libraries that CMake found no package for: "
    "${_names}. Install them, then build again:\n"
    "  Debian, Ubuntu: sudo apt-get install ${_debian}\n"
    "  Fedora:         sudo dnf install ${_fedora}\n"
    "  conda:          conda install -c conda-forge ${_conda}\n"
    "Installed under a prefix of their own? Name it: cmake -DCMAKE_PREFIX_PATH=PREFIX, or "
    "pip install --no-build-isolation --config-settings=cmake.define.CMAKE_PREFIX_PATH=PREFIX .")
endif()
