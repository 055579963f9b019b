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
