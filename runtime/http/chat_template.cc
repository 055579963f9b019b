#include "runtime/http/chat_template.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace mqa {

using json = nlohmann::json;

namespace {

// ---- Values ------------------------------------------------------------------------------------

// A template value: JSON, or Jinja's undefined (a missing variable, key or attribute).
struct Value {
  json v;
  bool undefined = false;
  static Value Undefined() { return Value{json(), true}; }
};

bool Truthy(const Value& x) {
  if (x.undefined || x.v.is_null()) return false;
  if (x.v.is_boolean()) return x.v.get<bool>();
  if (x.v.is_number_integer()) return x.v.get<int64_t>() != 0;
  if (x.v.is_number()) return x.v.get<double>() != 0.0;
  if (x.v.is_string()) return !x.v.get_ref<const std::string&>().empty();
  return !x.v.empty();
}

std::string FormatDouble(double d) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, end);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // Python prints 1.0, not 1
  return s;
}

// Python's json.dumps (what transformers' tojson filter calls): ", " and ": " separators,
// non-ASCII kept.
std::string PythonJson(const json& v) {
  switch (v.type()) {
    case json::value_t::array: {
      std::vector<std::string> items;
      for (const json& item : v) items.push_back(PythonJson(item));
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
    case json::value_t::object: {
      std::vector<std::string> items;
      for (const auto& [key, item] : v.items()) {
        items.push_back(absl::StrCat(json(key).dump(-1, ' ', false, json::error_handler_t::replace),
                                     ": ", PythonJson(item)));
      }
      return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
    }
    case json::value_t::number_float:
      return FormatDouble(v.get<double>());
    default:
      return v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

// The length of a string (bytes), list or mapping.
int64_t Length(const json& v) {
  return static_cast<int64_t>(v.is_string() ? v.get_ref<const std::string&>().size() : v.size());
}

// str() of a value, as Jinja prints it.
std::string ToText(const Value& x) {
  if (x.undefined) return "";
  const json& v = x.v;
  switch (v.type()) {
    case json::value_t::string:
      return v.get<std::string>();
    case json::value_t::boolean:
      return v.get<bool>() ? "True" : "False";
    case json::value_t::null:
      return "None";
    case json::value_t::number_float:
      return FormatDouble(v.get<double>());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return v.dump();
    default:
      return PythonJson(v);  // close enough to Python's repr for lists and dicts of strings
  }
}

// ---- Lexing the tag contents -------------------------------------------------------------------

enum class Tok { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok kind = Tok::kEnd;
  std::string text;  // name, operator, or the string's value
  int64_t i = 0;
  double f = 0;
};

absl::StatusOr<std::vector<Token>> LexTag(absl::string_view s, int line) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", parts...));
  };
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Tok::kName, std::string(s.substr(i, j - i))});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) ||
                              (s[j] == '.' && j + 1 < s.size() &&
                               std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        is_float |= s[j] == '.';
        ++j;
      }
      Token t{is_float ? Tok::kFloat : Tok::kInt, std::string(s.substr(i, j - i))};
      if (is_float) {
        t.f = std::stod(t.text);
      } else if (std::from_chars(t.text.data(), t.text.data() + t.text.size(), t.i).ec !=
                 std::errc()) {
        return bad("number out of range: ", t.text);
      }
      out.push_back(std::move(t));
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          value += s[j];
          continue;
        }
        const char e = s[++j];
        value += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
      }
      if (j >= s.size()) return bad("unterminated string");
      out.push_back({Tok::kString, std::move(value)});
      i = j + 1;
    } else {
      static const char* kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
      std::string op(1, c);
      for (const char* two : kTwo) {
        if (s.substr(i, 2) == two) op = two;
      }
      if (op.size() == 1 && absl::string_view("()[]{}.,:|+-*/%~<>=").find(c) == std::string::npos) {
        return bad("unexpected character '", std::string(1, c), "'");
      }
      out.push_back({Tok::kOp, op});
      i += op.size();
    }
  }
  out.push_back({Tok::kEnd, ""});
  return out;
}

}  // namespace

// ---- The tree
// ------------------------------------------------------------------------------------

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kCond,
    kList,
    kDict
  } kind = kLiteral;
  json literal;
  std::string name;  // variable, attribute, function, filter, test or operator
  std::vector<std::unique_ptr<Expr>> args;  // operands, call / filter arguments, list items
  std::vector<std::string> keywords;        // kCall / kDict: names of keyword args (or "")
  bool negated = false;                     // kTest: `is not`
  bool has_lo = false, has_hi = false;      // kSlice bounds present (args after the object)
  int line = 0;
};

struct ChatTemplate::Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kBody } kind = kBody;
  std::string text;
  std::unique_ptr<Expr> expr;                     // output / for iterable / set value
  std::vector<std::string> targets;               // for: loop names; set: name (and attribute)
  std::vector<std::unique_ptr<Expr>> conditions;  // if: one per branch (null: else)
  std::vector<std::unique_ptr<Node>> children;    // body, or if branches (bodies)
  int line = 0;
};

