#include "runtime/guided.h"

#include <algorithm>
#include <bitset>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "runtime/utf8.h"

#ifndef MQA_GUIDED_MAX_WORK
#define MQA_GUIDED_MAX_WORK 50'000'000
#endif

namespace mqa {
namespace {

using ByteSet = std::bitset<256>;

// The pattern's syntax tree. A set matches one byte; sequences of sets spell multi-byte
// characters.
struct Node {
  enum Kind { kSet, kConcat, kAlt, kRepeat } kind = kConcat;
  ByteSet set;                 // kSet
  std::vector<Node> children;  // kConcat (empty: the empty string), kAlt, kRepeat (one)
  int min = 0, max = 0;        // kRepeat; max -1: unbounded
};

Node SetNode(const ByteSet& set) {
  Node n;
  n.kind = Node::kSet;
  n.set = set;
  return n;
}

Node ByteNode(uint8_t b) {
  ByteSet s;
  s.set(b);
  return SetNode(s);
}

Node RangeNode(int lo, int hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(b);
  return SetNode(s);
}

Node Seq(std::vector<Node> parts) {
  Node n;
  n.kind = Node::kConcat;
  n.children = std::move(parts);
  return n;
}

Node Alt(std::vector<Node> options) {
  Node n;
  n.kind = Node::kAlt;
  n.children = std::move(options);
  return n;
}

// Any UTF-8 encoded character of two, three or four bytes (lead byte, then continuation bytes).
Node MultiByteChar() {
  return Alt({Seq({RangeNode(0xc2, 0xdf), RangeNode(0x80, 0xbf)}),
              Seq({RangeNode(0xe0, 0xef), RangeNode(0x80, 0xbf), RangeNode(0x80, 0xbf)}),
              Seq({RangeNode(0xf0, 0xf4), RangeNode(0x80, 0xbf), RangeNode(0x80, 0xbf),
                   RangeNode(0x80, 0xbf)})});
}

// An ASCII set, plus every non-ASCII character when `negated`.
Node ClassNode(const ByteSet& ascii, bool negated) {
  if (!negated) return SetNode(ascii);
  ByteSet complement;
  for (int b = 0; b < 128; ++b) complement.set(b, !ascii.test(b));
  return Alt({SetNode(complement), MultiByteChar()});
}

Node Utf8Literal(uint32_t cp) {
  std::string bytes;
  if (cp < 0x80) {
    bytes = std::string(1, static_cast<char>(cp));
  } else if (cp < 0x800) {
    bytes = {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
  } else if (cp < 0x10000) {
    bytes = {static_cast<char>(0xe0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3f)),
             static_cast<char>(0x80 | (cp & 0x3f))};
  } else {
    bytes = {static_cast<char>(0xf0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3f)),
             static_cast<char>(0x80 | ((cp >> 6) & 0x3f)), static_cast<char>(0x80 | (cp & 0x3f))};
  }
  std::vector<Node> parts;
  for (char c : bytes) parts.push_back(ByteNode(static_cast<uint8_t>(c)));
  return parts.size() == 1 ? std::move(parts[0]) : Seq(std::move(parts));
}

ByteSet ShorthandSet(char c) {  // \d \w \s (lower case)
  ByteSet s;
  for (int b = 0; b < 128; ++b) {
    const bool digit = b >= '0' && b <= '9';
    const bool word = digit || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_';
    const bool space = b == ' ' || (b >= '\t' && b <= '\r');
    s.set(b, c == 'd' ? digit : c == 'w' ? word : space);
  }
  return s;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  absl::StatusOr<Node> Parse() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    Node n;
    if (!Alternation(n)) return error_;
    if (i_ != p_.size()) return Error("unbalanced ')'");
    return n;
  }

 private:
  bool Fail(std::string_view what) {
    error_ = absl::InvalidArgumentError(absl::StrCat(
        "guided regex: ", std::string(what), " at position ", i_, " of \"", std::string(p_), "\""));
    return false;
  }
  absl::Status Error(std::string_view what) {
    Fail(what);
    return error_;
  }
  bool AtEnd() const { return i_ >= p_.size(); }
  // `$` just before the end of the pattern or of a top-level alternative: the end of the text.
  bool AtDollarEnd() const {
    return p_[i_] == '$' && depth_ == 0 && (i_ + 1 == p_.size() || p_[i_ + 1] == '|');
  }

  bool Alternation(Node& out) {
    std::vector<Node> options(1);
    if (!Concatenation(options.back())) return false;
    while (!AtEnd() && p_[i_] == '|') {
      ++i_;
      options.emplace_back();
      if (!Concatenation(options.back())) return false;
    }
    out = options.size() == 1 ? std::move(options[0]) : Alt(std::move(options));
    return true;
  }

