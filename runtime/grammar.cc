#include "runtime/grammar.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "runtime/status.h"
#include "runtime/utf8.h"

namespace mqa {
namespace {

using Element = GrammarGuide::Element;
using Sequence = std::vector<Element>;
using Alternatives = std::vector<Sequence>;

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kUnbounded = -1;
constexpr int kMaxRepeat = 1000;

Element CharsElement(uint32_t lo, uint32_t hi) {
  Element e;
  e.kind = Element::kChars;
  e.ranges = {{lo, hi}};
  return e;
}

Element RuleElement(int rule) {
  Element e;
  e.kind = Element::kRule;
  e.rule = rule;
  return e;
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// GBNF text into rules of alternatives of sequences; groups and repetitions become rules of
// their own.
class GbnfParser {
 public:
  explicit GbnfParser(std::string_view source) : src_(source) {}

  absl::Status Parse() {
    SkipSpace(true);
    while (pos_ < src_.size()) {
      const size_t at = pos_;
      const std::string name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace(false);
      if (src_.substr(pos_, 3) != "::=") {
        return Error(absl::StrCat("expected ::= after ", name,
                                  " (GBNF rules are `name ::= ...`; Lark grammars are not read)"));
      }
      pos_ += 3;
      SkipSpace(true);
      ASSIGN_OR_RETURN(Alternatives alternatives, Alternates(false));
      const int id = RuleId(name);
      if (defined_[id]) {
        pos_ = at;
        return Error(absl::StrCat("rule '", name, "' is defined twice"));
      }
      rules_[id] = std::move(alternatives);
      defined_[id] = true;
      SkipSpace(false);
      if (pos_ < src_.size() && src_[pos_] != '\n') return Error("unexpected character");
      SkipSpace(true);
    }
    for (size_t id = 0; id < rules_.size(); ++id) {
      if (!defined_[id]) {
        return absl::InvalidArgumentError(
            absl::StrCat("guided grammar: rule '", names_[id], "' is used but not defined"));
      }
    }
    if (ids_.find("root") == ids_.end()) {
      return absl::InvalidArgumentError("guided grammar: no 'root' rule");
    }
    return absl::OkStatus();
  }

  std::vector<Alternatives> rules_;
  std::vector<std::string> names_;
  std::map<std::string, int> ids_;

 private:
  absl::Status Error(const std::string& what) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("guided grammar: ", what, " at line ", line, ", column ", column));
  }

  int RuleId(const std::string& name) {
    auto [it, inserted] = ids_.emplace(name, static_cast<int>(rules_.size()));
    if (inserted) {
      rules_.emplace_back();
      names_.push_back(name);
      defined_.push_back(false);
    }
    return it->second;
  }

  int NewRule(const std::string& base) {
    const int id = static_cast<int>(rules_.size());
    const std::string name = absl::StrCat(base, "-", id);  // '-' then digits: no user name clash
    ids_.emplace(name, id);
    rules_.emplace_back();
    names_.push_back(name);
    defined_.push_back(true);
    return id;
  }

  void SkipSpace(bool newlines) {
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    const size_t start = pos_;
    while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
    return std::string(src_.substr(start, pos_ - start));
  }

  absl::StatusOr<Alternatives> Alternates(bool nested) {
    Alternatives alternatives;
    while (true) {
      ASSIGN_OR_RETURN(Sequence sequence, Sequence_(nested));
      alternatives.push_back(std::move(sequence));
      SkipSpace(nested);
      if (!nested) {  // a top-level rule goes on over a line break before `|`
        const size_t save = pos_;
        SkipSpace(true);
        if (pos_ >= src_.size() || src_[pos_] != '|') pos_ = save;
      }
      if (pos_ >= src_.size() || src_[pos_] != '|') return alternatives;
      ++pos_;
      SkipSpace(true);
    }
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      if (pos_ >= src_.size()) return Error("a short escape");
      const char c = src_[pos_];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return Error("a bad hex digit in an escape");
      value = value * 16 + static_cast<uint32_t>(d);
    }
    if (value > kMaxCodePoint) return Error("an escape past U+10FFFF");
    return value;
  }

