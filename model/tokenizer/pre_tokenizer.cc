#include "model/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/tokenizer/unicode.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"

#ifdef MQA_TOKENIZER_WITH_ICU
#include "unicode/uregex.h"
#include "unicode/utext.h"
#endif

namespace mqa::tok {
namespace {

using Json = nlohmann::json;

struct CharAt {
  CharClass cls;
  uint32_t len;
};

inline CharAt ClassAt(std::string_view s, size_t i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return {ClassOf(b), 1};
  const Utf8Step st = DecodeUtf8(s, i);
  if (st.kind != Utf8Step::Kind::kValid) return {CharClass::kOther, st.len};
  return {ClassOf(st.cp), st.len};
}

// Length of a contraction ('s 't 're 've 'm 'll 'd) at text[i] == '\'', or 0.
size_t ContractionAt(std::string_view t, size_t i) {
  if (i + 1 >= t.size()) return 0;
  const char a = t[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= t.size()) return 0;
  const char b = t[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// A (begin, end) byte span of a pattern's match inside a piece.
struct Span {
  size_t begin;
  size_t end;
};

// HF's NormalizedString::split: the pattern's matches and the gaps between them, then the
// behaviour decides what is merged and what is dropped. Empty pieces are dropped.
void SplitByMatches(std::string_view piece, const std::vector<Span>& matches,
                    SplitBehavior behavior, bool invert,
                    absl::FunctionRef<void(std::string_view)> emit) {
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const Span& m : matches) {
    if (prev != m.begin) parts.push_back({prev, m.begin, invert});
    parts.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev != piece.size()) parts.push_back({prev, piece.size(), invert});

  std::vector<Part> out;  // is_match here means "remove"
  out.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      out = parts;
      break;
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) out.push_back({p.begin, p.end, false});
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back({p.begin, p.end, false});
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back({p.begin, p.end, false});
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  for (const Part& p : out) {
    if (!p.is_match && p.end > p.begin) emit(piece.substr(p.begin, p.end - p.begin));
  }
}

absl::StatusOr<SplitBehavior> ParseBehavior(const Json& j) {
  if (!j.is_string()) return absl::InvalidArgumentError("Split: \"behavior\" must be a string");
  const std::string s = j.get<std::string>();
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat("Split: unsupported behavior \"", s, "\""));
}

bool GetBool(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

}  // namespace

void SplitGpt2(std::string_view text, absl::FunctionRef<void(std::string_view)> emit) {
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    if (text[i] == '\'') {
      if (size_t len = ContractionAt(text, i); len != 0) {
        emit(text.substr(i, len));
        i += len;
        continue;
      }
    }
    CharAt c = ClassAt(text, i);
    size_t j = i;
    // " ?X+" for X in letters, numbers, others: a single space joins the run after it.
    if (text[i] == ' ' && i + 1 < n) {
      const CharAt d = ClassAt(text, i + 1);
      if (d.cls != CharClass::kSpace) {
        j = i + 1;
        c = d;
      }
    }
    if (c.cls != CharClass::kSpace) {
      j += c.len;
      while (j < n) {
        const CharAt e = ClassAt(text, j);
        if (e.cls != c.cls) break;
        j += e.len;
      }
      emit(text.substr(start, j - start));
      i = j;
      continue;
    }
    // "\s+(?!\S)|\s+": a whitespace run; when a non-space follows it, the run's last
    // character is left to start the next piece (unless the run is that one character).
    size_t k = i;
    size_t last = i;
    while (k < n) {
      const CharAt e = ClassAt(text, k);
      if (e.cls != CharClass::kSpace) break;
      last = k;
      k += e.len;
    }
    if (k < n && last > i) k = last;
    emit(text.substr(i, k - i));
    i = k;
  }
}

#ifdef MQA_TOKENIZER_WITH_ICU
namespace {
struct RegexCloser {
  void operator()(URegularExpression* r) const { uregex_close(r); }
};
using RegexPtr = std::unique_ptr<URegularExpression, RegexCloser>;
}  // namespace
#endif

struct PreTokenizer::Step {
  enum class Kind : uint8_t { kByteLevel, kDigits, kSplitGpt2, kSplitLiteral, kSplitRegex };
  Kind kind = Kind::kByteLevel;
  bool add_prefix_space = false;   // ByteLevel
  bool use_regex = true;           // ByteLevel
  bool individual_digits = false;  // Digits
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  std::string literal;  // kSplitLiteral
#ifdef MQA_TOKENIZER_WITH_ICU
  // A compiled regex holds its match state, so threads borrow clones from a pool.
  RegexPtr prototype;
  mutable std::mutex pool_mu;
  mutable std::vector<RegexPtr> pool;
#endif