  bool Concatenation(Node& out) {
    std::vector<Node> parts;
    while (!AtEnd() && p_[i_] != '|' && p_[i_] != ')') {
      if (AtDollarEnd()) {
        ++i_;
        continue;
      }
      Node atom;
      if (!Atom(atom) || !Quantifiers(atom)) return false;
      parts.push_back(std::move(atom));
    }
    out = parts.size() == 1 ? std::move(parts[0]) : Seq(std::move(parts));
    return true;
  }

  bool Quantifiers(Node& atom) {
    while (!AtEnd()) {
      int min = 0, max = 0;
      const char c = p_[i_];
      if (c == '*') {
        min = 0, max = -1;
        ++i_;
      } else if (c == '+') {
        min = 1, max = -1;
        ++i_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++i_;
      } else if (c == '{') {
        if (!Braces(min, max)) return false;
      } else {
        return true;
      }
      if (!AtEnd() && p_[i_] == '?') ++i_;  // lazy: the same language
      if (!AtEnd() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?' || p_[i_] == '{')) {
        return Fail("a quantifier after a quantifier");
      }
      Node r;
      r.kind = Node::kRepeat;
      r.min = min;
      r.max = max;
      r.children.push_back(std::move(atom));
      atom = std::move(r);
    }
    return true;
  }

  bool Number(int& n) {
    const size_t start = i_;
    n = 0;
    while (!AtEnd() && p_[i_] >= '0' && p_[i_] <= '9') {
      n = n * 10 + (p_[i_++] - '0');
      if (n > 1000) return Fail("a repeat count above 1000");
    }
    return i_ > start || Fail("a repeat count expected");
  }

  bool Braces(int& min, int& max) {
    ++i_;  // '{'
    if (!Number(min)) return false;
    max = min;
    if (!AtEnd() && p_[i_] == ',') {
      ++i_;
      max = -1;
      if (!AtEnd() && p_[i_] != '}' && !Number(max)) return false;
    }
    if (AtEnd() || p_[i_] != '}') return Fail("'}' expected");
    ++i_;
    if (max != -1 && max < min) return Fail("{m,n} with n < m");
    return true;
  }

  bool Atom(Node& out) {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (!AtEnd() && p_[i_] == '?') {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
          i_ += 2;
        } else {
          return Fail("only (?: ) groups are supported (no lookaround, flags or names)");
        }
      }
      if (++depth_ > kMaxDepth) return Fail("groups nested too deep");
      if (!Alternation(out)) return false;
      --depth_;
      if (AtEnd() || p_[i_] != ')') return Fail("')' expected");
      ++i_;
      return true;
    }
    if (c == '[') return Class(out);
    if (c == '.') {
      ++i_;
      ByteSet ascii;
      ascii.set();
      ascii.reset('\n');
      for (int b = 128; b < 256; ++b) ascii.reset(b);
      out = Alt({SetNode(ascii), MultiByteChar()});
      return true;
    }
    if (c == '\\') {
      bool negated = false;
      ByteSet set;
      uint32_t cp = 0;
      if (!Escape(false, set, negated, cp)) return false;
      out = set.any() || negated ? ClassNode(set, negated) : Utf8Literal(cp);
      return true;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return Fail("nothing to repeat");
    if (c == '^' || c == '$') return Fail("'^' and '$' only at the ends of the pattern");
    uint32_t cp = 0;
    if (!Utf8Char(cp)) return false;
    out = Utf8Literal(cp);
    return true;
  }

  // One UTF-8 character of the pattern into `cp`.
  bool Utf8Char(uint32_t& cp) {
    const auto b = static_cast<uint8_t>(p_[i_]);
    const int len = utf8::SequenceLength(b);
    if (len == 0 || i_ + len > p_.size()) return Fail("invalid UTF-8");
    cp = utf8::LeadBits(b, len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(p_[i_ + k]) & 0x3f);
    i_ += len;
    return true;
  }

