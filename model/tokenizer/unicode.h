// UTF-8 and Unicode character classes for the tokenizer. Character properties come from
// utf8proc (a maintained Debian library), never from hand-made tables. Stateless; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mqa::tok {

// One step of UTF-8 decoding at a position, following Unicode's "substitution of maximal
// subparts" (what Rust's String::from_utf8_lossy and so HF tokenizers do): an ill-formed
// sequence is the longest prefix of a would-be-valid sequence, at least one byte.
struct Utf8Step {
  enum class Kind : uint8_t { kValid, kInvalid, kTruncated };
  char32_t cp = 0;    // the scalar value when kValid
  uint8_t len = 1;    // bytes consumed, 1..4
  Kind kind = Kind::kValid;
};

// `pos` must be < s.size(). kTruncated: the bytes up to the end of `s` are a valid but
// incomplete prefix of a sequence (more bytes could complete it).
Utf8Step DecodeUtf8(std::string_view s, size_t pos);

bool IsValidUtf8(std::string_view s);

// Appends `bytes` as UTF-8, replacing each ill-formed maximal subpart (including a truncated
// tail) with U+FFFD, exactly like Rust's from_utf8_lossy.
void AppendUtf8Lossy(std::string_view bytes, std::string* out);

// Length of the trailing bytes of `bytes` that form a valid but incomplete UTF-8 sequence
// (0..3): what a streaming decoder must hold back until more bytes arrive.
size_t IncompleteUtf8Tail(std::string_view bytes);

void AppendUtf8(char32_t cp, std::string* out);

// The classes the GPT-2 split pattern distinguishes: \p{L}, \p{N}, \s (White_Space, as
// Oniguruma's \s), anything else.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };
CharClass ClassOfNonAscii(char32_t cp);
// The ASCII classes, computed from utf8proc when the library is loaded (the pre-tokenizer's
// hot loop runs on them; do not call ClassOf from another file's static initializer).
extern const std::array<CharClass, 128> kAsciiClasses;
inline CharClass ClassOf(char32_t cp) {
  return cp < 128 ? kAsciiClasses[cp] : ClassOfNonAscii(cp);
}

// Rust's char::is_numeric (general categories Nd, Nl, No).
bool IsNumericNonAscii(char32_t cp);
inline bool IsNumeric(char32_t cp) {
  return cp < 128 ? kAsciiClasses[cp] == CharClass::kNumber : IsNumericNonAscii(cp);
}
// Rust's char::is_whitespace (the White_Space property).
bool IsWhiteSpace(char32_t cp);
// Regex \w in Rust's regex crate, used by added tokens' single_word: letters, marks, decimal
// and letter numbers, connector punctuation.
bool IsWordChar(char32_t cp);

}  // namespace mqa::tok
