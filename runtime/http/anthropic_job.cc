#include "runtime/http/anthropic_job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/http/api_types.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

std::string Event(const std::string& type, json data) {
  data["type"] = type;
  return absl::StrCat("event: ", type, "\n", SseEvent(data));
}

}  // namespace

AnthropicJob::AnthropicJob(std::shared_ptr<CompletionJob> inner, ToolChoice tool_choice)
    : CompletionJobView(std::move(inner)),
      id_(absl::StrCat("msg_", this->inner().options().id)),
      tool_choice_(std::move(tool_choice)) {
  MQA_CHECK(this->inner().num_prompts() == 1 && this->inner().num_choices() == 1);
}

json AnthropicJob::StopFields() const {
  const CompletionJob::Choice& c = inner().choice(0);
  if (!c.finish_reason.has_value()) return {{"stop_reason", nullptr}, {"stop_sequence", nullptr}};
  if (*c.finish_reason == FinishReason::kLength) {
    return {{"stop_reason", "max_tokens"}, {"stop_sequence", nullptr}};
  }
  if (!streams_text() && !ReadToolAnswer(tool_choice_, c.text).calls.empty()) {
    return {{"stop_reason", "tool_use"}, {"stop_sequence", nullptr}};
  }
  // A stop string ended it (stop_sequences), or the model's end of turn (EOS, a stop token).
  if (*c.finish_reason == FinishReason::kStop && !c.stop_reason.empty() &&
      !c.stop_token_id.has_value()) {
    return {{"stop_reason", "stop_sequence"}, {"stop_sequence", c.stop_reason}};
  }
  return {{"stop_reason", "end_turn"}, {"stop_sequence", nullptr}};
}

json AnthropicJob::Usage() const {
  const json usage = inner().UsageJson();
  const int64_t cached = inner().cached_prompt_tokens(0);
  // Anthropic counts cache reads apart from input_tokens.
  return {{"input_tokens", usage["prompt_tokens"].get<int64_t>() - cached},
          {"cache_read_input_tokens", cached},
          {"cache_creation_input_tokens", 0},
          {"output_tokens", usage["completion_tokens"]}};
}

json AnthropicJob::MessageObject(bool in_progress) const {
  json message = {{"id", id_},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", inner().options().model},
                  {"content", json::array()}};
  if (in_progress) {
    message["stop_reason"] = nullptr;
    message["stop_sequence"] = nullptr;
  } else {
    message["content"] = ContentBlocks();
    message.update(StopFields());
  }
  message["usage"] = Usage();
  return message;
}

json AnthropicJob::ContentBlocks() const {
  const std::string& text = inner().choice(0).text;
  json blocks = json::array();
  if (streams_text()) {
    blocks.push_back({{"type", "text"}, {"text", text}});
    return blocks;
  }
  ToolAnswer answer = ReadToolAnswer(tool_choice_, text);
  if (answer.content.has_value()) blocks.push_back({{"type", "text"}, {"text", *answer.content}});
  for (size_t k = 0; k < answer.calls.size(); ++k) {
    json input = json::parse(answer.calls[k].arguments, nullptr, false);
    if (!input.is_object()) input = json::object();  // (guided calls are objects)
    blocks.push_back({{"type", "tool_use"},
                      {"id", ToolUseId(k)},
                      {"name", answer.calls[k].name},
                      {"input", std::move(input)}});
  }
  return blocks;
}

std::string AnthropicJob::ToolUseId(size_t k) const {
  return absl::StrCat("toolu_", absl::StripPrefix(id_, "msg_"), "_", k);
}

void AnthropicJob::OpenText(std::string* chunks) const {
  if (block_open_) return;
  absl::StrAppend(chunks, Event("content_block_start",
                                {{"index", next_block_},
                                 {"content_block", {{"type", "text"}, {"text", ""}}}}));
  block_open_ = true;
}

void AnthropicJob::AddText(const std::string& piece, std::string* chunks) const {
  OpenText(chunks);
  absl::StrAppend(chunks, Event("content_block_delta",
                                {{"index", next_block_},
                                 {"delta", {{"type", "text_delta"}, {"text", piece}}}}));
}

