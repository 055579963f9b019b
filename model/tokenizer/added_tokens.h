// Finds a tokenizer's added tokens inside text, the way HF's AddedVocabulary does: leftmost-
// longest matches, then the single_word / lstrip / rstrip options. Immutable; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"

namespace mqa::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }

  // Calls on_text for each stretch of `text` between matches and on_token for each match, in
  // order. With parse_special false, special tokens are not matched (their text stays text).
  void Split(std::string_view text, bool parse_special,
             absl::FunctionRef<void(std::string_view)> on_text,
             absl::FunctionRef<void(int32_t)> on_token) const;

 private:
  std::vector<AddedToken> tokens_;
  // Token indices by first byte, longest first: the first hit at a position is the longest.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
  std::array<bool, 256> is_first_byte_{};
};

}  // namespace mqa::tok