  // One character of a literal or class, escaped or UTF-8.
  absl::StatusOr<uint32_t> Char() {
    if (pos_ >= src_.size()) return Error("unexpected end");
    const auto lead = static_cast<unsigned char>(src_[pos_]);
    if (lead == '\\') {
      if (++pos_ >= src_.size()) return Error("unexpected end after \\");
      const char e = src_[pos_++];
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<uint32_t>(e);
        case 'x':
          return Hex(2);
        case 'u':
          return Hex(4);
        case 'U':
          return Hex(8);
        default:
          --pos_;
          return Error(absl::StrCat("unknown escape \\", std::string(1, e)));
      }
    }
    const int length = utf8::SequenceLength(lead);
    if (length == 0 || pos_ + length > src_.size()) return Error("invalid UTF-8");
    uint32_t cp = utf8::LeadBits(lead, length);
    for (int i = 1; i < length; ++i) {
      const auto b = static_cast<unsigned char>(src_[pos_ + i]);
      if (!utf8::IsContinuation(b)) return Error("invalid UTF-8");
      cp = cp << 6 | (b & 0x3F);
    }
    pos_ += length;
    return cp;
  }

  absl::StatusOr<int> Count() {
    const size_t start = pos_;
    while (pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '9') ++pos_;
    if (pos_ == start) return kUnbounded;
    if (pos_ - start > 4) return Error("a repetition count over 1000");
    const int n = std::stoi(std::string(src_.substr(start, pos_ - start)));
    if (n > kMaxRepeat) return Error("a repetition count over 1000");
    return n;
  }

  // The symbol from `last` to the end of `sequence`, repeated min to max (kUnbounded) times.
  void Repeat(Sequence& sequence, size_t last, int min, int max) {
    Sequence symbol(sequence.begin() + static_cast<std::ptrdiff_t>(last), sequence.end());
    sequence.resize(last);
    if (symbol.empty()) return;
    Element one = symbol[0];
    if (symbol.size() > 1) {
      const int id = NewRule("repeated");
      rules_[id] = {symbol};
      one = RuleElement(id);
    }
    for (int i = 0; i < min; ++i) sequence.push_back(one);
    if (max == kUnbounded) {  // R ::= one R | (empty): right recursion, which the parser runs
      const int id = NewRule("star");
      rules_[id] = {{one, RuleElement(id)}, {}};
      sequence.push_back(RuleElement(id));
    } else if (max > min) {  // nested optionals: (one (one (...)?)?)?
      int inner = -1;
      for (int k = 0; k < max - min; ++k) {
        const int id = NewRule("optional");
        Sequence body = {one};
        if (inner >= 0) body.push_back(RuleElement(inner));
        rules_[id] = {body, {}};
        inner = id;
      }
      sequence.push_back(RuleElement(inner));
    }
  }

  // (Named with a trailing underscore: `Sequence` is the type.)
  absl::StatusOr<Sequence> Sequence_(bool nested) {
    Sequence sequence;
    size_t last = std::string_view::npos;  // where the last symbol starts
    while (true) {
      SkipSpace(nested);
      if (pos_ >= src_.size()) break;
      const char c = src_[pos_];
      if (c == '"') {
        last = sequence.size();
        ++pos_;
        while (pos_ < src_.size() && src_[pos_] != '"') {
          ASSIGN_OR_RETURN(const uint32_t cp, Char());
          sequence.push_back(CharsElement(cp, cp));
        }
        if (pos_ >= src_.size()) return Error("an unterminated literal");
        ++pos_;
      } else if (c == '[') {
        last = sequence.size();
        ++pos_;
        Element e;
        e.kind = Element::kChars;
        if (pos_ < src_.size() && src_[pos_] == '^') {
          e.negated = true;
          ++pos_;
        }
        while (pos_ < src_.size() && src_[pos_] != ']') {
          ASSIGN_OR_RETURN(const uint32_t lo, Char());
          uint32_t hi = lo;
          if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
            ++pos_;
            ASSIGN_OR_RETURN(hi, Char());
            if (hi < lo) return Error("a class range whose end is before its start");
          }
          e.ranges.push_back({lo, hi});
        }
        if (pos_ >= src_.size()) return Error("an unterminated character class");
        ++pos_;
        sequence.push_back(std::move(e));
      } else if (c == '.') {
        last = sequence.size();
        ++pos_;
        sequence.push_back(CharsElement(0, kMaxCodePoint));
      } else if (IsNameChar(c)) {
        last = sequence.size();
        sequence.push_back(RuleElement(RuleId(Name())));
      } else if (c == '(') {
        ++pos_;
        SkipSpace(true);
        ASSIGN_OR_RETURN(Alternatives group, Alternates(true));
        SkipSpace(true);
        if (pos_ >= src_.size() || src_[pos_] != ')') return Error("expected )");
        ++pos_;
        const int id = NewRule("group");
        rules_[id] = std::move(group);
        last = sequence.size();
        sequence.push_back(RuleElement(id));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == std::string_view::npos) return Error("a repetition with nothing before it");
        int min = 0, max = kUnbounded;
        ++pos_;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        if (c == '{') {
          SkipSpace(false);
          ASSIGN_OR_RETURN(min, Count());
          if (min == kUnbounded) min = 0;
          SkipSpace(false);
          max = min;
          if (pos_ < src_.size() && src_[pos_] == ',') {
            ++pos_;
            SkipSpace(false);
            ASSIGN_OR_RETURN(max, Count());
            SkipSpace(false);
          }
          if (pos_ >= src_.size() || src_[pos_] != '}') return Error("expected }");
          ++pos_;
          if (max != kUnbounded && max < min) return Error("a repetition {m,n} with n < m");
        }
        Repeat(sequence, last, min, max);
        last = sequence.empty() ? std::string_view::npos : sequence.size() - 1;
      } else {
        break;  // |, ), the end of the line
      }
    }
    return sequence;
  }

  std::string_view src_;
  size_t pos_ = 0;
  std::vector<bool> defined_;
};

