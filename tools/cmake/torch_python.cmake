# ferry_torch_python(<var> <probe>): the Python that imports torch, for the package (python/) and
# for the benchmarks that run Python with torch. FERRY_PYTHON_EXECUTABLE when given, else the first
# of python3 on PATH and the system's python3 whose run of <probe> (a script that imports torch)
# succeeds: the python3 first on PATH often lacks torch (a pyenv or venv Python beside Debian's
# python3-torch). Sets <var> to it, or to "" when none does, <var>_OUTPUT to what its probe
# printed, and <var>_CANDIDATES to those tried.
function(ferry_torch_python var probe)
  set(candidates ${FERRY_PYTHON_EXECUTABLE})
  if(NOT candidates)
    find_program(_ferry_path_python3 NAMES python3 NO_CACHE)
    set(candidates ${_ferry_path_python3} /usr/bin/python3)
  endif()
  set(${var}_CANDIDATES "${candidates}" PARENT_SCOPE)
  foreach(py IN LISTS candidates)
    if(EXISTS "${py}")
      execute_process(COMMAND "${py}" -c "${probe}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                      ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(rc EQUAL 0)
        set(${var} "${py}" PARENT_SCOPE)
        set(${var}_OUTPUT "${out}" PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
  set(${var} "" PARENT_SCOPE)
endfunction()