namespace {

using Node = ChatTemplate::Node;

// ---- Parsing expressions -----------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  absl::StatusOr<std::unique_ptr<Expr>> Parse() { return Conditional(); }
  bool AtEnd() const { return t_[p_].kind == Tok::kEnd; }
  const Token& Peek() const { return t_[p_]; }
  bool IsName(const char* name) const { return t_[p_].kind == Tok::kName && t_[p_].text == name; }
  bool IsOp(const char* op) const { return t_[p_].kind == Tok::kOp && t_[p_].text == op; }
  Token Next() { return t_[p_].kind == Tok::kEnd ? t_[p_] : t_[p_++]; }
  absl::Status Bad(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template line ", line_, ": ", what,
                     AtEnd() ? " at the end of the tag" : absl::StrCat(" at '", Peek().text, "'")));
  }
  absl::Status ExpectOp(const char* op) {
    if (!IsOp(op)) return Bad(absl::StrCat("expected '", op, "'"));
    ++p_;
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Expr> Make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }
  std::unique_ptr<Expr> Binary(std::string op, std::unique_ptr<Expr> l, std::unique_ptr<Expr> r) {
    auto e = Make(Expr::kBinary);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  absl::StatusOr<std::unique_ptr<Expr>> Conditional() {
    // Nesting (parentheses, lists, arguments, `not`, `-`) is bounded, so that no template can
    // exhaust the stack.
    if (++depth_ > kMaxDepth) return Bad("expression nested too deeply");
    absl::StatusOr<std::unique_ptr<Expr>> e = ConditionalBody();
    --depth_;
    return e;
  }
  absl::StatusOr<std::unique_ptr<Expr>> ConditionalBody() {
    ASSIGN_OR_RETURN(auto then, Or());
    if (!IsName("if")) return then;
    ++p_;
    ASSIGN_OR_RETURN(auto cond, Or());
    std::unique_ptr<Expr> otherwise;
    if (IsName("else")) {
      ++p_;
      ASSIGN_OR_RETURN(otherwise, Conditional());
    } else {
      otherwise = Make(Expr::kLiteral);  // Jinja: undefined; printed as ""
      otherwise->literal = "";
    }
    auto e = Make(Expr::kCond);
    e->args.push_back(std::move(then));
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(otherwise));
    return e;
  }
  absl::StatusOr<std::unique_ptr<Expr>> Or() {
    ASSIGN_OR_RETURN(auto l, And());
    while (IsName("or")) {
      ++p_;
      ASSIGN_OR_RETURN(auto r, And());
      l = Binary("or", std::move(l), std::move(r));
    }
    return l;
  }
  absl::StatusOr<std::unique_ptr<Expr>> And() {
    ASSIGN_OR_RETURN(auto l, Not());
    while (IsName("and")) {
      ++p_;
      ASSIGN_OR_RETURN(auto r, Not());
      l = Binary("and", std::move(l), std::move(r));
    }
    return l;
  }
  absl::StatusOr<std::unique_ptr<Expr>> Not() {
    if (!IsName("not")) return Compare();
    if (++depth_ > kMaxDepth) return Bad("expression nested too deeply");
    ++p_;
    ASSIGN_OR_RETURN(auto operand, Not());
    auto e = Make(Expr::kNot);
    e->args.push_back(std::move(operand));
    return e;
  }
  absl::StatusOr<std::unique_ptr<Expr>> Compare() {
    ASSIGN_OR_RETURN(auto l, Concat());
    while (true) {
      std::string op;
      for (const char* c : {"==", "!=", "<", "<=", ">", ">="}) {
        if (IsOp(c)) op = c;
      }
      if (!op.empty()) {
        ++p_;
      } else if (IsName("in")) {
        ++p_;
        op = "in";
      } else if (IsName("not") && t_[p_ + 1].kind == Tok::kName && t_[p_ + 1].text == "in") {
        p_ += 2;
        op = "not in";
      } else if (IsName("is")) {
        ++p_;
        auto e = Make(Expr::kTest);
        if (IsName("not")) {
          ++p_;
          e->negated = true;
        }
        if (Peek().kind != Tok::kName) return Bad("expected a test name");
        e->name = Next().text;
        e->args.push_back(std::move(l));
        l = std::move(e);
        continue;
      } else {
        return l;
      }
      ASSIGN_OR_RETURN(auto r, Concat());
      l = Binary(op, std::move(l), std::move(r));
    }
  }
  absl::StatusOr<std::unique_ptr<Expr>> Concat() {
    ASSIGN_OR_RETURN(auto l, Sum());
    while (IsOp("~")) {
      ++p_;
      ASSIGN_OR_RETURN(auto r, Sum());
      l = Binary("~", std::move(l), std::move(r));
    }
    return l;
  }
  absl::StatusOr<std::unique_ptr<Expr>> Sum() {
    ASSIGN_OR_RETURN(auto l, Product());
    while (IsOp("+") || IsOp("-")) {
      std::string op = Next().text;
      ASSIGN_OR_RETURN(auto r, Product());
      l = Binary(op, std::move(l), std::move(r));
    }
    return l;
  }
  absl::StatusOr<std::unique_ptr<Expr>> Product() {
    ASSIGN_OR_RETURN(auto l, Unary());
    while (IsOp("*") || IsOp("/") || IsOp("%") || IsOp("//")) {
      std::string op = Next().text;
      ASSIGN_OR_RETURN(auto r, Unary());
      l = Binary(op, std::move(l), std::move(r));
    }
    return l;
  }
  absl::StatusOr<std::unique_ptr<Expr>> Unary() {
    if (IsOp("-")) {
      if (++depth_ > kMaxDepth) return Bad("expression nested too deeply");
      ++p_;
      ASSIGN_OR_RETURN(auto operand, Unary());
      auto e = Make(Expr::kNeg);
      e->args.push_back(std::move(operand));
      return e;
    }
    return Postfix();
  }
  absl::StatusOr<std::unique_ptr<Expr>> Postfix() {
    ASSIGN_OR_RETURN(auto e, Primary());
    while (true) {
      if (IsOp(".")) {
        ++p_;
        if (Peek().kind != Tok::kName) return Bad("expected an attribute name");
        auto a = Make(Expr::kAttr);
        a->name = Next().text;
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        ++p_;
        std::unique_ptr<Expr> lo, hi;
        if (!IsOp(":")) {
          ASSIGN_OR_RETURN(lo, Conditional());
        }
        if (IsOp(":")) {
          ++p_;
          if (!IsOp("]")) {
            ASSIGN_OR_RETURN(hi, Conditional());
          }
          auto s = Make(Expr::kSlice);
          s->has_lo = lo != nullptr;
          s->has_hi = hi != nullptr;
          s->args.push_back(std::move(e));
          if (lo) s->args.push_back(std::move(lo));
          if (hi) s->args.push_back(std::move(hi));
          e = std::move(s);
        } else {
          if (!lo) return Bad("expected an index");
          auto x = Make(Expr::kIndex);
          x->args.push_back(std::move(e));
          x->args.push_back(std::move(lo));
          e = std::move(x);
        }
        RETURN_IF_ERROR(ExpectOp("]"));
      } else if (IsOp("(")) {
        auto call = Make(Expr::kCall);
        call->args.push_back(std::move(e));
        RETURN_IF_ERROR(Arguments(*call));
        e = std::move(call);
      } else if (IsOp("|")) {
        ++p_;
        if (Peek().kind != Tok::kName) return Bad("expected a filter name");
        auto f = Make(Expr::kFilter);
        f->name = Next().text;
        f->args.push_back(std::move(e));
        if (IsOp("(")) RETURN_IF_ERROR(Arguments(*f));
        e = std::move(f);
      } else {
        return e;
      }
    }
  }
  // ( expr, name=expr, ... ) appended to e.args (after what is already there).
  absl::Status Arguments(Expr& e) {
    RETURN_IF_ERROR(ExpectOp("("));
    e.keywords.assign(e.args.size(), "");
    while (!IsOp(")")) {
      std::string keyword;
      if (Peek().kind == Tok::kName && t_[p_ + 1].kind == Tok::kOp && t_[p_ + 1].text == "=") {
        keyword = Next().text;
        ++p_;
      }
      ASSIGN_OR_RETURN(auto arg, Conditional());
      e.args.push_back(std::move(arg));
      e.keywords.push_back(keyword);
      if (!IsOp(",")) break;
      ++p_;
    }
    return ExpectOp(")");
  }
  absl::StatusOr<std::unique_ptr<Expr>> Primary() {
    const Token t = Next();
    switch (t.kind) {
      case Tok::kString: {
        auto e = Make(Expr::kLiteral);
        e->literal = t.text;
        // Adjacent strings concatenate, as in Python.
        while (Peek().kind == Tok::kString)
          e->literal = e->literal.get<std::string>() + Next().text;
        return e;
      }
      case Tok::kInt: {
        auto e = Make(Expr::kLiteral);
        e->literal = t.i;
        return e;
      }
      case Tok::kFloat: {
        auto e = Make(Expr::kLiteral);
        e->literal = t.f;
        return e;
      }
      case Tok::kName: {
        auto e = Make(Expr::kLiteral);
        if (t.text == "true" || t.text == "True") {
          e->literal = true;
        } else if (t.text == "false" || t.text == "False") {
          e->literal = false;
        } else if (t.text == "none" || t.text == "None") {
          e->literal = nullptr;
        } else {
          e->kind = Expr::kName;
          e->name = t.text;
        }
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ASSIGN_OR_RETURN(auto inner, Conditional());
          RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (t.text == "[") {
          auto list = Make(Expr::kList);
          while (!IsOp("]")) {
            ASSIGN_OR_RETURN(auto item, Conditional());
            list->args.push_back(std::move(item));
            if (!IsOp(",")) break;
            ++p_;
          }
          RETURN_IF_ERROR(ExpectOp("]"));
          return list;
        }
        if (t.text == "{") {
          auto dict = Make(Expr::kDict);
          while (!IsOp("}")) {
            if (Peek().kind != Tok::kString) return Bad("expected a string key");
            dict->keywords.push_back(Next().text);
            RETURN_IF_ERROR(ExpectOp(":"));
            ASSIGN_OR_RETURN(auto item, Conditional());
            dict->args.push_back(std::move(item));
            if (!IsOp(",")) break;
            ++p_;
          }
          RETURN_IF_ERROR(ExpectOp("}"));
          return dict;
        }
        break;
      default:
        break;
    }
    if (t.kind != Tok::kEnd) --p_;  // point the message at the token (Next stays at the end)
    return Bad("expected an expression");
  }

  static constexpr int kMaxDepth = 100;
  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

// ---- Parsing the template ----------------------------------------------------------------------

struct Segment {
  enum Kind { kText, kOutput, kBlock } kind = kText;
  std::string text;  // text, or the tag's contents
  int line = 0;
};

// Splits the source into text and tags, applying whitespace control as transformers' Jinja
// environment does (trim_blocks, lstrip_blocks, and the tags' own - modifiers).
absl::StatusOr<std::vector<Segment>> Split(absl::string_view src) {
  std::vector<Segment> out;
  size_t i = 0;
  int line = 1;
  bool trim_next_newline = false;  // trim_blocks after a block or comment
  bool strip_next = false;         // a -%} / -}} / -#} before this text
  while (i <= src.size()) {
    size_t open = src.find('{', i);
    while (open != absl::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open != absl::string_view::npos && open + 1 >= src.size()) open = absl::string_view::npos;
    std::string text(src.substr(i, (open == absl::string_view::npos ? src.size() : open) - i));
    const int text_line = line;
    line += static_cast<int>(std::count(text.begin(), text.end(), '\n'));
    if (trim_next_newline && absl::StartsWith(text, "\n")) text.erase(0, 1);
    if (strip_next) text = std::string(absl::StripLeadingAsciiWhitespace(text));
    trim_next_newline = strip_next = false;
    if (open == absl::string_view::npos) {
      if (!text.empty()) out.push_back({Segment::kText, std::move(text), text_line});
      break;
    }
    const char kind = src[open + 1];
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = src.find(close, open + 2);
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template line ", line, ": a tag is not closed"));
    }
    absl::string_view inner = src.substr(open + 2, end - open - 2);
    const bool left_minus = !inner.empty() && inner.front() == '-';
    const bool left_plus = !inner.empty() && inner.front() == '+';
    if (left_minus || left_plus) inner.remove_prefix(1);
    // After the left marker: in {%-%} the one '-' is not also the right one.
    const bool right_minus = !inner.empty() && inner.back() == '-';
    if (right_minus) inner.remove_suffix(1);
    if (left_minus) {
      text = std::string(absl::StripTrailingAsciiWhitespace(text));
    } else if (kind != '{' && !left_plus) {
      // lstrip_blocks: the spaces and tabs between the start of the tag's line (in the source)
      // and a block or comment tag.
      size_t ws = open;
      while (ws > 0 && (src[ws - 1] == ' ' || src[ws - 1] == '\t')) --ws;
      if (ws == 0 || src[ws - 1] == '\n') {
        text.erase(text.size() - std::min(text.size(), open - ws));
      }
    }
    if (!text.empty()) out.push_back({Segment::kText, std::move(text), text_line});
    line += static_cast<int>(std::count(inner.begin(), inner.end(), '\n'));
    if (kind == '{') {
      out.push_back({Segment::kOutput, std::string(inner), line});
    } else if (kind == '%') {
      out.push_back({Segment::kBlock, std::string(inner), line});
    }
    trim_next_newline = kind != '{' && !right_minus;
    strip_next = right_minus;
    i = end + 2;
  }
  return out;
}

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> segments) : s_(std::move(segments)) {}

  absl::StatusOr<std::unique_ptr<Node>> ParseAll() {
    auto root = std::make_unique<Node>();
    ASSIGN_OR_RETURN(std::string stop, Body(*root, {}));
    if (!stop.empty()) return Bad(stop_line_, absl::StrCat("unexpected {% ", stop, " %}"));
    return root;
  }

 private:
  static absl::Status Bad(int line, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
  }

  // Parses nodes into `body` until a block whose keyword is in `stops` (returned, its tag
  // consumed; its expression tokens left in rest_) or the end ("").
  absl::StatusOr<std::string> Body(Node& body, std::vector<std::string> stops) {
    if (stops.size() > 0 && ++depth_ > kMaxDepth) {
      return Bad(p_ > 0 ? s_[p_ - 1].line : 1, "blocks nested too deeply");
    }
    absl::StatusOr<std::string> stop = BodyLoop(body, stops);
    if (stops.size() > 0) --depth_;
    return stop;
  }

  absl::StatusOr<std::string> BodyLoop(Node& body, const std::vector<std::string>& stops) {
    while (p_ < s_.size()) {
      const Segment& seg = s_[p_++];
      if (seg.kind == Segment::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::kText;
        n->text = seg.text;
        body.children.push_back(std::move(n));
        continue;
      }
      ASSIGN_OR_RETURN(std::vector<Token> tokens, LexTag(seg.text, seg.line));
      if (seg.kind == Segment::kOutput) {
        ExprParser ep(std::move(tokens), seg.line);
        ASSIGN_OR_RETURN(auto e, ep.Parse());
        if (!ep.AtEnd()) return ep.Bad("unexpected text after the expression");
        auto n = std::make_unique<Node>();
        n->kind = Node::kOutput;
        n->expr = std::move(e);
        n->line = seg.line;
        body.children.push_back(std::move(n));
        continue;
      }
      if (tokens.front().kind != Tok::kName) return Bad(seg.line, "expected a statement");
      const std::string keyword = tokens.front().text;
      if (std::find(stops.begin(), stops.end(), keyword) != stops.end()) {
        rest_ = std::vector<Token>(tokens.begin() + 1, tokens.end());
        stop_line_ = seg.line;
        return keyword;
      }
      ExprParser ep(std::vector<Token>(tokens.begin() + 1, tokens.end()), seg.line);
      if (keyword == "if") {
        RETURN_IF_ERROR(If(body, ep, seg.line));
      } else if (keyword == "for") {
        RETURN_IF_ERROR(For(body, ep, seg.line));
      } else if (keyword == "set") {
        RETURN_IF_ERROR(Set(body, ep, seg.line));
      } else {
        stop_line_ = seg.line;
        return keyword;  // an end tag out of place, or an unsupported statement
      }
    }
    return std::string();
  }

  absl::Status If(Node& body, ExprParser& first, int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kIf;
    n->line = line;
    ExprParser* ep = &first;
    std::optional<ExprParser> next;
    std::unique_ptr<Expr> cond;
    while (true) {
      if (ep != nullptr) {
        ASSIGN_OR_RETURN(cond, ep->Parse());
        if (!ep->AtEnd()) return ep->Bad("unexpected text after the condition");
      }
      auto branch = std::make_unique<Node>();
      ASSIGN_OR_RETURN(std::string stop, Body(*branch, {"elif", "else", "endif"}));
      n->conditions.push_back(std::move(cond));
      n->children.push_back(std::move(branch));
      if (stop == "endif") break;
      if (stop == "elif") {
        next.emplace(std::move(rest_), stop_line_);
        ep = &*next;
      } else if (stop == "else") {
        ep = nullptr;
        cond = nullptr;
      } else {
        return Bad(line, stop.empty() ? "{% if %} without {% endif %}"
                                      : absl::StrCat("unexpected {% ", stop, " %} in an if"));
      }
    }
    body.children.push_back(std::move(n));
    return absl::OkStatus();
  }

  absl::Status For(Node& body, ExprParser& ep, int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kFor;
    n->line = line;
    while (true) {
      if (ep.Peek().kind != Tok::kName) return ep.Bad("expected a loop variable");
      n->targets.push_back(ep.Next().text);
      if (!ep.IsOp(",")) break;
      ep.Next();
    }
    if (!ep.IsName("in")) return ep.Bad("expected 'in'");
    ep.Next();
    ASSIGN_OR_RETURN(n->expr, ep.Parse());
    if (!ep.AtEnd()) return ep.Bad("unexpected text after the loop");
    auto loop_body = std::make_unique<Node>();
    ASSIGN_OR_RETURN(std::string stop, Body(*loop_body, {"endfor"}));
    if (stop != "endfor") return Bad(line, "{% for %} without {% endfor %}");
    n->children.push_back(std::move(loop_body));
    body.children.push_back(std::move(n));
    return absl::OkStatus();
  }

  absl::Status Set(Node& body, ExprParser& ep, int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kSet;
    n->line = line;
    if (ep.Peek().kind != Tok::kName) return ep.Bad("expected a name to set");
    n->targets.push_back(ep.Next().text);
    if (ep.IsOp(".")) {  // {% set ns.attr = ... %} on a namespace()
      ep.Next();
      if (ep.Peek().kind != Tok::kName) return ep.Bad("expected an attribute name");
      n->targets.push_back(ep.Next().text);
    }
    RETURN_IF_ERROR(ep.ExpectOp("="));
    ASSIGN_OR_RETURN(n->expr, ep.Parse());
    if (!ep.AtEnd()) return ep.Bad("unexpected text after the value");
    body.children.push_back(std::move(n));
    return absl::OkStatus();
  }

  static constexpr int kMaxDepth = 100;
  std::vector<Segment> s_;
  size_t p_ = 0;
  std::vector<Token> rest_;
  int stop_line_ = 0;
  int depth_ = 0;
};

