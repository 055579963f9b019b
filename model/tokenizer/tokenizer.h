// A Hugging Face tokenizer.json byte-level BPE tokenizer (GPT-2 / StarCoder style) in C++:
// Encode and Decode agree with HF `tokenizers` exactly for the supported features:
//   model BPE (merges as "a b" or ["a", "b"], unk_token, fuse_unk, ignore_merges),
//   added_tokens (special or not; single_word, lstrip, rstrip, normalized),
//   normalizer null, pre_tokenizer ByteLevel / Digits / Split / Sequence, decoder ByteLevel,
//   post_processor null or ByteLevel (which changes offsets only).
// Anything else fails at load with a Status naming it.
//
// Thread safety: immutable after loading (the BPE cache locks itself): every const method may
// be called from many threads at once. Cheap to move; not copyable.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mqa {

namespace tok {
class Bpe;
class PreTokenizer;
class AddedTokenMatcher;
}  // namespace tok

// The special tokens of a fill-in-the-middle prompt (StarCoder's <fim_prefix> spelling, or
// SantaCoder's <fim-prefix>).
struct FimTokens {
  int32_t prefix = -1;
  int32_t suffix = -1;
  int32_t middle = -1;
};

class Tokenizer {
 public:
  static absl::StatusOr<Tokenizer> FromFile(const std::string& path);
  // `source` names the text in error messages (a path, "<test>").
  static absl::StatusOr<Tokenizer> FromJson(std::string_view json_text, std::string_view source);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // HF's encode(text).ids. parse_special = false treats special tokens' text as plain text
  // (HF's encode_special_tokens = True), for user content that must not inject control
  // tokens; non-special added tokens are still matched. Bytes that are not valid UTF-8
  // (which HF cannot receive) are encoded as their byte tokens, so Decode gives them back
  // as U+FFFD.
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const;

  // HF's decode(ids, skip_special_tokens): unknown ids are dropped, bytes that are not valid
  // UTF-8 become U+FFFD (one per maximal ill-formed subpart). Note that HF's Python
  // decode() defaults to skip_special_tokens=True.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special = false) const;

  // The raw bytes `id` decodes to (before UTF-8 repair), or nullptr for an unknown id. The
  // streaming detokenizer builds on this.
  const std::string* TokenBytes(int32_t id) const;
  bool IsSpecial(int32_t id) const;

  // Token string -> id (vocab spelling, or an added token's content).
  std::optional<int32_t> TokenId(std::string_view token) const;
  // One past the largest id of the vocab and the added tokens (the embedding's row count).
  int64_t vocab_size() const;
  // <|endoftext|> when the tokenizer has it.
  std::optional<int32_t> eos_id() const;

  std::optional<FimTokens> fim_tokens() const;
  // The ids of `<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>`, equal to Encode of
  // that string (so special-token text inside prefix/suffix is parsed iff parse_special).
  // FailedPrecondition when the tokenizer has no FIM tokens.
  absl::StatusOr<std::vector<int32_t>> EncodeInfill(std::string_view prefix,
                                                    std::string_view suffix,
                                                    bool parse_special = true) const;

  struct Impl;  // opaque: defined in tokenizer.cc

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mqa