  // After a backslash: a shorthand class (into `set`, `negated`) or one character (`cp`).
  bool Escape(bool in_class, ByteSet& set, bool& negated, uint32_t& cp) {
    ++i_;  // '\'
    if (AtEnd()) return Fail("a trailing backslash");
    const char c = p_[i_++];
    auto hex = [&](int digits) {
      if (i_ + digits > p_.size()) return Fail("hex digits expected");
      cp = 0;
      for (int k = 0; k < digits; ++k) {
        const char h = p_[i_++];
        const int v = h >= '0' && h <= '9'   ? h - '0'
                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                             : -1;
        if (v < 0) return Fail("hex digits expected");
        cp = cp * 16 + v;
      }
      return true;
    };
    switch (c) {
      case 'd':
      case 'w':
      case 's':
        set = ShorthandSet(c);
        return true;
      case 'D':
      case 'W':
      case 'S':
        set = ShorthandSet(static_cast<char>(c - 'A' + 'a'));
        negated = true;
        if (in_class) return Fail("\\D, \\W and \\S inside a class");
        return true;
      case 'n':
        cp = '\n';
        return true;
      case 't':
        cp = '\t';
        return true;
      case 'r':
        cp = '\r';
        return true;
      case 'f':
        cp = '\f';
        return true;
      case 'v':
        cp = '\v';
        return true;
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      default:
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Fail(absl::StrCat("unsupported escape \\", std::string(1, c)));
        }
        --i_;
        return Utf8Char(cp);
    }
  }

  bool Class(Node& out) {
    ++i_;  // '['
    bool negated = false;
    if (!AtEnd() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    ByteSet set;
    bool first = true;
    while (true) {
      if (AtEnd()) return Fail("']' expected");
      if (p_[i_] == ']' && !first) break;
      first = false;
      uint32_t lo = 0;
      if (p_[i_] == '\\') {
        ByteSet shorthand;
        bool shorthand_negated = false;
        if (!Escape(true, shorthand, shorthand_negated, lo)) return false;
        if (shorthand.any()) {
          set |= shorthand;
          continue;
        }
      } else if (!Utf8Char(lo)) {
        return false;
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          ByteSet unused;
          bool unused_negated = false;
          if (!Escape(true, unused, unused_negated, hi) || unused.any()) {
            return Fail("a class range ends in a character");
          }
        } else if (!Utf8Char(hi)) {
          return false;
        }
        if (hi < lo) return Fail("a class range out of order");
      }
      if (hi >= 128) return Fail("non-ASCII class members are not supported");
      for (uint32_t b = lo; b <= hi; ++b) set.set(b);
    }
    ++i_;  // ']'
    out = ClassNode(set, negated);
    return true;
  }

  static constexpr int kMaxDepth = 64;  // the parser and the NFA builder recurse per level
  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;
  absl::Status error_;
};

// Thompson NFA: a byte node steps on a byte of its set; a split node is an epsilon to out and
// (if >= 0) out1; kMatch accepts.
struct Nfa {
  struct State {
    enum Kind { kByte, kSplit, kMatch } kind = kSplit;
    ByteSet set;
    int out = -1, out1 = -1;
  };
  std::vector<State> states;
  static constexpr size_t kMaxStates = 200000;

  int Add(State s) {
    states.push_back(s);
    return static_cast<int>(states.size()) - 1;
  }
};

// A fragment: its entry and the dangling exits (state, which of out / out1) to patch.
struct Frag {
  int start;
  std::vector<std::pair<int, int>> outs;
};

class NfaBuilder {
 public:
  explicit NfaBuilder(Nfa& nfa) : nfa_(nfa) {}

  absl::StatusOr<Frag> Build(const Node& n) {
    if (nfa_.states.size() > Nfa::kMaxStates) {
      return absl::InvalidArgumentError("guided regex: the pattern is too large");
    }
    switch (n.kind) {
      case Node::kSet: {
        const int s = nfa_.Add({Nfa::State::kByte, n.set, -1, -1});
        return Frag{s, {{s, 0}}};
      }
      case Node::kConcat: {
        if (n.children.empty()) return Epsilon();
        ASSIGN_OR_RETURN(Frag f, Build(n.children[0]));
        for (size_t i = 1; i < n.children.size(); ++i) {
          ASSIGN_OR_RETURN(Frag g, Build(n.children[i]));
          Patch(f, g.start);
          f.outs = std::move(g.outs);
        }
        return f;
      }
      case Node::kAlt: {
        ASSIGN_OR_RETURN(Frag f, Build(n.children[0]));
        for (size_t i = 1; i < n.children.size(); ++i) {
          ASSIGN_OR_RETURN(Frag g, Build(n.children[i]));
          const int s = nfa_.Add({Nfa::State::kSplit, {}, f.start, g.start});
          f.start = s;
          f.outs.insert(f.outs.end(), g.outs.begin(), g.outs.end());
        }
        return f;
      }
      case Node::kRepeat:
        return Repeat(n.children[0], n.min, n.max);
    }
    return absl::InternalError("guided regex: bad node");
  }