  void FindMatches(std::string_view piece, std::vector<Span>* out) const;
  void Split(std::string_view piece, absl::FunctionRef<void(std::string_view)> emit) const;
};

void PreTokenizer::Step::FindMatches(std::string_view piece, std::vector<Span>* out) const {
  switch (kind) {
    case Kind::kSplitGpt2:
      SplitGpt2(piece, [&](std::string_view m) {
        const size_t b = static_cast<size_t>(m.data() - piece.data());
        out->push_back({b, b + m.size()});
      });
      return;
    case Kind::kSplitLiteral:
      for (size_t pos = piece.find(literal); pos != std::string_view::npos;
           pos = piece.find(literal, pos + literal.size())) {
        out->push_back({pos, pos + literal.size()});
      }
      return;
    case Kind::kSplitRegex: {
#ifdef MQA_TOKENIZER_WITH_ICU
      RegexPtr re;
      {
        std::lock_guard<std::mutex> lock(pool_mu);
        if (!pool.empty()) {
          re = std::move(pool.back());
          pool.pop_back();
        }
      }
      UErrorCode err = U_ZERO_ERROR;
      if (!re) re.reset(uregex_clone(prototype.get(), &err));
      MQA_CHECK(U_SUCCESS(err));
      UText* ut = utext_openUTF8(nullptr, piece.data(), static_cast<int64_t>(piece.size()), &err);
      uregex_setUText(re.get(), ut, &err);
      while (U_SUCCESS(err) && uregex_findNext(re.get(), &err)) {
        const int64_t b = uregex_start64(re.get(), 0, &err);
        const int64_t e = uregex_end64(re.get(), 0, &err);
        out->push_back({static_cast<size_t>(b), static_cast<size_t>(e)});
      }
      uregex_setText(re.get(), u"", 0, &err);
      utext_close(ut);
      std::lock_guard<std::mutex> lock(pool_mu);
      pool.push_back(std::move(re));
#endif
      return;
    }
    case Kind::kByteLevel:
    case Kind::kDigits:
      MQA_CHECK(false);  // not pattern splits
  }
}

void PreTokenizer::Step::Split(std::string_view piece,
                               absl::FunctionRef<void(std::string_view)> emit) const {
  switch (kind) {
    case Kind::kByteLevel: {
      if (add_prefix_space && piece[0] != ' ') {
        // HF prepends the space to every piece that reaches ByteLevel, not only the first.
        std::string prefixed = " ";
        prefixed.append(piece);
        if (use_regex) {
          SplitGpt2(prefixed, emit);
        } else {
          emit(prefixed);
        }
        return;
      }
      if (use_regex) {
        SplitGpt2(piece, emit);
      } else {
        emit(piece);
      }
      return;
    }
    case Kind::kDigits: {
      // Gaps of non-digits, and digits alone (individual) or in runs.
      size_t i = 0;
      size_t gap = 0;
      while (i < piece.size()) {
        if (static_cast<uint8_t>(piece[i]) < 0x80 && !IsNumeric(static_cast<uint8_t>(piece[i]))) {
          ++i;  // the common case, without decoding
          continue;
        }
        const Utf8Step st = DecodeUtf8(piece, i);
        const bool digit = st.kind == Utf8Step::Kind::kValid && IsNumeric(st.cp);
        if (!digit) {
          i += st.len;
          continue;
        }
        if (gap < i) emit(piece.substr(gap, i - gap));
        size_t end = i + st.len;
        while (!individual_digits && end < piece.size()) {
          const Utf8Step nx = DecodeUtf8(piece, end);
          if (nx.kind != Utf8Step::Kind::kValid || !IsNumeric(nx.cp)) break;
          end += nx.len;
        }
        emit(piece.substr(i, end - i));
        i = gap = end;
      }
      if (gap < piece.size()) emit(piece.substr(gap));
      return;
    }
    case Kind::kSplitGpt2:
      if (behavior == SplitBehavior::kIsolated && !invert) {
        SplitGpt2(piece, emit);  // its matches cover the text: isolated matches are the pieces
        return;
      }
      [[fallthrough]];
    case Kind::kSplitLiteral:
    case Kind::kSplitRegex: {
      std::vector<Span> matches;
      FindMatches(piece, &matches);
      SplitByMatches(piece, matches, behavior, invert, emit);
      return;
    }
  }
}

