# opbridge_find_torch(): the PyTorch C++ headers as the imported target opbridge::torch_headers,
# and OPBRIDGE_TORCH_VERSION / OPBRIDGE_TORCH_PREFIX.
#
# torch's own CMake package (find_package(Torch)) is not used, on purpose:
#   - a CUDA build of torch (what pip installs by default) makes it demand the CUDA toolkit, even
#     for code that never touches CUDA; opbridge's CPU build must not need one;
#   - it links libtorch_cpu / libc10 / libgomp, and opbridge's PyTorch libraries link no torch
#     library at all: they are only ever loaded into a process that has imported torch, and take
#     its symbols from there (opbridge's loader makes libtorch_cpu's symbols global first). The
#     wheel then names no library outside the manylinux policies, and a build serves the torch
#     that is loaded, never a second copy.
# What the headers need is read from torch's package files as text: the install prefix (include/),
# the C++ standard TorchConfig.cmake gives its target (C++20 from torch 2.14's headers on) and the
# libstdc++ ABI it was built with, where it says.
#
# Where torch is: Torch_DIR, else a TorchConfig.cmake on CMAKE_PREFIX_PATH (a libtorch
# distribution), else the torch of the Python that builds (Python3_EXECUTABLE, or python3 on PATH).
function(opbridge_find_torch)
  if(TARGET opbridge::torch_headers)
    return()
  endif()
  # The places find_package(Torch) would look at: Torch_DIR, and each prefix (a libtorch folder,
  # or torch's share/cmake as torch.utils.cmake_prefix_path names it).
  set(opbridge_torch_config "")
  set(ENV_PREFIX_PATH "$ENV{CMAKE_PREFIX_PATH}")
  string(REPLACE ":" ";" ENV_PREFIX_PATH "${ENV_PREFIX_PATH}")
  foreach(p ${Torch_DIR} ${CMAKE_PREFIX_PATH} ${ENV_PREFIX_PATH})
    foreach(candidate "${p}/TorchConfig.cmake" "${p}/Torch/TorchConfig.cmake" "${p}/share/cmake/Torch/TorchConfig.cmake")
      if(NOT opbridge_torch_config AND EXISTS "${candidate}")
        set(opbridge_torch_config "${candidate}")
      endif()
    endforeach()
  endforeach()
  if(NOT opbridge_torch_config)
    if(NOT Python3_EXECUTABLE)
      find_package(Python3 COMPONENTS Interpreter QUIET)
    endif()
    if(Python3_EXECUTABLE)
      execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                      OUTPUT_VARIABLE prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(prefix AND EXISTS "${prefix}/Torch/TorchConfig.cmake")
        set(opbridge_torch_config "${prefix}/Torch/TorchConfig.cmake")
      endif()
    endif()
  endif()
  if(NOT opbridge_torch_config)
    message(FATAL_ERROR "PyTorch not found (no TorchConfig.cmake under Torch_DIR or CMAKE_PREFIX_PATH, and "
                        "no torch in ${Python3_EXECUTABLE}): install torch in the Python that builds opbridge, "
                        "or configure with -DOPBRIDGE_WITH_TORCH=OFF to build the ONNX Runtime side alone")
  endif()
  get_filename_component(dir "${opbridge_torch_config}" DIRECTORY)
  get_filename_component(prefix "${dir}/../../.." ABSOLUTE)
  if(NOT EXISTS "${prefix}/include/torch/library.h")
    message(FATAL_ERROR "PyTorch at ${prefix} has no C++ headers (include/torch/library.h)")
  endif()

  file(STRINGS "${dir}/TorchConfigVersion.cmake" line REGEX "set\\(PACKAGE_VERSION \"" LIMIT_COUNT 1)
  string(REGEX REPLACE ".*\"([^\"]*)\".*" "\\1" version "${line}")
  # CXX_STANDARD on torch's target is not propagated to its users by CMake: it is read here.
  set(standard 17)
  file(STRINGS "${opbridge_torch_config}" line REGEX "CXX_STANDARD[ \t]+[0-9]+" LIMIT_COUNT 1)
  if(line)
    string(REGEX REPLACE ".*CXX_STANDARD[ \t]+([0-9]+).*" "\\1" standard "${line}")
  endif()
  set(definitions)
  file(STRINGS "${opbridge_torch_config}" line REGEX "_GLIBCXX_USE_CXX11_ABI=[01]" LIMIT_COUNT 1)
  if(line)
    string(REGEX REPLACE ".*(_GLIBCXX_USE_CXX11_ABI=[01]).*" "\\1" definitions "${line}")
  endif()

  add_library(opbridge::torch_headers INTERFACE IMPORTED)
  set_target_properties(opbridge::torch_headers PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${prefix}/include;${prefix}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_FEATURES "cxx_std_${standard}"
    INTERFACE_COMPILE_DEFINITIONS "${definitions}")
  set(OPBRIDGE_TORCH_VERSION "${version}" PARENT_SCOPE)
  set(OPBRIDGE_TORCH_PREFIX "${prefix}" PARENT_SCOPE)
  message(STATUS "opbridge: PyTorch ${version} headers at ${prefix} (C++${standard}; no torch library linked)")
endfunction()
