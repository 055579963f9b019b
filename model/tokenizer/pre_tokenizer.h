// The pre-tokenizer chain of a byte-level BPE tokenizer.json: ByteLevel (GPT-2 split pattern,
// add_prefix_space), Digits, Split and Sequences of these. Each step splits a piece of text into
// smaller pieces; the BPE model then runs on each final piece.
//
// Immutable after FromJson; Run may be called from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace mqa::tok {

// HF's SplitDelimiterBehavior: what becomes of the pattern's matches.
enum class SplitBehavior : uint8_t {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous,
};

// Calls emit for each match of GPT-2's split pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// in order; the matches cover `text` exactly. Ill-formed UTF-8 bytes count as [^\s\p{L}\p{N}].
void SplitGpt2(std::string_view text, absl::FunctionRef<void(std::string_view)> emit);

// The GPT-2 pattern as tokenizer.json spells it (a Split with it takes the fast path above).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  // `j` is tokenizer.json's "pre_tokenizer". A byte-level BPE needs a ByteLevel step, and it
  // must come last (later steps would see byte-mapped text). Unsupported types and options
  // fail here, naming them.
  static absl::StatusOr<PreTokenizer> FromJson(const nlohmann::json& j);

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Splits `text` (raw bytes, before byte-level mapping) and calls emit for each non-empty
  // final piece in order. A piece may live in a temporary buffer: use it inside emit only.
  void Run(std::string_view text, absl::FunctionRef<void(std::string_view)> emit) const;

  struct Step;  // defined in the .cc

 private:
  PreTokenizer();
  void RunFrom(size_t step, std::string_view piece,
               absl::FunctionRef<void(std::string_view)> emit) const;

  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace mqa::tok