// ---- Rendering ---------------------------------------------------------------------------------

class Renderer {
 public:
  explicit Renderer(const json& context) {
    scopes_.push_back({});
    globals_ = &context;
  }

  absl::Status Run(const Node& node, std::string& out) {
    switch (node.kind) {
      case Node::kBody:
        for (const auto& child : node.children) RETURN_IF_ERROR(Run(*child, out));
        return absl::OkStatus();
      case Node::kText:
        out += node.text;
        return absl::OkStatus();
      case Node::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        out += ToText(v);
        return absl::OkStatus();
      }
      case Node::kIf:
        for (size_t b = 0; b < node.children.size(); ++b) {
          bool take = node.conditions[b] == nullptr;
          if (!take) {
            ASSIGN_OR_RETURN(Value c, Eval(*node.conditions[b]));
            take = Truthy(c);
          }
          if (take) return Run(*node.children[b], out);
        }
        return absl::OkStatus();
      case Node::kFor:
        return For(node, out);
      case Node::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        if (node.targets.size() == 1) {
          scopes_.back()[node.targets[0]] = v;
          return absl::OkStatus();
        }
        Value* ns = Lookup(node.targets[0]);
        if (ns == nullptr || !ns->v.is_object() || !ns->v.contains("__namespace__")) {
          return Bad(node.line, absl::StrCat("'", node.targets[0], "' is not a namespace()"));
        }
        ns->v[node.targets[1]] = v.v;
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Bad(int line, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
  }

  Value* Lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return &found->second;
    }
    return nullptr;
  }

  absl::Status For(const Node& node, std::string& out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr));
    std::vector<json> items;
    if (iterable.v.is_array()) {
      items.assign(iterable.v.begin(), iterable.v.end());
    } else if (iterable.v.is_object()) {
      for (const auto& [key, value] : iterable.v.items()) {
        if (key != "__namespace__") items.push_back(key);
      }
    } else if (iterable.v.is_string()) {
      for (char c : iterable.v.get<std::string>()) items.push_back(std::string(1, c));
    } else if (!iterable.undefined && !iterable.v.is_null()) {
      return Bad(node.line, "the loop's value is not iterable");
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.push_back({});
      auto& scope = scopes_.back();
      if (node.targets.size() == 1) {
        scope[node.targets[0]] = Value{items[i]};
      } else {
        if (!items[i].is_array() || items[i].size() != node.targets.size()) {
          scopes_.pop_back();
          return Bad(node.line, "cannot unpack the loop's item into its names");
        }
        for (size_t t = 0; t < node.targets.size(); ++t) {
          scope[node.targets[t]] = Value{items[i][t]};
        }
      }
      scope["loop"] = Value{json{{"index", i + 1},
                                 {"index0", i},
                                 {"revindex", n - i},
                                 {"revindex0", n - i - 1},
                                 {"first", i == 0},
                                 {"last", i == n - 1},
                                 {"length", n}}};
      absl::Status s = Run(*node.children[0], out);
      scopes_.pop_back();
      RETURN_IF_ERROR(s);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral:
        return Value{e.literal};
      case Expr::kName: {
        if (Value* v = Lookup(e.name)) return *v;
        if (globals_->is_object() && globals_->contains(e.name)) return Value{(*globals_)[e.name]};
        return Value::Undefined();
      }
      case Expr::kList: {
        json list = json::array();
        for (const auto& item : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*item));
          list.push_back(v.v);
        }
        return Value{list};
      }
      case Expr::kDict: {
        json dict = json::object();
        for (size_t i = 0; i < e.args.size(); ++i) {
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
          dict[e.keywords[i]] = v.v;
        }
        return Value{dict};
      }
      case Expr::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        if (obj.v.is_object() && obj.v.contains(e.name)) return Value{obj.v[e.name]};
        return Value::Undefined();
      }
      case Expr::kIndex: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return Index(obj, key, e.line);
      }
      case Expr::kSlice:
        return Slice(e);
      case Expr::kCall:
        return Call(e);
      case Expr::kFilter:
        return Filter(e);
      case Expr::kTest: {
        ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(bool r, Test(e.name, x, e.line));
        return Value{json(r != e.negated)};
      }
      case Expr::kNot: {
        ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        return Value{json(!Truthy(x))};
      }
      case Expr::kNeg: {
        ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        if (x.v.is_number_integer()) {
          const int64_t v = x.v.get<int64_t>();
          if (v == std::numeric_limits<int64_t>::min()) return Bad(e.line, "integer overflow");
          return Value{json(-v)};
        }
        if (x.v.is_number()) return Value{json(-x.v.get<double>())};
        return Bad(e.line, "'-' of a value that is not a number");
      }
      case Expr::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        return Eval(*e.args[Truthy(c) ? 0 : 2]);
      }
      case Expr::kBinary:
        return Binary(e);
    }
    return Bad(e.line, "unsupported expression");
  }

  absl::StatusOr<Value> Index(const Value& obj, const Value& key, int line) {
    if (obj.v.is_object() && key.v.is_string()) {
      const std::string& k = key.v.get_ref<const std::string&>();
      if (obj.v.contains(k)) return Value{obj.v[k]};
      return Value::Undefined();
    }
    if ((obj.v.is_array() || obj.v.is_string()) && key.v.is_number_integer()) {
      const int64_t n = Length(obj.v);
      int64_t i = key.v.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined();
      if (obj.v.is_array()) return Value{obj.v[i]};
      return Value{json(std::string(1, obj.v.get_ref<const std::string&>()[i]))};
    }
    if (obj.undefined) return Value::Undefined();
    return Bad(line, "cannot index this value");
  }

  absl::StatusOr<Value> Slice(const Expr& e) {
    ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    if (!obj.v.is_array() && !obj.v.is_string()) return Bad(e.line, "cannot slice this value");
    const int64_t n = Length(obj.v);
    auto bound = [&](int arg) -> absl::StatusOr<int64_t> {
      ASSIGN_OR_RETURN(Value b, Eval(*e.args[arg]));
      if (!b.v.is_number_integer()) return Bad(e.line, "slice bounds must be integers");
      int64_t i = b.v.get<int64_t>();
      if (i < 0) i += n;
      return std::clamp<int64_t>(i, 0, n);
    };
    int64_t lo = 0, hi = n;
    int arg = 1;
    if (e.has_lo) {
      ASSIGN_OR_RETURN(lo, bound(arg++));
    }
    if (e.has_hi) {
      ASSIGN_OR_RETURN(hi, bound(arg++));
    }
    hi = std::max(hi, lo);
    if (obj.v.is_string()) return Value{json(obj.v.get<std::string>().substr(lo, hi - lo))};
    return Value{json(std::vector<json>(obj.v.begin() + lo, obj.v.begin() + hi))};
  }

  absl::StatusOr<Value> Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<Value> args;
    std::vector<std::pair<std::string, Value>> kwargs;
    for (size_t i = 1; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      if (e.keywords[i].empty()) {
        args.push_back(std::move(v));
      } else {
        kwargs.emplace_back(e.keywords[i], std::move(v));
      }
    }
    if (callee.kind == Expr::kName && callee.name == "raise_exception") {
      return absl::InvalidArgumentError(args.empty() ? "the chat template refused the messages"
                                                     : ToText(args[0]));
    }
    if (callee.kind == Expr::kName && callee.name == "namespace") {
      json ns = {{"__namespace__", true}};
      for (auto& [k, v] : kwargs) ns[k] = v.v;
      return Value{ns};
    }
    if (callee.kind == Expr::kAttr) {
      ASSIGN_OR_RETURN(Value self, Eval(*callee.args[0]));
      const std::string& m = callee.name;
      if (self.v.is_string()) {
        const std::string& s = self.v.get_ref<const std::string&>();
        const std::string arg0 = args.empty() ? "" : ToText(args[0]);
        if (m == "strip") return Value{json(std::string(absl::StripAsciiWhitespace(s)))};
        if (m == "lstrip") return Value{json(std::string(absl::StripLeadingAsciiWhitespace(s)))};
        if (m == "rstrip") return Value{json(std::string(absl::StripTrailingAsciiWhitespace(s)))};
        if (m == "upper") return Value{json(absl::AsciiStrToUpper(s))};
        if (m == "lower") return Value{json(absl::AsciiStrToLower(s))};
        if (m == "startswith") return Value{json(absl::StartsWith(s, arg0))};
        if (m == "endswith") return Value{json(absl::EndsWith(s, arg0))};
        if (m == "title") return Value{json(Title(s))};
      }
      if (self.v.is_object() && m == "items") {
        json items = json::array();
        for (const auto& [k, v] : self.v.items()) {
          if (k != "__namespace__") items.push_back(json::array({k, v}));
        }
        return Value{items};
      }
      if (self.v.is_object() && m == "get") {
        if (!args.empty() && args[0].v.is_string() &&
            self.v.contains(args[0].v.get<std::string>())) {
          return Value{self.v[args[0].v.get<std::string>()]};
        }
        return args.size() > 1 ? args[1] : Value{json()};
      }
      return Bad(e.line, absl::StrCat("unsupported method '", m, "'"));
    }
    return Bad(e.line, absl::StrCat("unsupported function '", callee.name, "'"));
  }

  static std::string Title(const std::string& s) {
    std::string out = s;
    bool start = true;
    for (char& c : out) {
      const bool alpha = std::isalpha(static_cast<unsigned char>(c));
      c = alpha ? (start ? absl::ascii_toupper(c) : absl::ascii_tolower(c)) : c;
      start = !alpha;
    }
    return out;
  }

  absl::StatusOr<Value> Filter(const Expr& e) {
    ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
    std::vector<Value> args;
    for (size_t i = 1; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.push_back(std::move(v));
    }
    const std::string& f = e.name;
    if (f == "trim") return Value{json(std::string(absl::StripAsciiWhitespace(ToText(x))))};
    if (f == "upper") return Value{json(absl::AsciiStrToUpper(ToText(x)))};
    if (f == "lower") return Value{json(absl::AsciiStrToLower(ToText(x)))};
    if (f == "title") return Value{json(Title(ToText(x)))};
    if (f == "capitalize") {
      std::string s = absl::AsciiStrToLower(ToText(x));
      if (!s.empty()) s[0] = absl::ascii_toupper(s[0]);
      return Value{json(s)};
    }
    if (f == "string") return Value{json(ToText(x))};
    if (f == "length" || f == "count") {
      if (x.v.is_string() || x.v.is_array() || x.v.is_object()) return Value{json(Length(x.v))};
      return Bad(e.line, "length of a value that has none");
    }
    if (f == "tojson") return Value{json(PythonJson(x.v))};
    if (f == "default" || f == "d") {
      if (x.undefined) return args.empty() ? Value{json("")} : args[0];
      return x;
    }
    if (f == "join") {
      if (!x.v.is_array()) return Bad(e.line, "join of a value that is not a list");
      std::vector<std::string> parts;
      for (const json& item : x.v) parts.push_back(ToText(Value{item}));
      return Value{json(absl::StrJoin(parts, args.empty() ? "" : ToText(args[0])))};
    }
    if (f == "first" || f == "last") {
      if (!x.v.is_array() || x.v.empty()) return Value::Undefined();
      return Value{f == "first" ? x.v.front() : x.v.back()};
    }
    return Bad(e.line, absl::StrCat("unsupported filter '", f, "'"));
  }

  absl::StatusOr<bool> Test(const std::string& name, const Value& x, int line) {
    if (name == "defined") return !x.undefined;
    if (name == "undefined") return x.undefined;
    if (name == "none") return !x.undefined && x.v.is_null();
    if (name == "string") return x.v.is_string();
    if (name == "number") return x.v.is_number();
    if (name == "integer") return x.v.is_number_integer();
    if (name == "boolean") return x.v.is_boolean();
    if (name == "mapping") return x.v.is_object();
    if (name == "sequence" || name == "iterable") {
      return x.v.is_array() || x.v.is_string() || x.v.is_object();
    }
    if (name == "true") return x.v.is_boolean() && x.v.get<bool>();
    if (name == "false") return x.v.is_boolean() && !x.v.get<bool>();
    return Bad(line, absl::StrCat("unsupported test '", name, "'"));
  }

  static bool IsNum(const Value& x) { return x.v.is_number() && !x.v.is_boolean(); }

  absl::StatusOr<Value> Binary(const Expr& e) {
    const std::string& op = e.name;
    ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
    if (op == "and") {
      if (!Truthy(l)) return l;
      return Eval(*e.args[1]);
    }
    if (op == "or") {
      if (Truthy(l)) return l;
      return Eval(*e.args[1]);
    }
    ASSIGN_OR_RETURN(Value r, Eval(*e.args[1]));
    if (op == "~") return Value{json(ToText(l) + ToText(r))};
    if (op == "==" || op == "!=") {
      const json lv = l.undefined ? json() : l.v;
      const json rv = r.undefined ? json() : r.v;
      bool eq = lv == rv;
      if (IsNum(l) && IsNum(r)) eq = l.v.get<double>() == r.v.get<double>();
      return Value{json(op == "==" ? eq : !eq)};
    }
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.v.is_string() && l.v.is_string()) {
        found = absl::StrContains(r.v.get<std::string>(), l.v.get<std::string>());
      } else if (r.v.is_array()) {
        found = std::find(r.v.begin(), r.v.end(), l.v) != r.v.end();
      } else if (r.v.is_object() && l.v.is_string()) {
        found = r.v.contains(l.v.get<std::string>());
      } else if (!r.undefined) {
        return Bad(e.line, "'in' on a value that is not a string, list or mapping");
      }
      return Value{json(op == "in" ? found : !found)};
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int c = 0;
      if (IsNum(l) && IsNum(r)) {
        const double a = l.v.get<double>(), b = r.v.get<double>();
        c = a < b ? -1 : a > b ? 1 : 0;
      } else if (l.v.is_string() && r.v.is_string()) {
        c = l.v.get<std::string>().compare(r.v.get<std::string>());
      } else {
        return Bad(e.line, absl::StrCat("cannot compare with '", op, "'"));
      }
      const bool r_ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
      return Value{json(r_ok)};
    }
    if (op == "+") {
      if (l.v.is_string() && r.v.is_string()) {
        return Value{json(l.v.get<std::string>() + r.v.get<std::string>())};
      }
      if (l.v.is_array() && r.v.is_array()) {
        json out = l.v;
        for (const json& item : r.v) out.push_back(item);
        return Value{out};
      }
    }
    if (IsNum(l) && IsNum(r)) {
      const bool ints = l.v.is_number_integer() && r.v.is_number_integer();
      if (ints && op != "/") {
        const int64_t a = l.v.get<int64_t>(), b = r.v.get<int64_t>();
        int64_t out = 0;
        const bool overflow = op == "+"   ? __builtin_add_overflow(a, b, &out)
                              : op == "-" ? __builtin_sub_overflow(a, b, &out)
                              : op == "*" ? __builtin_mul_overflow(a, b, &out)
                                          : false;
        if (overflow) return Bad(e.line, "integer overflow");
        if (op == "+" || op == "-" || op == "*") return Value{json(out)};
        if (b == 0) return Bad(e.line, "division by zero");
        if (b == -1 && a == std::numeric_limits<int64_t>::min()) {
          return Bad(e.line, "integer overflow");
        }
        // Python's: the remainder takes the divisor's sign, the quotient rounds down.
        int64_t rem = a % b;
        int64_t quot = a / b;
        if (rem != 0 && ((rem < 0) != (b < 0))) {
          rem += b;
          --quot;
        }
        if (op == "%") return Value{json(rem)};
        if (op == "//") return Value{json(quot)};
      }
      const double a = l.v.get<double>(), b = r.v.get<double>();
      if (op == "+") return Value{json(a + b)};
      if (op == "-") return Value{json(a - b)};
      if (op == "*") return Value{json(a * b)};
      if (b == 0) return Bad(e.line, "division by zero");
      if (op == "/") return Value{json(a / b)};
      if (op == "%") return Value{json(a - b * std::floor(a / b))};
      if (op == "//") return Value{json(std::floor(a / b))};
    }
    return Bad(e.line, absl::StrCat("unsupported operands for '", op, "'"));
  }

  const json* globals_;
  std::vector<std::map<std::string, Value>> scopes_;
};

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const Node> root, std::string source)
    : root_(std::move(root)), source_(std::move(source)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(absl::string_view source) {
  // Jinja drops one newline at the end of the source (keep_trailing_newline is off).
  if (absl::EndsWith(source, "\n")) source.remove_suffix(1);
  ASSIGN_OR_RETURN(std::vector<Segment> segments, Split(source));
  TemplateParser parser(std::move(segments));
  ASSIGN_OR_RETURN(std::unique_ptr<Node> root, parser.ParseAll());
  return ChatTemplate(std::shared_ptr<const Node>(std::move(root)), std::string(source));
}

absl::StatusOr<std::string> ChatTemplate::Render(const json& context) const {
  Renderer renderer(context);
  std::string out;
  RETURN_IF_ERROR(renderer.Run(*root_, out));
  return out;
}

absl::StatusOr<std::string> ChatTemplate::RenderChat(const Chat& chat, const std::string& bos_token,
                                                     const std::string& eos_token) const {
  json context = {{"bos_token", bos_token}, {"eos_token", eos_token}};
  for (const auto& [key, value] : chat.kwargs.items()) context[key] = value;
  context["messages"] = chat.messages;
  context["add_generation_prompt"] = chat.add_generation_prompt;
  context["tools"] = chat.tools;
  if (!chat.continue_final_message) return Render(context);

  // transformers' way: a marker after the final message's content, the rendering cut there.
  static constexpr absl::string_view kTag = "CONTINUE_FINAL_MESSAGE_TAG ";
  if (chat.messages.empty()) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the conversation is empty");
  }
  const json& last = chat.messages.back();
  if (!last.contains("content") || !last["content"].is_string()) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the final message has no \"content\" to continue");
  }
  if (!absl::StrContains(source_, "content")) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the chat template does not use 'content'");
  }
  const std::string final_message = last["content"].get<std::string>();
  context["messages"].back()["content"] = absl::StrCat(final_message, kTag);
  ASSIGN_OR_RETURN(std::string rendered, Render(context));
  const absl::string_view stripped_tag = absl::StripAsciiWhitespace(kTag);
  if (!absl::StrContains(rendered, absl::StripAsciiWhitespace(final_message)) ||
      !absl::StrContains(rendered, stripped_tag)) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template (the template deletes part of it)");
  }
  const size_t at = absl::string_view(rendered).rfind(stripped_tag);
  const bool spacing_kept = absl::string_view(rendered).substr(at, kTag.size()) == kTag;
  rendered.resize(at);
  // Where the template trimmed the marker's trailing space, what precedes the marker is trimmed.
  if (!spacing_kept) rendered.resize(absl::StripTrailingAsciiWhitespace(rendered).size());
  return rendered;
}

}  // namespace mqa
