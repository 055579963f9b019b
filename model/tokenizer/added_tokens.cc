#include "model/tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "model/tokenizer/unicode.h"

namespace mqa::tok {
namespace {

// Whether s ends / begins with a \w character (ill-formed bytes are not one).
bool LastCharIsWord(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && s.size() - i < 4 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  const Utf8Step st = DecodeUtf8(s, i);
  return st.kind == Utf8Step::Kind::kValid && i + st.len == s.size() && IsWordChar(st.cp);
}

bool FirstCharIsWord(std::string_view s) {
  if (s.empty()) return false;
  const Utf8Step st = DecodeUtf8(s, 0);
  return st.kind == Utf8Step::Kind::kValid && IsWordChar(st.cp);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].content.empty()) continue;
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
    is_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])] = true;
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

void AddedTokenMatcher::Split(std::string_view text, bool parse_special,
                              absl::FunctionRef<void(std::string_view)> on_text,
                              absl::FunctionRef<void(int32_t)> on_token) const {
  if (tokens_.empty()) {
    if (!text.empty()) on_text(text);
    return;
  }
  size_t start_offset = 0;  // end of the last match taken
  size_t i = 0;
  while (i < text.size()) {
    if (!is_first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    const auto& candidates = by_first_byte_[static_cast<uint8_t>(text[i])];
    const AddedToken* hit = nullptr;
    for (uint32_t t : candidates) {
      const std::string& c = tokens_[t].content;
      if (c.size() <= text.size() - i && std::memcmp(text.data() + i, c.data(), c.size()) == 0) {
        hit = &tokens_[t];
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t start = i;
    size_t stop = i + hit->content.size();
    i = stop;  // the search resumes after the raw match, whatever is decided below
    if (hit->special && !parse_special) continue;
    if (hit->single_word &&
        (LastCharIsWord(text.substr(0, start)) || FirstCharIsWord(text.substr(stop)))) {
      continue;
    }
    if (hit->lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t b = s - 1;
        while (b > 0 && s - b < 4 && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
        const Utf8Step st = DecodeUtf8(text, b);
        if (st.kind != Utf8Step::Kind::kValid || b + st.len != s || !IsWhiteSpace(st.cp)) break;
        s = b;
      }
      start = std::max(s, start_offset);
    }
    if (hit->rstrip) {
      while (stop < text.size()) {
        const Utf8Step st = DecodeUtf8(text, stop);
        if (st.kind != Utf8Step::Kind::kValid || !IsWhiteSpace(st.cp)) break;
        stop += st.len;
      }
    }
    if (start_offset < start) on_text(text.substr(start_offset, start - start_offset));
    on_token(hit->id);
    start_offset = stop;
  }
  if (start_offset < text.size()) on_text(text.substr(start_offset));
}

}  // namespace mqa::tok
