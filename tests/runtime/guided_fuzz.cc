// libFuzzer target for guided decoding's patterns (runtime/guided.h) and grammars
// (runtime/grammar.h: an input whose pattern holds "::=" is a GBNF grammar): arbitrary bytes
// compile or are refused with InvalidArgument, never a crash, a hang or undefined behaviour; a
// compiled guide walks any text and masks a row in every state it reaches. Built with clang++
// (CMakeLists.txt beside).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "runtime/grammar.h"
#include "runtime/guided.h"
#include "runtime/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte splits the input: a pattern, then text to walk.
  if (size == 0) return 0;
  const size_t cut = 1 + data[0] % size;
  const std::string pattern(reinterpret_cast<const char*>(data) + 1, cut - 1);
  const std::string text(reinterpret_cast<const char*>(data) + cut, size - cut);
  static const std::shared_ptr<const mqa::GuideVocab> vocab = [] {
    auto v = std::make_shared<mqa::GuideVocab>();
    v->bytes = {"", "a", "b", "ab", "\xc3\xa9", "\"", "0", "12", " ", "\n", "\xc3", "\xa9"};
    v->eos = 0;
    return v;
  }();
  absl::StatusOr<std::shared_ptr<const mqa::Guide>> guide;
  if (pattern.find("::=") != std::string::npos) {
    guide = mqa::GrammarGuide::Compile(pattern, vocab);
  } else {
    guide = mqa::RegexGuide::Compile(pattern, vocab);
  }
  if (!guide.ok()) {
    MQA_CHECK(absl::IsInvalidArgument(guide.status()));
    return 0;
  }
  const mqa::Guide& g = **guide;
  int state = mqa::Guide::start();
  std::vector<float> row(vocab->bytes.size());
  for (char c : text) {
    std::fill(row.begin(), row.end(), 0.0f);
    g.Mask(state, absl::MakeSpan(row));
    for (size_t t = 0; t < row.size(); ++t) {
      // A token is allowed exactly when its bytes keep the text alive (EOS: when it matches).
      const bool allowed = row[t] != -std::numeric_limits<float>::infinity();
      const bool live = t == 0 ? g.Accepting(state)
                               : !vocab->bytes[t].empty() &&
                                     g.AdvanceBytes(state, vocab->bytes[t]) != mqa::Guide::kDead;
      MQA_CHECK(allowed == live);
    }
    if (g.Complete(state)) MQA_CHECK(g.Accepting(state));
    state = g.AdvanceBytes(state, std::string(1, c));
    if (state == mqa::Guide::kDead) break;
  }
  return 0;
}