namespace {

absl::Status AddSteps(const Json& j, std::vector<std::unique_ptr<PreTokenizer::Step>>* steps) {
  using Step = PreTokenizer::Step;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return absl::InvalidArgumentError("pre_tokenizer: expected an object with a \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  auto step = std::make_unique<Step>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return absl::InvalidArgumentError("pre_tokenizer Sequence: missing \"pretokenizers\"");
    }
    for (const Json& sub : j["pretokenizers"]) RETURN_IF_ERROR(AddSteps(sub, steps));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    step->kind = Step::Kind::kByteLevel;
    step->add_prefix_space = GetBool(j, "add_prefix_space", true);
    step->use_regex = GetBool(j, "use_regex", true);
  } else if (type == "Digits") {
    step->kind = Step::Kind::kDigits;
    step->individual_digits = GetBool(j, "individual_digits", false);
  } else if (type == "Split") {
    ASSIGN_OR_RETURN(step->behavior, ParseBehavior(j.value("behavior", Json())));
    step->invert = GetBool(j, "invert", false);
    const Json& pattern = j.value("pattern", Json());
    if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      step->kind = Step::Kind::kSplitLiteral;
      step->literal = pattern["String"].get<std::string>();
      if (step->literal.empty()) {
        return absl::InvalidArgumentError("pre_tokenizer Split: empty String pattern");
      }
    } else if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      const std::string regex = pattern["Regex"].get<std::string>();
      if (regex == kGpt2Pattern) {
        step->kind = Step::Kind::kSplitGpt2;
      } else {
#ifdef MQA_TOKENIZER_WITH_ICU
        step->kind = Step::Kind::kSplitRegex;
        UErrorCode err = U_ZERO_ERROR;
        UParseError perr;
        UText* pattern_text = utext_openUTF8(nullptr, regex.data(),
                                             static_cast<int64_t>(regex.size()), &err);
        step->prototype.reset(uregex_openUText(pattern_text, 0, &perr, &err));
        utext_close(pattern_text);
        if (U_FAILURE(err)) {
          return absl::InvalidArgumentError(
              absl::StrCat("pre_tokenizer Split: cannot compile regex \"", regex, "\" (",
                           u_errorName(err), " at offset ", perr.offset, ")"));
        }
#else
        return absl::UnimplementedError(absl::StrCat(
            "pre_tokenizer Split with a Regex pattern other than GPT-2's needs a build with ICU;"
            " pattern: ", regex));
#endif
      }
    } else {
      return absl::InvalidArgumentError(
          "pre_tokenizer Split: \"pattern\" must be {\"String\": s} or {\"Regex\": r}");
    }
  } else {
    return absl::UnimplementedError(
        absl::StrCat("pre_tokenizer type \"", type,
                     "\" is not supported (supported: ByteLevel, Digits, Split, Sequence)"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

}  // namespace

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const Json& j) {
  if (j.is_null()) {
    return absl::UnimplementedError(
        "pre_tokenizer is null: only byte-level BPE (a ByteLevel pre-tokenizer) is supported");
  }
  PreTokenizer p;
  RETURN_IF_ERROR(AddSteps(j, &p.steps_));
  for (size_t i = 0; i < p.steps_.size(); ++i) {
    if (p.steps_[i]->kind != Step::Kind::kByteLevel) continue;
    if (i + 1 != p.steps_.size()) {
      return absl::UnimplementedError(
          "pre_tokenizer: a ByteLevel step must be the last one of the Sequence");
    }
    return p;
  }
  return absl::UnimplementedError(
      "pre_tokenizer: no ByteLevel step; only byte-level BPE tokenizers are supported");
}

void PreTokenizer::Run(std::string_view text,
                       absl::FunctionRef<void(std::string_view)> emit) const {
  if (!text.empty()) RunFrom(0, text, emit);
}

void PreTokenizer::RunFrom(size_t step, std::string_view piece,
                           absl::FunctionRef<void(std::string_view)> emit) const {
  if (step == steps_.size()) {
    emit(piece);
    return;
  }
  steps_[step]->Split(piece, [&](std::string_view sub) {
    if (!sub.empty()) RunFrom(step + 1, sub, emit);
  });
}

}  // namespace mqa::tok
