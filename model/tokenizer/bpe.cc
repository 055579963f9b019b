#include "model/tokenizer/bpe.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "model/tokenizer/unicode.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"

// Lookups convert to absl::string_view explicitly: Debian's Abseil 20220623 keeps its own
// string_view type, which its heterogeneous hash lookup needs.

namespace mqa::tok {

using Json = nlohmann::json;

std::array<char32_t, 256> ByteToCharTable() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

// A bounded, sharded cache of piece -> ids. Like HF's, it stops inserting when full rather
// than evicting: code has a long tail of rare identifiers that would only churn it.
struct Bpe::Cache {
  static constexpr size_t kShards = 16;
  static constexpr size_t kCapacityPerShard = 4096;
  static constexpr size_t kMaxPieceBytes = 128;
  struct Shard {
    std::mutex mu;
    absl::flat_hash_map<std::string, absl::InlinedVector<int32_t, 4>> map;
  };
  std::array<Shard, kShards> shards;

  Shard& ShardFor(std::string_view piece) {
    return shards[absl::Hash<absl::string_view>()(absl::string_view(piece.data(), piece.size())) % kShards];
  }
};

Bpe::Bpe() : cache_(std::make_unique<Cache>()) {}
Bpe::~Bpe() = default;

absl::StatusOr<std::unique_ptr<Bpe>> Bpe::FromJson(const Json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("model: expected an object");
  if (j.contains("type") && j["type"] != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat("model type ", j["type"].dump(), " is not supported (only BPE)"));
  }
  auto non_null = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && !it->is_null();
  };
  if (non_null("dropout") && j["dropout"].is_number() && j["dropout"].get<double>() > 0) {
    return absl::UnimplementedError("model: BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (non_null(key) && !(j[key].is_string() && j[key].get<std::string>().empty())) {
      return absl::UnimplementedError(absl::StrCat("model: BPE ", key, " is not supported"));
    }
  }
  if (j.value("byte_fallback", false)) {
    return absl::UnimplementedError("model: BPE byte_fallback is not supported");
  }
  if (!j.contains("vocab") || !j["vocab"].is_object()) {
    return absl::InvalidArgumentError("model: missing \"vocab\" object");
  }
  auto bpe = std::unique_ptr<Bpe>(new Bpe());
  bpe->fuse_unk_ = j.value("fuse_unk", false);
  bpe->ignore_merges_ = j.value("ignore_merges", false);
  bpe->vocab_.reserve(j["vocab"].size());
  for (const auto& [token, id] : j["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("model: bad id for vocab token ", token));
    }
    bpe->vocab_[token] = id.get<int32_t>();
  }
  if (non_null("unk_token")) {
    const std::string unk = j["unk_token"].get<std::string>();
    auto id = bpe->TokenToId(unk);
    if (!id) return absl::InvalidArgumentError(absl::StrCat("model: unk_token ", unk, " not in vocab"));
    bpe->unk_id_ = *id;
  }
  bpe->byte_char_ = ByteToCharTable();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(bpe->byte_char_[b], &s);
    bpe->byte_id_[b] = bpe->TokenToId(s).value_or(-1);
  }

  const Json& merges = j.value("merges", Json::array());
  if (!merges.is_array()) return absl::InvalidArgumentError("model: \"merges\" must be a list");
  bpe->merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const Json& m : merges) {
    std::string left, right;
    if (m.is_string()) {  // "a b", the older spelling
      std::vector<std::string> parts = absl::StrSplit(m.get<std::string>(), ' ');
      if (parts.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("model: merge ", rank, " is not \"a b\": ", m.dump()));
      }
      left = std::move(parts[0]);
      right = std::move(parts[1]);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("model: bad merge ", rank, ": ", m.dump()));
    }
    const auto l = bpe->TokenToId(left);
    const auto r = bpe->TokenToId(right);
    const auto merged = bpe->TokenToId(left + right);
    if (!l || !r || !merged) {
      return absl::InvalidArgumentError(absl::StrCat("model: merge ", rank, " (", left, " ", right,
                                                     ") uses a token missing from the vocab"));
    }
    // A repeated pair keeps its last rank, as HF's map does.
    bpe->merges_[(static_cast<uint64_t>(*l) << 32) | static_cast<uint32_t>(*r)] = {rank, *merged};
    ++rank;
  }
  return bpe;
}

std::optional<int32_t> Bpe::TokenToId(std::string_view token) const {
  auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void Bpe::Encode(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.size() == 1 && byte_id_[static_cast<uint8_t>(piece[0])] >= 0) {
    ids->push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (piece.size() > Cache::kMaxPieceBytes) {
    Merge(piece, ids);
    return;
  }
  Cache::Shard& shard = cache_->ShardFor(piece);
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(absl::string_view(piece.data(), piece.size()));
    if (it != shard.map.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  Merge(piece, ids);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() < Cache::kCapacityPerShard) {
    shard.map.try_emplace(std::string(piece), ids->begin() + first, ids->end());
  }
}

void Bpe::Merge(std::string_view piece, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    std::string mapped;
    for (char c : piece) AppendUtf8(byte_char_[static_cast<uint8_t>(c)], &mapped);
    if (auto id = TokenToId(mapped)) {
      ids->push_back(*id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    // std::priority_queue pops the "largest": make that the lowest rank, then leftmost.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();

  // Initial symbols: one per byte (the byte-level char). A byte missing from the vocab
  // becomes unk (fused with a previous unk if asked) or is dropped, as in HF.
  bool pending_unk = false;
  auto push = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  for (char c : piece) {
    const int32_t id = byte_id_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      if (pending_unk) push(*unk_id_);
      pending_unk = false;
      push(id);
    } else if (unk_id_) {
      if (pending_unk && !fuse_unk_) push(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) push(*unk_id_);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  auto rule = [&](int32_t left, int32_t right) -> const MergeRule* {
    auto it = merges_.find((static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  auto push_candidate = [&](int32_t pos, const MergeRule& r) {
    heap.push_back({r.rank, pos, r.new_id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) {
    if (const MergeRule* r = rule(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({r->rank, i, r->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end());
  // HF's order: the lowest-ranked pair first, leftmost on ties; stale candidates (a side
  // already merged away, or a pair that no longer makes new_id) are skipped.
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const MergeRule* r = rule(left.id, right.id);
    if (r == nullptr || r->new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeRule* pr = rule(symbols[left.prev].id, left.id)) push_candidate(left.prev, *pr);
    }
    if (left.next >= 0) {
      if (const MergeRule* nr = rule(left.id, symbols[left.next].id)) push_candidate(top.pos, *nr);
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace mqa::tok
