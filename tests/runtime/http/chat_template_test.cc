// ChatTemplate against Hugging Face: every case of chat_templates/cases.json (written by
// chat_templates/make_cases.py through transformers' apply_chat_template) rendered the same, or
// refused with the template's own message; and templates this subset cannot run are refused at
// Parse or Render with the line named, never rendered wrong.
#include "runtime/http/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "tests/source_dir.h"

namespace mqa {
namespace {

using json = nlohmann::json;

using testing::SourceDir;

TEST(ChatTemplate, RendersAsTransformersDoes) {
  std::ifstream f(SourceDir() + "/tests/runtime/http/chat_templates/cases.json");
  ASSERT_TRUE(f.good());
  const json cases = json::parse(f);
  ASSERT_GE(cases.size(), 290u);
  int rendered = 0, raised = 0;
  for (const json& c : cases) {
    const std::string name = c["name"];
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(c["template"].get<std::string>());
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    const ChatTemplate::Chat chat{.messages = c["messages"],
                                  .add_generation_prompt = c["add_generation_prompt"],
                                  .continue_final_message = c["continue_final_message"],
                                  .kwargs = c["kwargs"],
                                  .tools = c.value("tools", json())};
    absl::StatusOr<std::string> got = t->RenderChat(chat, c["bos_token"], c["eos_token"]);
    if (c.contains("error")) {
      ASSERT_FALSE(got.ok()) << name << " rendered " << *got;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      const std::string want = c["error"];
      if (absl::StartsWith(want, "continue_final_message")) {
        // transformers' own wording, with the rendering appended: the same first clause.
        EXPECT_TRUE(absl::StartsWith(got.status().message(), want.substr(0, want.find('!'))))
            << name << ": " << got.status();
      } else {
        EXPECT_EQ(got.status().message(), want) << name;  // the template's raise_exception
      }
      ++raised;
    } else {
      ASSERT_TRUE(got.ok()) << name << ": " << got.status();
      EXPECT_EQ(*got, c["expected"].get<std::string>()) << name;
      ++rendered;
    }
  }
  EXPECT_GT(rendered, 150);
  EXPECT_GT(raised, 10);
}

TEST(ChatTemplate, WhatItCannotRunIsRefusedWithTheLine) {
  for (const char* source : {"{% if x %}no end", "{% for m in messages %}", "{{ x", "{% endif %}",
                             "{% macro f() %}{% endmacro %}", "{{ 'unterminated }}",
                             "line one\n{{ x ! y }}", "{% for in x %}{% endfor %}",
                             // an empty condition (the fuzzer's first find: a read before the
                             // token list), and nesting past the limit
                             "{% if %}x{% endif %}", "{%-%}", "{{- -}}",
                             "{{ ((((((((((((((((((((((((((((((((((((((("
                             "(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
                             "((((((((((((((((((((1 }}"}) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
    EXPECT_FALSE(t.ok()) << source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << source;
  }
  EXPECT_NE(ChatTemplate::Parse("a\nb\n{{ x ! y }}").status().message().find("line 3"),
            std::string::npos);
  for (const char* source : {"{{ x | frobnicate }}", "{{ unknown_fn() }}", "{{ 1 / 0 }}",
                             "{{ messages is weird }}", "{{ 'a' - 1 }}"}) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
    ASSERT_TRUE(t.ok()) << source << ": " << t.status();
    absl::StatusOr<std::string> got = t->Render({{"messages", json::array()}});
    EXPECT_FALSE(got.ok()) << source << " rendered " << *got;
  }
  // Integer arithmetic as Python's, overflow refused (the fuzzer found it undefined before).
  absl::StatusOr<ChatTemplate> arithmetic =
      ChatTemplate::Parse("{{ -7 // 2 }} {{ -7 % 2 }} {{ 7 % -2 }} {{ 7 // -2 }} {{ 2 * 3 - 1 }}");
  ASSERT_TRUE(arithmetic.ok()) << arithmetic.status();
  EXPECT_EQ(*arithmetic->Render(json::object()), "-4 1 -1 -4 5");
  for (const char* source : {"{{ 9223372036854775807 + 1 }}", "{{ 5555555555555 * 555555555 }}",
                             "{{ (-9223372036854775807 - 1) // -1 }}"}) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
    ASSERT_TRUE(t.ok()) << source << ": " << t.status();
    absl::StatusOr<std::string> got = t->Render(json::object());
    EXPECT_FALSE(got.ok()) << source << " rendered " << *got;
  }
  // A dict key that is not UTF-8 (template text is bytes) prints with a replacement, not a throw.
  absl::StatusOr<ChatTemplate> bytes = ChatTemplate::Parse("{{ {'\xff': 1} | tojson }}");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(bytes->Render(json::object()).ok());
  // Undefined values print as nothing and are false, as in Jinja.
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::Parse("[{{ missing }}{{ messages[5] }}{% if missing %}x{% endif %}]");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Render({{"messages", json::array()}}), "[]");
}

}  // namespace
}  // namespace mqa
