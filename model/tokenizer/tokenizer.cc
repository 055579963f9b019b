#include "model/tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer/added_tokens.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"

namespace mqa {

using Json = nlohmann::json;
using tok::AddedToken;

struct Tokenizer::Impl {
  std::unique_ptr<tok::Bpe> bpe;
  std::optional<tok::PreTokenizer> pre_tokenizer;
  // HF matches added tokens in two passes: those with normalized=false on the raw text, then
  // those with normalized=true on what is left (the normalizer is null, so on the same text).
  tok::AddedTokenMatcher raw_matcher;
  tok::AddedTokenMatcher normalized_matcher;
  absl::flat_hash_map<std::string, int32_t> added_ids;
  std::vector<std::string> token_bytes;  // by id: what the ByteLevel decoder makes of it
  std::vector<uint8_t> known;            // by id: 1 if the id has a token
  std::vector<uint8_t> special;          // by id: 1 for special added tokens
  int64_t vocab_size = 0;

  void EncodeText(std::string_view text, std::vector<int32_t>* ids) const {
    pre_tokenizer->Run(text, [&](std::string_view piece) { bpe->Encode(piece, ids); });
  }
};

namespace {

absl::Status CheckNullOr(const Json& j, const char* key, std::initializer_list<const char*> types) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  const std::string type = it->is_object() ? it->value("type", std::string()) : std::string();
  for (const char* t : types) {
    if (type == t) return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat(key, " ", it->dump().substr(0, 200),
                                               " is not supported"));
}

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& j) {
  std::vector<AddedToken> out;
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return out;
  if (!j["added_tokens"].is_array()) {
    return absl::InvalidArgumentError("\"added_tokens\" must be a list");
  }
  for (const Json& t : j["added_tokens"]) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string() || t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("bad added token ", t.dump()));
    }
    AddedToken a;
    a.id = t["id"].get<int32_t>();
    a.content = t["content"].get<std::string>();
    a.special = t.value("special", false);
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.normalized = t.value("normalized", !a.special);
    if (a.content.empty()) return absl::InvalidArgumentError("added token with empty content");
    out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer::Impl>> Build(const Json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  RETURN_IF_ERROR(CheckNullOr(j, "normalizer", {}));
  RETURN_IF_ERROR(CheckNullOr(j, "post_processor", {"ByteLevel"}));
  RETURN_IF_ERROR(CheckNullOr(j, "truncation", {}));
  RETURN_IF_ERROR(CheckNullOr(j, "padding", {}));
  if (!j.contains("decoder") || !j["decoder"].is_object() ||
      j["decoder"].value("type", std::string()) != "ByteLevel") {
    return absl::UnimplementedError(absl::StrCat(
        "decoder ", j.contains("decoder") ? j["decoder"].dump().substr(0, 200) : "(missing)",
        " is not supported (only ByteLevel)"));
  }
  auto impl = std::make_unique<Tokenizer::Impl>();
  if (!j.contains("model")) return absl::InvalidArgumentError("missing \"model\"");
  ASSIGN_OR_RETURN(impl->bpe, tok::Bpe::FromJson(j["model"]));
  ASSIGN_OR_RETURN(tok::PreTokenizer pre,
                   tok::PreTokenizer::FromJson(j.value("pre_tokenizer", Json())));
  impl->pre_tokenizer.emplace(std::move(pre));
  ASSIGN_OR_RETURN(std::vector<AddedToken> added, ParseAddedTokens(j));

  // HF ignores the ids written in added_tokens and assigns them again, in file order: the
  // vocab's id when the content is in the vocab, else the next id after the model's vocab and
  // the added tokens so far. Files saved by HF agree; a hand-edited file gets HF's ids too.
  {
    const auto model_size = static_cast<int64_t>(impl->bpe->vocab().size());
    std::optional<int64_t> max_added;
    absl::flat_hash_map<std::string, size_t> index_of;  // content -> position in `unique`
    std::vector<AddedToken> unique;
    for (AddedToken& a : added) {
      std::optional<int32_t> id;
      if (auto it = impl->added_ids.find(a.content); it != impl->added_ids.end()) {
        id = it->second;
      } else {
        id = impl->bpe->TokenToId(a.content);
      }
      if (!id) {
        int64_t next = model_size;
        if (max_added && (*max_added >= model_size || model_size == 0)) next = *max_added + 1;
        if (next > INT32_MAX) return absl::InvalidArgumentError("too many added tokens");
        id = static_cast<int32_t>(next);
      }
      a.id = *id;
      max_added = std::max<int64_t>(max_added.value_or(0), *id);
      impl->added_ids[a.content] = *id;
      // A repeated content keeps its place and takes the later options, as in HF.
      auto [it, inserted] = index_of.try_emplace(a.content, unique.size());
      if (inserted) {
        unique.push_back(std::move(a));
      } else {
        unique[it->second] = std::move(a);
      }
    }
    added = std::move(unique);
  }

  // id -> token string: added tokens take precedence over the model's vocab (as in HF).
  int64_t size = 0;
  for (const auto& [token, id] : impl->bpe->vocab()) size = std::max<int64_t>(size, id + 1);
  for (const AddedToken& a : added) size = std::max<int64_t>(size, a.id + 1);
  impl->vocab_size = size;
  std::vector<const std::string*> id_to_token(size, nullptr);
  for (const auto& [token, id] : impl->bpe->vocab()) id_to_token[id] = &token;
  impl->special.assign(size, 0);
  std::vector<AddedToken> raw, normalized;
  for (const AddedToken& a : added) {
    id_to_token[a.id] = &a.content;
    impl->special[a.id] = a.special ? 1 : 0;
    (a.normalized ? normalized : raw).push_back(a);
  }

  // The ByteLevel decoder maps each char of a token back to its byte; a token with any char
  // outside the table (an added token such as "a b") stands for its own UTF-8 bytes.
  absl::flat_hash_map<char32_t, uint8_t> char_to_byte;
  const auto table = tok::ByteToCharTable();
  for (int b = 0; b < 256; ++b) char_to_byte[table[b]] = static_cast<uint8_t>(b);
  impl->token_bytes.resize(size);
  impl->known.assign(size, 0);
  for (int64_t id = 0; id < size; ++id) {
    const std::string* token = id_to_token[id];
    if (token == nullptr) continue;
    impl->known[id] = 1;
    std::string bytes;
    bool mapped = true;
    for (size_t i = 0; i < token->size() && mapped;) {
      const tok::Utf8Step st = tok::DecodeUtf8(*token, i);
      auto it = char_to_byte.find(st.cp);
      if (st.kind != tok::Utf8Step::Kind::kValid || it == char_to_byte.end()) {
        mapped = false;
      } else {
        bytes.push_back(static_cast<char>(it->second));
        i += st.len;
      }
    }
    impl->token_bytes[id] = mapped ? std::move(bytes) : *token;
  }
  impl->raw_matcher = tok::AddedTokenMatcher(std::move(raw));
  impl->normalized_matcher = tok::AddedTokenMatcher(std::move(normalized));
  return impl;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<Tokenizer> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return FromJson(ss.str(), path);
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view json_text, std::string_view source) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": not valid JSON"));
  }
  auto impl = Build(j);
  if (!impl.ok()) {
    return absl::Status(impl.status().code(), absl::StrCat(std::string(source), ": ", impl.status().message()));
  }
  return Tokenizer(*std::move(impl));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  auto on_token = [&](int32_t id) { ids.push_back(id); };
  impl_->raw_matcher.Split(
      text, parse_special,
      [&](std::string_view gap) {
        impl_->normalized_matcher.Split(
            gap, parse_special, [&](std::string_view t) { impl_->EncodeText(t, &ids); },
            on_token);
      },
      on_token);
  return ids;
}

