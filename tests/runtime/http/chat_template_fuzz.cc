// libFuzzer target: any text as a chat template. Parse either refuses it with InvalidArgument or
// yields a template that renders a fixed conversation (as it is, and continued) to a string or an
// InvalidArgument — never a crash, a hang or another error code (templates are read at start-up: a
// bad one must be a clear error there).
#include <cstddef>
#include <cstdint>

#include "nlohmann/json.hpp"
#include "runtime/http/chat_template.h"
#include "runtime/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<mqa::ChatTemplate> t = mqa::ChatTemplate::Parse(source);
  if (!t.ok()) {
    MQA_CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  static const nlohmann::json context = {
      {"messages",
       {{{"role", "system"}, {"content", "be brief"}},
        {{"role", "user"}, {"content", "def f(x):"}, {"name", "ada"}},
        {{"role", "assistant"}, {"content", "  return x  "}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  absl::StatusOr<std::string> out = t->Render(context);
  if (!out.ok()) MQA_CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
  // The same conversation continued (continue_final_message: a marker rendered, the text cut
  // there) with an extra variable: rendered or refused with InvalidArgument, too.
  const mqa::ChatTemplate::Chat chat{.messages = context["messages"],
                                     .add_generation_prompt = false,
                                     .continue_final_message = true,
                                     .kwargs = {{"extra", 1}}};
  absl::StatusOr<std::string> continued = t->RenderChat(chat, "<s>", "</s>");
  if (!continued.ok()) MQA_CHECK(continued.status().code() == absl::StatusCode::kInvalidArgument);
  return 0;
}
