# mqa_add_test(NAME name SOURCES a.cc b.cc LIBS lib1 lib2 [RANKS n] [LABELS l1 l2] [GPU])
#
# The one helper that adds a test. A plain test is a GoogleTest binary run by ctest. RANKS n runs
# it under mpirun with n ranks (oversubscribed, allowed as root). GPU marks a test that needs a
# CUDA device; it skips itself (GTEST_SKIP, reported as skipped, never as passed) where none is.
function(mqa_add_test)
  cmake_parse_arguments(T "GPU" "NAME;RANKS;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  set(labels ${T_LABELS})
  if(T_GPU)
    list(APPEND labels gpu)
  endif()
  if(T_RANKS)
    add_test(NAME ${T_NAME}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
                     ${MPIEXEC_NUMPROC_FLAG} ${T_RANKS} $<TARGET_FILE:${T_NAME}>)
    list(APPEND labels mpi)
  else()
    add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  endif()
  set_tests_properties(${T_NAME} PROPERTIES ENVIRONMENT "MQA_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(T_GPU)
    # A GPU test binary holds only GPU tests; without a device every one skips ("[  PASSED  ] 0
    # tests") and ctest reports it as skipped, not passed.
    set_tests_properties(${T_NAME} PROPERTIES SKIP_REGULAR_EXPRESSION "PASSED  \\][^0-9]*0 tests")
  endif()
  if(labels)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${labels}")
  endif()
  if(T_TIMEOUT)
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT})
  else()
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT 300)
  endif()
endfunction()

# mqa_add_script_test(NAME name COMMAND cmd args... [LABELS ...] [TIMEOUT s] [ENVIRONMENT k=v ...]
#                     [SERIAL] [NO_SKIPS] [SKIP_RETURN_CODE n])
#
# A test that runs a command (a Python test driving the built binaries, a fuzzer): MQA_SOURCE_DIR
# and mpirun's run-as-root variables are set. NO_SKIPS fails a pytest run that skipped anything
# (the server it needs is always started, so a skip would hide a failure).
function(mqa_add_script_test)
  cmake_parse_arguments(T "SERIAL;NO_SKIPS" "NAME;TIMEOUT;SKIP_RETURN_CODE"
                        "COMMAND;LABELS;ENVIRONMENT" ${ARGN})
  add_test(NAME ${T_NAME} COMMAND ${T_COMMAND})
  set_tests_properties(${T_NAME} PROPERTIES
    ENVIRONMENT "MQA_SOURCE_DIR=${PROJECT_SOURCE_DIR};OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;${T_ENVIRONMENT}")
  if(T_TIMEOUT)
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT})
  else()
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT 300)
  endif()
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
  if(T_SERIAL)
    set_tests_properties(${T_NAME} PROPERTIES RUN_SERIAL TRUE)
  endif()
  if(T_NO_SKIPS)
    set_tests_properties(${T_NAME} PROPERTIES FAIL_REGULAR_EXPRESSION "[0-9]+ skipped")
  endif()
  if(T_SKIP_RETURN_CODE)
    set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE ${T_SKIP_RETURN_CODE})
  endif()
endfunction()

# mqa_add_fuzz_test(NAME name SOURCES a.cc ... [PKG_MODULES m ...] [DEFINES -Dx ...]
#                   [DEPENDS headers ...] [CORPUS dir] [ARGS libFuzzer flags ...])
#
# A libFuzzer target and the ctest (label fuzz) that runs it for 10 seconds over the committed
# seeds in CORPUS (new inputs go to a folder in the build tree). The project compiles with g++ and
# libFuzzer needs clang, so the binary is built by invoking clang++ directly on the listed sources
# (ASan and UBSan, undefined behaviour fatal), linked against the pkg-config modules. Nothing is
# added without MQA_ENABLE_FUZZERS, clang++ or one of the modules.
function(mqa_add_fuzz_test)
  cmake_parse_arguments(F "" "NAME;CORPUS" "SOURCES;PKG_MODULES;DEFINES;DEPENDS;ARGS" ${ARGN})
  if(NOT MQA_ENABLE_FUZZERS)
    return()
  endif()
  find_program(MQA_CLANGXX NAMES clang++ clang++-14)
  if(NOT MQA_CLANGXX)
    message(STATUS "mqaserve: no clang++, fuzz test ${F_NAME} not built")
    return()
  endif()
  pkg_check_modules(MQA_FUZZ_${F_NAME} QUIET ${F_PKG_MODULES})
  if(NOT MQA_FUZZ_${F_NAME}_FOUND)
    message(STATUS "mqaserve: ${F_PKG_MODULES} not all found, fuzz test ${F_NAME} not built")
    return()
  endif()
  # nlohmann-json's include folder, unless it is a system one (-I/usr/include breaks libstdc++'s
  # include_next).
  set(includes -I${PROJECT_SOURCE_DIR} -I${PROJECT_BINARY_DIR})
  get_target_property(json_inc nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
  foreach(dir IN LISTS json_inc)
    if(dir AND NOT dir STREQUAL "/usr/include")
      list(APPEND includes -I${dir})
    endif()
  endforeach()
  set(bin ${CMAKE_BINARY_DIR}/tests/${F_NAME})
  add_custom_command(
    OUTPUT ${bin}
    COMMAND ${MQA_CLANGXX} -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined ${includes} ${F_DEFINES} ${F_SOURCES} -o ${bin}
            ${MQA_FUZZ_${F_NAME}_LDFLAGS}
    DEPENDS ${F_SOURCES} ${F_DEPENDS}
    COMMENT "clang++ -fsanitize=fuzzer: ${F_NAME}"
    COMMAND_EXPAND_LISTS VERBATIM)
  add_custom_target(${F_NAME} ALL DEPENDS ${bin})
  set(work ${CMAKE_BINARY_DIR}/tests/${F_NAME}_corpus)
  file(MAKE_DIRECTORY ${work})
  mqa_add_script_test(NAME ${F_NAME} LABELS fuzz TIMEOUT 120
    COMMAND ${bin} -max_total_time=10 -timeout=5 -rss_limit_mb=2048
            -artifact_prefix=${CMAKE_BINARY_DIR}/tests/${F_NAME}- ${F_ARGS} ${work} ${F_CORPUS})
endfunction()
