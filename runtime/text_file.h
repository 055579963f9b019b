// Reading a small text file (a config, an index, a template) whole.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace mqa {

// The file's bytes. NotFound ("PATH: cannot open") when it cannot be opened, DataLoss ("PATH:
// read failed") when reading fails part-way.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace mqa
