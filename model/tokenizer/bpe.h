// The BPE model of a byte-level tokenizer.json: vocab, ranked merges, and a bounded cache of
// per-piece results. It works on raw bytes: the byte-level mapping (byte -> printable char)
// is folded into the initial symbols, so pieces are never re-encoded as strings.
//
// Immutable after FromJson except for the cache, which is internally locked: Encode may be
// called from many threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace mqa::tok {

// GPT-2's byte <-> char table: printable bytes stand for themselves, the rest for U+0100...
std::array<char32_t, 256> ByteToCharTable();

class Bpe {
 public:
  // `j` is tokenizer.json's "model". Options that change results and that we do not implement
  // (dropout, continuing_subword_prefix, end_of_word_suffix, byte_fallback) fail here.
  static absl::StatusOr<std::unique_ptr<Bpe>> FromJson(const nlohmann::json& j);
  ~Bpe();

  // Appends the ids of one pre-tokenized piece (raw bytes).
  void Encode(std::string_view piece, std::vector<int32_t>* ids) const;

  // Vocab lookups by token string (byte-level spelling, e.g. "Ġhello").
  std::optional<int32_t> TokenToId(std::string_view token) const;
  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  Bpe();
  void Merge(std::string_view piece, std::vector<int32_t>* ids) const;

  struct MergeRule {
    int32_t rank;
    int32_t new_id;
  };
  struct Cache;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, MergeRule> merges_;  // key: left id << 32 | right id
  std::array<int32_t, 256> byte_id_{};               // id of each byte's char; -1 if absent
  std::array<char32_t, 256> byte_char_{};
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::unique_ptr<Cache> cache_;
};

}  // namespace mqa::tok