 private:
  Frag Epsilon() {
    const int s = nfa_.Add({Nfa::State::kSplit, {}, -1, -1});
    return Frag{s, {{s, 0}}};
  }
  void Patch(const Frag& f, int target) {
    for (const auto& [s, which] : f.outs)
      (which == 0 ? nfa_.states[s].out : nfa_.states[s].out1) = target;
  }
  absl::StatusOr<Frag> Repeat(const Node& child, int min, int max) {
    Frag f = Epsilon();
    auto append = [&](Frag g) {
      Patch(f, g.start);
      f.outs = std::move(g.outs);
    };
    for (int i = 0; i < min; ++i) {
      ASSIGN_OR_RETURN(Frag g, Build(child));
      append(std::move(g));
    }
    if (max == -1) {  // a loop: split into the child (which returns to the split) or past it
      ASSIGN_OR_RETURN(Frag g, Build(child));
      const int s = nfa_.Add({Nfa::State::kSplit, {}, g.start, -1});
      Patch(g, s);
      append(Frag{s, {{s, 1}}});
      return f;
    }
    // max - min optional copies, nested: before each, a split into it or past all the rest, so
    // that after j copies the text is at copy j only (chained optionals would leave it at any of
    // them, and the automaton's states would grow with the count).
    std::vector<std::pair<int, int>> skips;
    for (int i = min; i < max; ++i) {
      ASSIGN_OR_RETURN(Frag g, Build(child));
      const int s = nfa_.Add({Nfa::State::kSplit, {}, g.start, -1});
      skips.push_back({s, 1});
      append(Frag{s, std::move(g.outs)});
    }
    f.outs.insert(f.outs.end(), skips.begin(), skips.end());
    return f;
  }

  Nfa& nfa_;
};

