// The UTF-8 pieces the guides' byte automata share (runtime/guided.h, runtime/grammar.h):
// header-only, so that their fuzz targets, which compile the guides' sources alone, need nothing
// more. The tokenizer's decoder (model/tokenizer/unicode.h) follows Unicode's lossy rules for any
// bytes; these read a sequence a byte at a time and leave the verdict to the caller.
#pragma once

#include <cstdint>

namespace mqa::utf8 {

// The length of the sequence `lead` starts: 1 to 4, 0 for a continuation byte or a byte no
// sequence starts with (0xF8 and above).
inline int SequenceLength(uint8_t lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 0;
}

inline bool IsContinuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// The code point bits a lead byte of a `length`-byte sequence carries; each continuation byte
// adds six (code point << 6 | (byte & 0x3F)).
inline uint32_t LeadBits(uint8_t lead, int length) {
  return length == 1 ? lead : lead & (0x7F >> length);
}

// The smallest code point a `length`-byte sequence may encode (a smaller one is overlong).
inline constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};

}  // namespace mqa::utf8