// A rule that can reach itself before reading a character cannot be run top-down.
absl::Status CheckNoLeftRecursion(const GbnfParser& p) {
  const size_t n = p.rules_.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alt : p.rules_[r]) {
        const bool all = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
          return e.kind == Element::kRule && nullable[e.rule];
        });
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int>> left(n);  // rules reachable before any character
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& alt : p.rules_[r]) {
      for (const Element& e : alt) {
        if (e.kind != Element::kRule) break;
        left[r].push_back(e.rule);
        if (!nullable[e.rule]) break;
      }
    }
  }
  std::vector<int> mark(n, 0);  // 0 new, 1 on the path, 2 done
  std::function<int(int)> visit = [&](int r) -> int {
    mark[r] = 1;
    for (int s : left[r]) {
      if (mark[s] == 1) return s;
      if (mark[s] == 0) {
        if (const int found = visit(s); found >= 0) return found;
      }
    }
    mark[r] = 2;
    return -1;
  };
  for (size_t r = 0; r < n; ++r) {
    if (mark[r] != 0) continue;
    if (const int found = visit(static_cast<int>(r)); found >= 0) {
      const std::string& name = p.names_[found];
      const bool repetition = name.rfind("star-", 0) == 0 || name.rfind("repeated-", 0) == 0;
      return absl::InvalidArgumentError(absl::StrCat(
          "guided grammar: rule '", name,
          "' is left-recursive (it can reach itself before reading a character)",
          repetition ? "; a repetition of something that can be empty, such as (x?)*, is" : ""));
    }
  }
  return absl::OkStatus();
}

// The code points whose UTF-8 starts with `prefix` (1 to 3 bytes of a longer character):
// [lo, hi], or false when no character starts so.
bool PrefixRange(std::string_view prefix, uint32_t* lo, uint32_t* hi) {
  const auto lead = static_cast<unsigned char>(prefix[0]);
  const int length = utf8::SequenceLength(lead);
  if (length == 0 || static_cast<int>(prefix.size()) >= length) return false;
  uint32_t low = utf8::LeadBits(lead, length), high = low;
  for (int i = 1; i < length; ++i) {
    if (i < static_cast<int>(prefix.size())) {
      const auto b = static_cast<unsigned char>(prefix[i]);
      if (!utf8::IsContinuation(b)) return false;
      low = low << 6 | (b & 0x3F);
      high = high << 6 | (b & 0x3F);
    } else {
      low = low << 6;
      high = high << 6 | 0x3F;
    }
  }
  *lo = std::max(low, utf8::kMinForLength[length]);
  *hi = std::min(high, kMaxCodePoint);
  return *lo <= *hi;
}