// The epsilon closure of `seeds`: the byte and match states reachable, sorted.
std::vector<int> Closure(const Nfa& nfa, const std::vector<int>& seeds, std::vector<int>& mark,
                         int stamp) {
  std::vector<int> stack(seeds), out;
  while (!stack.empty()) {
    const int s = stack.back();
    stack.pop_back();
    if (s < 0 || mark[s] == stamp) continue;
    mark[s] = stamp;
    const Nfa::State& st = nfa.states[s];
    if (st.kind == Nfa::State::kSplit) {
      stack.push_back(st.out);
      stack.push_back(st.out1);
    } else {
      out.push_back(s);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const RegexGuide>> RegexGuide::Compile(
    std::string_view pattern, std::shared_ptr<const GuideVocab> vocab) {
  ASSIGN_OR_RETURN(const Node tree, Parser(pattern).Parse());
  Nfa nfa;
  ASSIGN_OR_RETURN(const Frag frag, NfaBuilder(nfa).Build(tree));
  const int match = nfa.Add({Nfa::State::kMatch, {}, -1, -1});
  for (const auto& [s, which] : frag.outs) {
    (which == 0 ? nfa.states[s].out : nfa.states[s].out1) = match;
  }

  std::shared_ptr<RegexGuide> guide(new RegexGuide(std::string(pattern), std::move(vocab)));
  std::vector<int> mark(nfa.states.size(), -1);
  int stamp = 0;
  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> sets = {Closure(nfa, {frag.start}, mark, stamp++)};
  ids[sets[0]] = 0;
  // Work done (NFA states scanned or visited), bounded so that no pattern ties up a server thread:
  // at the bound ~0.23 s in a Release build on a CI-class machine (2026-12-07), where the HTTP
  // thread compiles it. The fuzz build lowers it (MQA_GUIDED_MAX_WORK): with ASan and UBSan at -O1
  // the same pattern took 14 s, past libFuzzer's 5 s a unit.
  constexpr int64_t kMaxWork = MQA_GUIDED_MAX_WORK;
  int64_t work = 0;
  for (size_t d = 0; d < sets.size(); ++d) {
    std::array<int32_t, 256> row;
    bool accepting = false;
    // Bytes with the same successors share one closure (most bytes of a class do).
    std::map<std::vector<int>, int32_t> by_seeds;
    for (int b = 0; b < 256; ++b) {
      std::vector<int> seeds;
      for (int s : sets[d]) {
        const Nfa::State& st = nfa.states[s];
        if (st.kind == Nfa::State::kByte && st.set.test(b)) seeds.push_back(st.out);
      }
      work += static_cast<int64_t>(sets[d].size());
      if (seeds.empty()) {
        row[b] = kDead;
        continue;
      }
      if (auto known = by_seeds.find(seeds); known != by_seeds.end()) {
        row[b] = known->second;
        continue;
      }
      std::vector<int> next = Closure(nfa, seeds, mark, stamp++);
      work += static_cast<int64_t>(next.size()) + static_cast<int64_t>(seeds.size());
      if (work > kMaxWork) {
        return absl::InvalidArgumentError(
            "guided regex: the pattern is too complex to compile (simplify its repetitions)");
      }
      auto [it, inserted] = ids.emplace(next, static_cast<int>(sets.size()));
      if (inserted) {
        if (static_cast<int>(sets.size()) >= kMaxStates) {
          return absl::InvalidArgumentError(absl::StrCat(
              "guided regex: the pattern needs more than ", kMaxStates, " automaton states"));
        }
        sets.push_back(std::move(next));
      }
      row[b] = it->second;
      by_seeds.emplace(std::move(seeds), it->second);
    }
    for (int s : sets[d]) accepting |= nfa.states[s].kind == Nfa::State::kMatch;
    guide->next_.push_back(row);
    guide->accepting_.push_back(accepting);
    guide->complete_.push_back(
        accepting && std::all_of(row.begin(), row.end(), [](int32_t t) { return t == kDead; }));
  }
  if (!guide->accepting_[0] && std::all_of(guide->next_[0].begin(), guide->next_[0].end(),
                                           [](int32_t t) { return t == kDead; })) {
    return absl::InvalidArgumentError("guided regex: the pattern matches nothing");
  }
  return std::shared_ptr<const RegexGuide>(std::move(guide));
}

std::string RegexGuide::ChoicePattern(absl::Span<const std::string> choices) {
  std::string pattern;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) pattern += '|';
    for (char c : choices[i]) {
      if (std::string_view("\\^$.|?*+()[]{}-").find(c) != std::string_view::npos) pattern += '\\';
      pattern += c;
    }
  }
  return pattern;
}

int RegexGuide::AdvanceBytes(int state, std::string_view bytes) const {
  for (char c : bytes) {
    if (state == kDead) break;
    state = next_[state][static_cast<uint8_t>(c)];
  }
  return state;
}

int Guide::Advance(int state, absl::Span<const int32_t> tokens) const {
  for (int32_t t : tokens) {
    if (t >= 0 && static_cast<size_t>(t) < vocab_->bytes.size()) {
      state = AdvanceBytes(state, vocab_->bytes[t]);
    }
  }
  return state;
}

Guide::TokenBits Guide::ComputeLiveTokens(int state) const {
  TokenBits bits((vocab_->bytes.size() + 63) / 64, 0);
  for (size_t t = 0; t < vocab_->bytes.size(); ++t) {
    const std::string& bytes = vocab_->bytes[t];
    if (!bytes.empty() && AdvanceBytes(state, bytes) != kDead) {
      bits[t / 64] |= uint64_t{1} << (t % 64);
    }
  }
  return bits;
}

std::shared_ptr<const Guide::TokenBits> Guide::LiveTokens(int state) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = live_tokens_.find(state); it != live_tokens_.end()) return it->second;
  }
  // Computed outside the lock (a grammar's computation takes its own); two threads may both
  // compute a new state's, and the first kept wins.
  auto bits = std::make_shared<const TokenBits>(ComputeLiveTokens(state));
  std::lock_guard<std::mutex> lock(mu_);
  if (live_tokens_.size() >= kMaxCachedStates) live_tokens_.clear();  // start over
  return live_tokens_.emplace(state, std::move(bits)).first->second;
}

void Guide::Mask(int state, absl::Span<float> logits) const {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const int32_t eos = vocab_->eos;
  const bool eos_in_row = eos >= 0 && static_cast<size_t>(eos) < logits.size();
  const float eos_logit = eos_in_row ? logits[eos] : kMasked;
  if (state == kDead) {
    std::fill(logits.begin(), logits.end(), kMasked);
    return;
  }
  const std::shared_ptr<const TokenBits> live = LiveTokens(state);
  const size_t n = std::min(vocab_->bytes.size(), logits.size());
  for (size_t w = 0; w * 64 < n; ++w) {  // a word at a time: all allowed, none, or bit by bit
    const uint64_t bits = (*live)[w];
    const size_t end = std::min(n, (w + 1) * 64);
    if (bits == ~uint64_t{0} && end == (w + 1) * 64) continue;
    for (size_t t = w * 64; t < end; ++t) {
      if ((bits >> (t - w * 64) & 1) == 0) logits[t] = kMasked;
    }
  }
  for (size_t t = n; t < logits.size(); ++t) logits[t] = kMasked;
  if (eos_in_row) logits[eos] = Accepting(state) ? eos_logit : kMasked;
}

}  // namespace mqa
