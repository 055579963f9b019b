#include "model/tokenizer/unicode.h"

#include "utf8proc.h"

namespace mqa::tok {
namespace {

bool InRange(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

// utf8proc's general categories are a contiguous enum: L* = LU..LO, M* = MN..ME, N* = ND..NO.
int Category(char32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)); }
bool IsLetterCategory(int c) { return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO; }
bool IsMarkCategory(int c) { return c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME; }
bool IsNumberCategory(int c) { return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO; }

CharClass ClassOfSlow(char32_t cp) {
  if (IsWhiteSpace(cp)) return CharClass::kSpace;
  const int c = Category(cp);
  if (IsLetterCategory(c)) return CharClass::kLetter;
  if (IsNumberCategory(c)) return CharClass::kNumber;
  return CharClass::kOther;
}

}  // namespace

Utf8Step DecodeUtf8(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {b0, 1, Utf8Step::Kind::kValid};
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  char32_t cp;
  if (InRange(b0, 0xC2, 0xDF)) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (InRange(b0, 0xE0, 0xEF)) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (InRange(b0, 0xF0, 0xF4)) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, 1, Utf8Step::Kind::kInvalid};
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= avail) {
      return {0, static_cast<uint8_t>(k), Utf8Step::Kind::kTruncated};
    }
    const uint8_t b = p[k];
    const bool ok = k == 1 ? InRange(b, lo, hi) : InRange(b, 0x80, 0xBF);
    if (!ok) return {0, static_cast<uint8_t>(k), Utf8Step::Kind::kInvalid};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, static_cast<uint8_t>(need + 1), Utf8Step::Kind::kValid};
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = DecodeUtf8(s, i);
    if (st.kind != Utf8Step::Kind::kValid) return false;
    i += st.len;
  }
  return true;
}

void AppendUtf8Lossy(std::string_view bytes, std::string* out) {
  out->reserve(out->size() + bytes.size());
  size_t run = 0;  // start of the pending run of valid bytes, copied in one go
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = DecodeUtf8(bytes, i);
    if (st.kind == Utf8Step::Kind::kValid) {
      i += st.len;
      continue;
    }
    out->append(bytes.data() + run, i - run);
    out->append("\xEF\xBF\xBD");
    i += st.len;
    run = i;
  }
  out->append(bytes.data() + run, bytes.size() - run);
}

size_t IncompleteUtf8Tail(std::string_view bytes) {
  // A valid incomplete tail is at most 3 bytes and starts at a lead byte.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(bytes[n - back]);
    if (b < 0x80) return 0;
    if (b >= 0xC0) {
      const Utf8Step st = DecodeUtf8(bytes, n - back);
      return st.kind == Utf8Step::Kind::kTruncated ? back : 0;
    }
  }
  return 0;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const std::array<CharClass, 128> kAsciiClasses = [] {
  std::array<CharClass, 128> t{};
  for (char32_t c = 0; c < 128; ++c) t[c] = ClassOfSlow(c);
  return t;
}();

CharClass ClassOfNonAscii(char32_t cp) { return ClassOfSlow(cp); }

bool IsWhiteSpace(char32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85) return true;
  if (cp < 0xA0) return false;
  const int c = Category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool IsNumericNonAscii(char32_t cp) { return IsNumberCategory(Category(cp)); }

bool IsWordChar(char32_t cp) {
  if (cp == '_') return true;
  const int c = Category(cp);
  return IsLetterCategory(c) || IsMarkCategory(c) || c == UTF8PROC_CATEGORY_ND ||
         c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

}  // namespace mqa::tok