bool ClassIntersects(const Element& e, uint32_t lo, uint32_t hi) {
  if (!e.negated) {
    return std::any_of(e.ranges.begin(), e.ranges.end(),
                       [&](const auto& r) { return r.first <= hi && r.second >= lo; });
  }
  uint32_t next = lo;  // ranges are sorted for a negated class: find a gap in [lo, hi]
  for (const auto& [a, b] : e.ranges) {
    if (b < next) continue;
    if (a > next) return true;
    if (b >= hi) return false;
    next = b + 1;
  }
  return next <= hi;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const GrammarGuide>> GrammarGuide::Compile(
    std::string_view grammar, std::shared_ptr<const GuideVocab> vocab) {
  GbnfParser parser(grammar);
  RETURN_IF_ERROR(parser.Parse());
  RETURN_IF_ERROR(CheckNoLeftRecursion(parser));
  size_t elements = 0;
  for (const Alternatives& rule : parser.rules_) {
    for (const Sequence& alt : rule) elements += alt.size() + 1;
  }
  if (elements > static_cast<size_t>(kMaxElements)) {
    return absl::InvalidArgumentError(
        absl::StrCat("guided grammar: too large once its repetitions are written out (", elements,
                     " symbols, at most ", kMaxElements, ")"));
  }
  std::shared_ptr<GrammarGuide> guide(new GrammarGuide(std::string(grammar), std::move(vocab)));
  guide->root_ = parser.ids_.at("root");
  guide->rule_starts_.resize(parser.rules_.size());
  for (size_t r = 0; r < parser.rules_.size(); ++r) {
    for (const Sequence& alt : parser.rules_[r]) {
      guide->rule_starts_[r].push_back(static_cast<int32_t>(guide->elements_.size()));
      for (Element e : alt) {
        if (e.negated) std::sort(e.ranges.begin(), e.ranges.end());
        guide->elements_.push_back(std::move(e));
      }
      guide->elements_.push_back(Element{});  // kEnd
    }
  }
  StateKey start;
  for (int32_t first : guide->rule_starts_[guide->root_]) {
    if (!guide->Expand({first}, start.stacks)) {
      return absl::InvalidArgumentError(absl::StrCat("guided grammar: more than ", kMaxStacks,
                                                     " ways to parse the start (too ambiguous)"));
    }
  }
  std::sort(start.stacks.begin(), start.stacks.end());
  start.stacks.erase(std::unique(start.stacks.begin(), start.stacks.end()), start.stacks.end());
  std::lock_guard<std::mutex> lock(guide->mu_);
  guide->Intern(std::move(start));
  return std::shared_ptr<const GrammarGuide>(std::move(guide));
}

bool GrammarGuide::Expand(Stack stack, std::vector<Stack>& out) const {
  std::vector<Stack> work = {std::move(stack)};
  int produced = 0;
  while (!work.empty()) {
    Stack s = std::move(work.back());
    work.pop_back();
    while (true) {
      if (s.empty()) break;
      const int32_t p = s.back();
      const Element& e = elements_[p];
      if (e.kind == Element::kEnd) {
        s.pop_back();
        continue;
      }
      if (e.kind == Element::kChars) break;
      if (s.size() >= static_cast<size_t>(kMaxDepth)) return false;
      s.pop_back();  // a rule: enter it, remembering what follows unless nothing does
      if (elements_[p + 1].kind != Element::kEnd) s.push_back(p + 1);
      const std::vector<int32_t>& starts = rule_starts_[e.rule];
      for (size_t i = 1; i < starts.size(); ++i) {
        Stack other = s;
        other.push_back(starts[i]);
        work.push_back(std::move(other));
      }
      s.push_back(starts[0]);
    }
    out.push_back(std::move(s));
    if (++produced > kMaxStacks) return false;
  }
  return true;
}

bool GrammarGuide::Matches(const Element& e, uint32_t c) const { return ClassIntersects(e, c, c); }

bool GrammarGuide::AnyCharStartsWith(const std::vector<Stack>& stacks,
                                     std::string_view pending) const {
  uint32_t lo = 0, hi = 0;
  if (!PrefixRange(pending, &lo, &hi)) return false;
  for (const Stack& s : stacks) {
    if (!s.empty() && ClassIntersects(elements_[s.back()], lo, hi)) return true;
  }
  return false;
}

int GrammarGuide::Intern(StateKey key) const {
  if (auto it = ids_.find(key); it != ids_.end()) return it->second;
  if (states_.size() >= static_cast<size_t>(kMaxStates)) return kDead;
  StateInfo info;
  const bool has_empty =
      std::any_of(key.stacks.begin(), key.stacks.end(), [](const Stack& s) { return s.empty(); });
  info.accepting = has_empty && key.pending.empty();
  info.complete = info.accepting && key.stacks.size() == 1;
  info.next.fill(kUnknown);
  const int id = static_cast<int>(states_.size());
  info.key = &ids_.emplace(std::move(key), id).first->first;
  states_.push_back(info);
  return id;
}

int GrammarGuide::StepLocked(int state, uint8_t byte) const {
  if (state == kDead) return kDead;
  if (const int32_t known = states_[state].next[byte]; known != kUnknown) return known;
  const StateKey& from = *states_[state].key;
  std::string pending = from.pending;
  pending.push_back(static_cast<char>(byte));
  const auto lead = static_cast<unsigned char>(pending[0]);
  const int length = utf8::SequenceLength(lead);
  int next = kDead;
  if (length == 0 || (pending.size() > 1 && !utf8::IsContinuation(byte))) {
    next = kDead;  // not UTF-8
  } else if (static_cast<int>(pending.size()) < length) {
    if (AnyCharStartsWith(from.stacks, pending)) {
      next = Intern({.stacks = from.stacks, .pending = std::move(pending)});
    }
  } else {
    uint32_t cp = utf8::LeadBits(lead, length);
    for (int i = 1; i < length; ++i) cp = cp << 6 | (static_cast<unsigned char>(pending[i]) & 0x3F);
    const bool valid =
        cp >= utf8::kMinForLength[length] && cp <= kMaxCodePoint && !(cp >= 0xD800 && cp <= 0xDFFF);
    StateKey to;
    bool ok = valid;
    for (const Stack& s : from.stacks) {
      if (!ok) break;
      if (s.empty() || !Matches(elements_[s.back()], cp)) continue;
      Stack moved = s;
      moved.back() += 1;
      ok = Expand(std::move(moved), to.stacks);
    }
    if (ok && !to.stacks.empty()) {
      std::sort(to.stacks.begin(), to.stacks.end());
      to.stacks.erase(std::unique(to.stacks.begin(), to.stacks.end()), to.stacks.end());
      if (to.stacks.size() <= static_cast<size_t>(kMaxStacks)) next = Intern(std::move(to));
    }
  }
  states_[state].next[byte] = next;  // (Intern may have moved states_: index again)
  return next;
}

int GrammarGuide::AdvanceBytesLocked(int state, std::string_view bytes) const {
  for (char c : bytes) {
    if (state == kDead) break;
    state = StepLocked(state, static_cast<uint8_t>(c));
  }
  return state;
}

int GrammarGuide::AdvanceBytes(int state, std::string_view bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return AdvanceBytesLocked(state, bytes);
}

bool GrammarGuide::Accepting(int state) const {
  if (state == kDead) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return states_[state].accepting;
}

bool GrammarGuide::Complete(int state) const {
  if (state == kDead) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return states_[state].complete;
}

int GrammarGuide::num_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(states_.size());
}

