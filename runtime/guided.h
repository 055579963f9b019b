// Guided decoding by a regular expression: vLLM's guided_regex and guided_choice, TGI's
// {"type": "regex"} grammar. A sample's text must match the pattern in full: each draw is limited
// to the tokens that keep the text a prefix of some match (RegexGuide::Mask, applied by the host
// sampler), the end of text (EOS) is allowed only once the text matches, and the sample stops by
// itself once nothing but the end can follow (RegexGuide::Complete).
//
// Syntax (a subset of Python's `re`, matched against UTF-8 bytes): literal characters (any UTF-8),
// `.` (any character but a newline), classes `[a-z_]` / `[^"\\]` (ASCII members and ranges; a
// negated class also admits every non-ASCII character), `\d \w \s \D \W \S`, escapes `\n \t \r
// \f \v \xHH \uHHHH` and `\` before any punctuation, groups `( )` and `(?: )`, alternation `|`,
// `* + ?` and `{m}`, `{m,}`, `{m,n}` (greedy or lazy `?` suffix: the same language), and `^` /
// `$` at the ends (a match is always of the whole text). Anything else (backreferences,
// lookaround, non-ASCII class members) is refused with the offending position.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mqa {

// What a guide needs of the tokenizer: each token id's raw bytes (empty: the token never appears
// in guided text, e.g. a special token) and the end-of-text id (-1: none).
struct GuideVocab {
  std::vector<std::string> bytes;
  int32_t eos = -1;
};

// A guide: an automaton over the text's bytes whose states are small integers, and, from it, the
// tokens allowed in each state. RegexGuide's states are a DFA's, built at Compile; GrammarGuide's
// (runtime/grammar.h) are a grammar parser's, found as texts reach them. Thread-safe: one guide
// serves every request with its pattern, from any thread.
class Guide {
 public:
  static constexpr int kDead = -1;
  static constexpr int start() { return 0; }
  virtual ~Guide() = default;

  // The text the guide was compiled from (its cache key).
  const std::string& pattern() const { return pattern_; }
  // The state after the text of `tokens` (EOS and other tokens without text change nothing);
  // kDead once the text can no longer match.
  int Advance(int state, absl::Span<const int32_t> tokens) const;
  virtual int AdvanceBytes(int state, std::string_view bytes) const = 0;
  // The text so far is a whole match.
  virtual bool Accepting(int state) const = 0;
  // Accepting, and no byte can follow: the text is a whole match and nothing longer is one.
  virtual bool Complete(int state) const = 0;
  // Sets every logit the guide forbids in `state` to -inf: tokens whose bytes would leave the
  // language (or that have none), and EOS unless the text already matches.
  void Mask(int state, absl::Span<float> logits) const;

 protected:
  Guide(std::string pattern, std::shared_ptr<const GuideVocab> vocab)
      : pattern_(std::move(pattern)), vocab_(std::move(vocab)) {}
  const GuideVocab& vocab() const { return *vocab_; }
  // Bit t: token t's bytes keep the text alive in `state`.
  using TokenBits = std::vector<uint64_t>;
  // A pass over the vocabulary's bytes with AdvanceBytes.
  virtual TokenBits ComputeLiveTokens(int state) const;

 private:
  // ComputeLiveTokens' result, computed on first use and kept — at most kMaxCachedStates of them
  // a guide (vocab / 8 bytes each: 6 KiB for StarCoder's), beyond which the cache starts over.
  static constexpr size_t kMaxCachedStates = 4096;
  std::shared_ptr<const TokenBits> LiveTokens(int state) const;

  const std::string pattern_;
  const std::shared_ptr<const GuideVocab> vocab_;
  mutable std::mutex mu_;
  mutable std::unordered_map<int, std::shared_ptr<const TokenBits>> live_tokens_;
};

class RegexGuide : public Guide {
 public:
  // A pattern's deterministic automaton has at most this many states (else InvalidArgument).
  static constexpr int kMaxStates = 20000;

  static absl::StatusOr<std::shared_ptr<const RegexGuide>> Compile(
      std::string_view pattern, std::shared_ptr<const GuideVocab> vocab);
  // guided_choice: the pattern matching exactly one of `choices` (each taken literally).
  static std::string ChoicePattern(absl::Span<const std::string> choices);

  int num_states() const { return static_cast<int>(next_.size()); }
  int AdvanceBytes(int state, std::string_view bytes) const override;
  bool Accepting(int state) const override { return state != kDead && accepting_[state]; }
  bool Complete(int state) const override { return state != kDead && complete_[state]; }

 private:
  RegexGuide(std::string pattern, std::shared_ptr<const GuideVocab> vocab)
      : Guide(std::move(pattern), std::move(vocab)) {}

  std::vector<std::array<int32_t, 256>> next_;  // byte transitions of the DFA
  std::vector<bool> accepting_, complete_;
};

}  // namespace mqa
