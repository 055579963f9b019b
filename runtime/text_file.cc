#include "runtime/text_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace mqa {

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return text.str();
}

}  // namespace mqa