GrammarGuide::TokenBits GrammarGuide::ComputeLiveTokens(int state) const {
  const std::vector<std::string>& tokens = vocab().bytes;
  TokenBits bits((tokens.size() + 63) / 64, 0);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (!tokens[t].empty() && AdvanceBytesLocked(state, tokens[t]) != kDead) {
      bits[t / 64] |= uint64_t{1} << (t % 64);
    }
  }
  return bits;
}

const char* GrammarGuide::JsonObjectGrammar(bool compact) {
  // At most one space between tokens (none when compact), numbers an int64 / double parser takes
  // and no \u escape of a lone surrogate (as the JSON schema patterns,
  // runtime/json_schema_regex.h); any depth.
  constexpr const char* kTokens = R"gbnf(
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" hex-not-surrogate ) )* "\""
hex-not-surrogate ::= [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}
number ::= "-"? ( "0" | [1-9] [0-9]{0,18} ) ( "." [0-9]{1,17} )? ( [eE] [-+]? [0-9]{1,2} )?
)gbnf";
  constexpr const char* kStructure = R"gbnf(root ::= object
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array ::= "[" ws ( value ( ws "," ws value )* ws )? "]")gbnf";
  static const std::string spaced = absl::StrCat(kStructure, kTokens, "ws ::= \" \"?\n");
  static const std::string tight =
      absl::StrCat(absl::StrReplaceAll(kStructure, {{" ws ", " "}}), kTokens);
  return compact ? tight.c_str() : spaced.c_str();
}

}  // namespace mqa