const std::string* Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size || !impl_->known[id]) return nullptr;
  return &impl_->token_bytes[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id];
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string* b = TokenBytes(id);
    if (b == nullptr || (skip_special && IsSpecial(id))) continue;
    bytes += *b;
  }
  std::string out;
  tok::AppendUtf8Lossy(bytes, &out);
  return out;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  auto it = impl_->added_ids.find(absl::string_view(token.data(), token.size()));
  if (it != impl_->added_ids.end()) return it->second;
  return impl_->bpe->TokenToId(token);
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::eos_id() const { return TokenId("<|endoftext|>"); }

std::optional<FimTokens> Tokenizer::fim_tokens() const {
  for (const char* sep : {"_", "-"}) {
    auto p = TokenId(absl::StrCat("<fim", sep, "prefix>"));
    auto s = TokenId(absl::StrCat("<fim", sep, "suffix>"));
    auto m = TokenId(absl::StrCat("<fim", sep, "middle>"));
    if (p && s && m) return FimTokens{*p, *s, *m};
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeInfill(std::string_view prefix,
                                                             std::string_view suffix,
                                                             bool parse_special) const {
  const std::optional<FimTokens> fim = fim_tokens();
  if (!fim) {
    return absl::FailedPreconditionError(
        "this tokenizer has no fill-in-the-middle tokens (<fim_prefix>, <fim_suffix>, "
        "<fim_middle> or SantaCoder's <fim-prefix>, ...): the model was not trained for infilling");
  }
  std::vector<int32_t> ids{fim->prefix};
  std::vector<int32_t> part = Encode(prefix, parse_special);
  ids.insert(ids.end(), part.begin(), part.end());
  ids.push_back(fim->suffix);
  part = Encode(suffix, parse_special);
  ids.insert(ids.end(), part.begin(), part.end());
  ids.push_back(fim->middle);
  return ids;
}

}  // namespace mqa
