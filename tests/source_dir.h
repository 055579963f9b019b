// The source tree's root for tests that read fixtures: $MQA_SOURCE_DIR (set by ctest), else the
// MQA_DEFAULT_SOURCE_DIR the test target is compiled with (a binary run by hand).
#pragma once

#include <cstdlib>
#include <string>

namespace mqa::testing {

inline std::string SourceDir() {
  const char* dir = std::getenv("MQA_SOURCE_DIR");
  return dir != nullptr ? dir : MQA_DEFAULT_SOURCE_DIR;
}

}  // namespace mqa::testing
