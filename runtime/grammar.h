// Guided decoding by a context-free grammar: vLLM's guided_grammar in GBNF, the grammar format of
// llama.cpp (and of xgrammar, which vLLM uses for it). A sample's text must be a sentence of the
// grammar's `root` rule; the guide masks tokens as RegexGuide does (runtime/guided.h).
//
// GBNF: rules `name ::= alternatives`, one a line (a rule continues over lines inside parentheses,
// after `::=`, and on lines that start with `|`); `#` comments; terminals "literal" (escapes \n \r
// \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH), character classes [a-z_] / [^"\\] over Unicode code
// points, `.` (any character); rule names (letters, digits, `-`, `_`), groups `( )`, alternation
// `|`, and `* + ?`, `{m}`, `{m,}`, `{m,n}`, `{,n}` after a symbol. Refused with the place: syntax
// errors, an undefined rule, no `root`, and left recursion (a rule that can reach itself before
// reading a character), which the parser below cannot run.
//
// How it runs: a state is a set of parse stacks (each a list of positions in the grammar's rules,
// the top the next character class to match; a rule's last reference is not kept, so repetitions
// do not deepen it) plus the bytes of a character still incomplete. States are numbered as texts
// reach them and each (state, byte) transition is computed once, so the guide grows into the part
// of a DFA that texts use; a grammar with unbounded nesting has unboundedly many states, of which
// at most kMaxStates are kept (a text that would need more stops, as a dead end), and a text
// nests at most kMaxDepth rules deep.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/guided.h"

namespace mqa {

class GrammarGuide : public Guide {
 public:
  static constexpr int kMaxStates = 20000;
  // The most parse stacks a state may hold (an ambiguous grammar's can multiply), and the deepest
  // a stack may be (how far a text may nest): past either the text is a dead end.
  static constexpr int kMaxStacks = 512;
  static constexpr int kMaxDepth = 512;
  // The most symbols a grammar compiles to (repetition counts write copies out).
  static constexpr int kMaxElements = 200000;

  static absl::StatusOr<std::shared_ptr<const GrammarGuide>> Compile(
      std::string_view grammar, std::shared_ptr<const GuideVocab> vocab);

  // Any JSON object (OpenAI's json_object), nested to any depth, in GBNF.
  static const char* JsonObjectGrammar(bool compact = false);

  int AdvanceBytes(int state, std::string_view bytes) const override;
  bool Accepting(int state) const override;
  bool Complete(int state) const override;
  int num_states() const;

  // The grammar as compiled, one element a position (for tests): kinds and rule names.
  struct Element {
    enum Kind : uint8_t { kChars, kRule, kEnd } kind = kEnd;
    bool negated = false;
    int rule = -1;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // kChars: inclusive code point ranges
  };

 protected:
  TokenBits ComputeLiveTokens(int state) const override;

 private:
  using Stack = std::vector<int32_t>;  // positions in elements_, the top last
  struct StateKey {
    std::vector<Stack> stacks;  // sorted, unique; an empty stack: the root rule is complete
    std::string pending;        // the leading bytes of a character not yet complete
    bool operator<(const StateKey& o) const {
      return std::tie(stacks, pending) < std::tie(o.stacks, o.pending);
    }
  };
  struct StateInfo {
    const StateKey* key = nullptr;  // the key of its entry in ids_ (a map's keys stay put)
    bool accepting = false;
    bool complete = false;
    std::array<int32_t, 256> next;  // kUnknown until computed
  };
  static constexpr int32_t kUnknown = -2;

  GrammarGuide(std::string grammar, std::shared_ptr<const GuideVocab> vocab)
      : Guide(std::move(grammar), std::move(vocab)) {}

  // Stacks whose top is a character class (or empty: complete), reached from `stack` by entering
  // rules and leaving finished ones. False when they are more than kMaxStacks.
  bool Expand(Stack stack, std::vector<Stack>& out) const;
  bool Matches(const Element& e, uint32_t c) const;
  // Whether some code point that starts with `pending` matches some stack's class.
  bool AnyCharStartsWith(const std::vector<Stack>& stacks, std::string_view pending) const;
  // Caller holds mu_.
  int Intern(StateKey key) const;
  int StepLocked(int state, uint8_t byte) const;
  int AdvanceBytesLocked(int state, std::string_view bytes) const;

  std::vector<Element> elements_;
  std::vector<std::vector<int32_t>> rule_starts_;  // each rule's alternatives' first positions
  int root_ = -1;

  mutable std::mutex mu_;
  mutable std::vector<StateInfo> states_;
  mutable std::map<StateKey, int> ids_;
};

}  // namespace mqa