void AnthropicJob::CloseBlock(std::string* chunks) const {
  if (!block_open_) return;
  absl::StrAppend(chunks, Event("content_block_stop", {{"index", next_block_}}));
  block_open_ = false;
  ++next_block_;
}

void AnthropicJob::OpenToolUse(const std::string& name, std::string* chunks) const {
  CloseBlock(chunks);
  absl::StrAppend(chunks, Event("content_block_start", {{"index", next_block_},
                                                        {"content_block",
                                                         {{"type", "tool_use"},
                                                          {"id", ToolUseId(calls_sent_++)},
                                                          {"name", name},
                                                          {"input", json::object()}}}}));
  block_open_ = true;
}

void AnthropicJob::InputDelta(const std::string& partial_json, std::string* chunks) const {
  absl::StrAppend(chunks,
                  Event("content_block_delta",
                        {{"index", next_block_},
                         {"delta", {{"type", "input_json_delta"}, {"partial_json", partial_json}}}}));
}

void AnthropicJob::WholeToolUse(const ToolCall& call, std::string* chunks) const {
  json input = json::parse(call.arguments, nullptr, false);
  if (!input.is_object()) input = json::object();
  OpenToolUse(call.name, chunks);
  InputDelta(input.dump(), chunks);
  CloseBlock(chunks);
}

void AnthropicJob::StreamBlocks(bool finished, std::string* chunks) const {
  const std::string& text = inner().choice(0).text;
  switch (tool_choice_.mode) {
    case ToolChoiceMode::kNone:  // the text is the one text block (opened with the stream)
      if (text.size() > sent_bytes_) {
        AddText(text.substr(sent_bytes_), chunks);
        sent_bytes_ = text.size();
      }
      break;
    case ToolChoiceMode::kNamed:  // the text is the call's arguments
      if (!block_open_ && (text.size() > sent_bytes_ || finished)) {
        OpenToolUse(tool_choice_.name, chunks);
      }
      if (text.size() > sent_bytes_) {
        InputDelta(text.substr(sent_bytes_), chunks);
        sent_bytes_ = text.size();
      }
      break;
    case ToolChoiceMode::kRequired:
      for (const ToolCall& call : scanner_.Feed(text)) WholeToolUse(call, chunks);
      if (finished && calls_sent_ == 0) AddText(text, chunks);  // never a list: the text
      break;
    case ToolChoiceMode::kAuto: {
      HermesToolCallStreamer::Delta got = hermes_.Feed(text, finished);
      if (!got.content.empty()) AddText(got.content, chunks);
      for (const ToolCall& call : got.calls) WholeToolUse(call, chunks);
      break;
    }
  }
  if (finished) CloseBlock(chunks);
}

std::string AnthropicJob::OpeningChunks() {
  json start = MessageObject(/*in_progress=*/true);
  start["usage"]["output_tokens"] = 0;
  std::string chunks = Event("message_start", {{"message", std::move(start)}});
  if (streams_text()) OpenText(&chunks);  // with tools, blocks open as the text makes them
  absl::StrAppend(&chunks, Event("ping", json::object()));
  return chunks;
}

bool AnthropicJob::Drain(absl::Duration timeout, std::string* chunks) {
  const bool got = DrainInner(timeout);
  if (chunks != nullptr) StreamBlocks(/*finished=*/false, chunks);
  return got;
}

std::string AnthropicJob::ClosingChunks(const absl::Status& error) const {
  if (!error.ok()) {
    json body = json::parse(ErrorBody(error), nullptr, false);
    return Event("error", body.is_object() ? body : json::object());
  }
  std::string chunks;
  StreamBlocks(/*finished=*/true, &chunks);
  absl::StrAppend(
      &chunks, Event("message_delta", {{"delta", StopFields()},
                                       {"usage", {{"output_tokens", Usage()["output_tokens"]}}}}));
  absl::StrAppend(&chunks, Event("message_stop", json::object()));
  return chunks;
}

std::string AnthropicJob::ResponseBody() const { return DumpJson(MessageObject(false)); }

std::string AnthropicJob::ErrorBody(const absl::Status& status) const {
  return AnthropicErrorBody(status);
}

}  // namespace mqa
