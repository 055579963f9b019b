// libFuzzer target for the HTTP API's request parsing (runtime/http/api_types.h): arbitrary bytes
// as the body of every endpoint give a request or an error naming a field, never a crash or
// undefined behaviour; what is accepted holds the ranges the server relies on, and every error
// renders as an OpenAI error body with a 4xx status. Built with clang++ (CMakeLists.txt beside).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/http/api_types.h"
#include "runtime/http/tool_calls.h"
#include "runtime/status.h"

namespace {

void CheckError(const absl::Status& status) {
  const int http = mqa::HttpStatusFor(status);
  MQA_CHECK(http >= 400 && http < 500);
  const nlohmann::json body = nlohmann::json::parse(mqa::ErrorBody(status), nullptr, false);
  MQA_CHECK(!body.is_discarded());
  const std::string param = mqa::ErrorParam(status);
  MQA_CHECK(param.empty() ? body["error"]["param"].is_null() : body["error"]["param"] == param);
}

// The Hermes tool-call parser on the body as model text: the stream, fed in two pieces, sends the
// plain answer's calls and content wherever the plain answer has calls (every block read; an
// unreadable block goes out as content, tag and all).
void CheckHermes(absl::string_view text) {
  const mqa::ToolAnswer plain = mqa::ReadHermesToolCalls(text);
  MQA_CHECK(!plain.calls.empty() || plain.content == std::string(text));
  mqa::HermesToolCallStreamer streamer;
  const size_t cut = text.size() / 2;
  mqa::HermesToolCallStreamer::Delta first = streamer.Feed(text.substr(0, cut), false);
  mqa::HermesToolCallStreamer::Delta rest = streamer.Feed(text, true);
  if (plain.calls.empty()) return;
  std::vector<mqa::ToolCall> calls = first.calls;
  calls.insert(calls.end(), rest.calls.begin(), rest.calls.end());
  MQA_CHECK(calls.size() == plain.calls.size());
  for (size_t k = 0; k < calls.size(); ++k) {
    MQA_CHECK(calls[k].name == plain.calls[k].name &&
              calls[k].arguments == plain.calls[k].arguments);
  }
  MQA_CHECK(first.content + rest.content == plain.content.value_or(""));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  CheckHermes(body);
  if (auto r = mqa::ParseCompletionRequest(body); r.ok()) {
    const mqa::SamplingParams& p = r->params;
    MQA_CHECK(!r->prompts.empty() && r->prompts.size() <= mqa::kMaxPromptsPerRequest);
    MQA_CHECK(p.n >= 1 && p.n <= mqa::kMaxN);
    MQA_CHECK(p.guided_regex.empty() || p.guided_grammar.empty());  // one guide at most
    MQA_CHECK(p.max_tokens >= 1 || (p.max_tokens == 0 && r->echo));
    // Echo with logprobs and vLLM's prompt_logprobs ask the engine for the prompt's scores.
    if (r->echo && p.logprobs.has_value()) {
      MQA_CHECK(p.prompt_logprobs.has_value() && *p.prompt_logprobs >= *p.logprobs);
    }
    if (r->prompt_logprobs.has_value()) {
      MQA_CHECK(!r->stream && p.prompt_logprobs.has_value() &&
                *p.prompt_logprobs >= *r->prompt_logprobs);
    }
    if (p.prompt_logprobs.has_value()) {
      MQA_CHECK(*p.prompt_logprobs >= 0 && *p.prompt_logprobs <= mqa::kMaxLogprobs);
    }
    if (r->truncate_prompt_tokens.has_value()) {
      MQA_CHECK(*r->truncate_prompt_tokens >= 1 && !r->suffix.has_value());
    }
    MQA_CHECK(p.temperature >= 0 && p.top_p > 0 && p.top_p <= 1 && p.top_k >= -1);
    for (const auto& [id, bias] : p.logit_bias) MQA_CHECK(id >= 0 && bias >= -100 && bias <= 100);
    for (int32_t id : p.allowed_token_ids) MQA_CHECK(id >= 0);
    if (r->suffix.has_value()) {
      MQA_CHECK(!r->echo);
      for (const mqa::PromptInput& prompt : r->prompts) MQA_CHECK(prompt.is_text);
    }
    for (const mqa::PromptInput& prompt : r->prompts) {
      for (int32_t id : prompt.token_ids) MQA_CHECK(id >= 0);
    }
  } else {
    CheckError(r.status());
  }
  if (auto r = mqa::ParseInfillRequest(body); !r.ok()) CheckError(r.status());
  if (auto r = mqa::ParseChatRequest(body); r.ok()) {
    const mqa::ChatTemplate::Chat& chat = r->chat;
    MQA_CHECK(chat.messages.is_array() && !chat.messages.empty());
    for (const nlohmann::json& m : chat.messages) {
      MQA_CHECK(m["role"].is_string() && m["content"].is_string());
    }
    MQA_CHECK(!(chat.continue_final_message && chat.add_generation_prompt));
    MQA_CHECK(chat.kwargs.is_object() && !chat.kwargs.contains("messages"));
    MQA_CHECK(r->common.params.max_tokens >= 1 && r->common.prompts.empty());
    MQA_CHECK(chat.tools.is_null() || (chat.tools.is_array() && !chat.tools.empty()));
    if (r->tool_choice.mode == mqa::ToolChoiceMode::kAuto) {
      MQA_CHECK(!chat.tools.is_null() && !r->echo);  // the model decides; nothing guided for it
    } else if (r->tool_choice.mode != mqa::ToolChoiceMode::kNone) {
      // A tool choice guides the output, and names a tool given.
      MQA_CHECK(
          !chat.tools.is_null() && !r->echo &&
          (!r->common.params.guided_regex.empty() || !r->common.params.guided_grammar.empty()));
      bool named = r->tool_choice.mode == mqa::ToolChoiceMode::kRequired;
      for (const nlohmann::json& tool : chat.tools) {
        named |= tool["function"]["name"] == r->tool_choice.name;
      }
      MQA_CHECK(named);
    }
  } else {
    CheckError(r.status());
  }
  // A previous conversation of one turn and its answer for ids starting "resp_"; 404 otherwise.
  const nlohmann::ordered_json kEarlier = {{{"role", "user"}, {"content", "a"}},
                                           {{"role", "assistant"}, {"content", "b"}}};
  const mqa::PreviousConversation previous =
      [&](const std::string& id) -> absl::StatusOr<nlohmann::ordered_json> {
    if (id.rfind("resp_", 0) != 0) {
      return mqa::ApiError(absl::StatusCode::kNotFound, "previous_response_id", "unknown");
    }
    return kEarlier;
  };
  if (auto r = mqa::ParseResponsesRequest(body, {}, previous); r.ok()) {
    const mqa::ChatTemplate::Chat& chat = r->chat.chat;
    MQA_CHECK(chat.messages.is_array() && !chat.messages.empty());
    for (const nlohmann::json& m : chat.messages) {
      MQA_CHECK(m["role"].is_string() && m["content"].is_string() && m["role"] != "developer");
    }
    // The conversation is the messages after the instructions; each input an item.
    MQA_CHECK(r->conversation.size() + (r->instructions.has_value() ? 1 : 0) ==
              chat.messages.size());
    // (Consecutive function_call items are one assistant message.)
    MQA_CHECK(r->conversation.size() <=
              r->input_items.size() + (r->previous_response_id.has_value() ? 2 : 0));
    MQA_CHECK(r->chat.tool_choice.mode == mqa::ToolChoiceMode::kNone || !chat.tools.is_null());
    MQA_CHECK(r->chat.common.params.n == 1);
    MQA_CHECK(!r->max_output_tokens.has_value() || *r->max_output_tokens >= 1);
    MQA_CHECK(r->metadata.is_null() || r->metadata.is_object());
  } else {
    CheckError(r.status());
  }
  if (auto r = mqa::ParseTritonGenerateRequest(body); r.ok()) {
    const mqa::CompletionRequest& c = r->completion;
    MQA_CHECK(c.prompts.size() == 1 && c.prompts[0].is_text && !c.prompts[0].text.empty());
    MQA_CHECK(c.params.max_tokens >= 1 && c.params.temperature >= 0);
    MQA_CHECK(c.params.top_p > 0 && c.params.top_p <= 1 && c.params.top_k >= -1);
    for (const std::string& word : c.params.stop) MQA_CHECK(!word.empty());
  } else {
    CheckError(r.status());
    MQA_CHECK(nlohmann::json::parse(mqa::TritonErrorBody(r.status()))["error"].is_string());
  }
  for (const bool count_only : {false, true}) {
    if (auto r = mqa::ParseAnthropicRequest(body, {}, count_only); r.ok()) {
      const mqa::ChatTemplate::Chat& chat = r->chat;
      MQA_CHECK(chat.messages.is_array() && !chat.messages.empty());
      for (const nlohmann::json& m : chat.messages) MQA_CHECK(m["content"].is_string());
      MQA_CHECK(r->common.params.n == 1 && r->common.prompts.empty());
      MQA_CHECK(count_only || r->common.max_tokens_given);
    } else {
      CheckError(r.status());
      MQA_CHECK(nlohmann::json::parse(mqa::AnthropicErrorBody(r.status()))["type"] == "error");
    }
  }
  for (const bool infill : {false, true}) {
    if (auto r = mqa::ParseLlamaCppRequest(body, infill, 2048); r.ok()) {
      const mqa::SamplingParams& p = r->completion.params;
      MQA_CHECK(p.temperature >= 0 && p.top_p > 0 && p.top_p <= 1 && p.min_p >= 0 && p.min_p <= 1);
      MQA_CHECK(p.typical_p > 0 && p.typical_p <= 1 && p.repetition_penalty > 0);
      MQA_CHECK(p.penalty_last_n == -1 || p.penalty_last_n >= 1);
      MQA_CHECK(p.guided_grammar.empty() || p.guided_regex.empty());
      MQA_CHECK(infill ? r->completion.prompts.empty() : r->completion.prompts.size() == 1);
      MQA_CHECK(p.max_tokens >= 0);
    } else {
      CheckError(r.status());
    }
  }
  if (auto r = mqa::ParseTgiRequest(body); r.ok()) {
    const mqa::SamplingParams& p = r->completion.params;
    MQA_CHECK(r->completion.prompts.size() == 1 && !r->completion.prompts[0].text.empty());
    MQA_CHECK(p.max_tokens >= 1 && p.n == 1);
    MQA_CHECK(r->sampling ? p.temperature > 0 : p.temperature == 0);
    MQA_CHECK(p.top_p > 0 && p.top_p <= 1 && p.top_k >= -1 && p.top_k != 0);
    MQA_CHECK(r->top_n_tokens >= 0 && r->top_n_tokens <= mqa::kTgiMaxTopNTokens);
    MQA_CHECK(p.Validate().ok());
  } else {
    CheckError(r.status());
    const nlohmann::json tgi = nlohmann::json::parse(mqa::TgiErrorBody(r.status()), nullptr, false);
    MQA_CHECK(!tgi.is_discarded() && tgi["error"].is_string() && tgi["error_type"].is_string());
  }
  if (auto r = mqa::ParseTokenizeRequest(body); !r.ok()) CheckError(r.status());
  if (auto r = mqa::ParseDetokenizeRequest(body); r.ok()) {
    for (int32_t id : r->tokens) MQA_CHECK(id >= 0);
  } else {
    CheckError(r.status());
  }
  return 0;
}
