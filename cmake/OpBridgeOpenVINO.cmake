# opbridge_find_openvino(<AUTO|ON> [VERSION <exact version>] [HINTS <dirs...>])
#
# OpenVINO's CMake package (the runtime and its ONNX and PyTorch frontends) and the TBB it ships,
# for the OpenVINO side of op libraries (lib<name>_ov.so). Sets OPBRIDGE_OPENVINO_FOUND,
# OPBRIDGE_OPENVINO_VERSION and OPBRIDGE_OPENVINO_DIR in the caller's scope.
#   AUTO  found or not; not found is a status line, and lib<name>_ov.so is not built
#   ON    not found is an error
# VERSION: the precompiled OpenVINO adapter of an installed opbridge was compiled against one
# OpenVINO and links its versioned libopenvino.so: another version is refused (not found).
#
# Where OpenVINO is: OpenVINO_DIR, CMAKE_PREFIX_PATH, the HINTS, else the `openvino` package of the
# Python that builds (Python_EXECUTABLE as scikit-build-core passes it, Python3_EXECUTABLE, or
# python3 on PATH): the pip package ships its CMake package as openvino/cmake, no toolkit needed.
function(opbridge_find_openvino mode)
  cmake_parse_arguments(ARG "" "VERSION" "HINTS" ${ARGN})
  set(OPBRIDGE_OPENVINO_FOUND FALSE PARENT_SCOPE)
  set(hints ${ARG_HINTS})
  if(NOT OpenVINO_DIR OR OpenVINO_DIR MATCHES "NOTFOUND$")
    set(python ${Python_EXECUTABLE} ${Python3_EXECUTABLE})
    if(NOT python)
      find_program(OPBRIDGE_PYTHON3 python3)
      set(python ${OPBRIDGE_PYTHON3})
    endif()
    foreach(py ${python})
      execute_process(COMMAND ${py} -c "import os, openvino; print(os.path.join(os.path.dirname(openvino.__file__), 'cmake'))"
                      OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(dir AND EXISTS "${dir}/OpenVINOConfig.cmake")
        list(APPEND hints "${dir}")
      endif()
    endforeach()
  endif()
  set(version_args)
  if(ARG_VERSION)
    set(version_args ${ARG_VERSION} EXACT)
  endif()
  find_package(OpenVINO ${version_args} QUIET COMPONENTS Runtime ONNX PyTorch HINTS ${hints})
  if(NOT OpenVINO_FOUND)
    set(why "OpenVINO's CMake package not found (OpenVINO_DIR, CMAKE_PREFIX_PATH, or the `openvino` package of "
            "the Python that builds)")
    if(ARG_VERSION)
      set(why "OpenVINO ${ARG_VERSION} not found (the version opbridge's OpenVINO adapter was compiled against; "
              "found: ${OpenVINO_CONSIDERED_VERSIONS})")
    endif()
    string(CONCAT why ${why})
    if(mode STREQUAL "ON")
      message(FATAL_ERROR "opbridge: ${why}; install that `openvino` package, or set OPBRIDGE_WITH_OPENVINO=OFF")
    endif()
    message(STATUS "opbridge: ${why}: lib<name>_ov.so is not built")
    return()
  endif()
  # ov::parallel_for is inline TBB: the TBB the package ships beside OpenVINO, one pool in the process.
  if(NOT TARGET TBB::tbb)
    find_package(TBB REQUIRED CONFIG PATHS ${OpenVINO_DIR} NO_DEFAULT_PATH)
  endif()
  set(OPBRIDGE_OPENVINO_FOUND TRUE PARENT_SCOPE)
  set(OPBRIDGE_OPENVINO_VERSION ${OpenVINO_VERSION} PARENT_SCOPE)
  set(OPBRIDGE_OPENVINO_DIR ${OpenVINO_DIR} PARENT_SCOPE)
  message(STATUS "opbridge: OpenVINO ${OpenVINO_VERSION} at ${OpenVINO_DIR}: lib<name>_ov.so is built")
endfunction()
