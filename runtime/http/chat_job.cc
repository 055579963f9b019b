#include "runtime/http/chat_job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/http/api_types.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

}  // namespace

ChatJob::ChatJob(std::shared_ptr<CompletionJob> inner, bool logprobs, std::string echo,
                 ToolChoice tool_choice)
    : CompletionJobView(std::move(inner)),
      logprobs_(logprobs),
      echo_(std::move(echo)),
      num_choices_(this->inner().num_choices()),
      streamed_bytes_(num_choices_, 0),
      streamed_tokens_(num_choices_, 0),
      finish_sent_(num_choices_, false),
      tool_choice_(std::move(tool_choice)),
      call_scanners_(num_choices_),
      auto_streamers_(num_choices_),
      calls_streamed_(num_choices_, 0),
      named_call_ids_(num_choices_) {
  MQA_CHECK(this->inner().num_prompts() == 1);
  MQA_CHECK(echo_.empty() || tool_choice_.mode == ToolChoiceMode::kNone);
}

json ChatJob::FinishReasonOf(int i) const {
  const CompletionJob::Choice& c = inner().choice(i);
  // The calls end it: a required-form list that closed (not cut by max_tokens), or any calls the
  // auto parser read.
  const bool calls_may_end_it =
      (tool_choice_.mode == ToolChoiceMode::kRequired && c.finish_reason == FinishReason::kStop) ||
      (tool_choice_.mode == ToolChoiceMode::kAuto && c.finish_reason.has_value());
  if (calls_may_end_it && !ReadToolAnswer(tool_choice_, c.text).calls.empty()) return "tool_calls";
  return CompletionJob::FinishReasonJson(c.finish_reason);
}

namespace {

json ToolCallJson(const ToolCall& call, int index = -1) {
  json out = {{"id", NewToolCallId()},
              {"type", "function"},
              {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  if (index >= 0) out["index"] = index;
  return out;
}

}  // namespace

json ChatJob::TextDelta(int i, const std::string& text, bool finished) {
  switch (tool_choice_.mode) {
    case ToolChoiceMode::kAuto: {
      const int first = auto_streamers_[i].calls_sent();
      HermesToolCallStreamer::Delta got = auto_streamers_[i].Feed(inner().choice(i).text, finished);
      json delta = json::object();
      if (!got.content.empty()) delta["content"] = std::move(got.content);
      if (!got.calls.empty()) {
        json calls = json::array();
        for (size_t k = 0; k < got.calls.size(); ++k) {
          calls.push_back(ToolCallJson(got.calls[k], first + static_cast<int>(k)));
        }
        delta["tool_calls"] = std::move(calls);
      }
      return delta;
    }
    case ToolChoiceMode::kNone:
      return {{"content", text}};
    case ToolChoiceMode::kNamed: {
      json call = {{"index", 0}, {"function", {{"arguments", text}}}};
      if (named_call_ids_[i].empty()) {  // the call's first delta names it
        named_call_ids_[i] = NewToolCallId();
        call = {{"index", 0},
                {"id", named_call_ids_[i]},
                {"type", "function"},
                {"function", {{"name", tool_choice_.name}, {"arguments", text}}}};
      }
      return {{"tool_calls", json::array({std::move(call)})}};
    }
    case ToolChoiceMode::kRequired: {
      json calls = json::array();
      for (ToolCall& call : call_scanners_[i].Feed(inner().choice(i).text)) {
        calls.push_back(ToolCallJson(call, calls_streamed_[i]++));
      }
      if (calls.empty()) return json::object();
      return {{"tool_calls", std::move(calls)}};
    }
  }
  return json::object();
}

json ChatJob::Message(int i) const {
  const CompletionJob::Choice& c = inner().choice(i);
  ToolAnswer answer = ReadToolAnswer(tool_choice_, c.text);
  if (answer.calls.empty()) return {{"role", "assistant"}, {"content", echo_ + c.text}};
  json tool_calls = json::array();
  for (const ToolCall& call : answer.calls) tool_calls.push_back(ToolCallJson(call));
  return {{"role", "assistant"},
          {"content", answer.content.has_value() ? json(*answer.content) : json(nullptr)},
          {"tool_calls", std::move(tool_calls)}};
}

json ChatJob::ChunkBase() const {
  return {{"id", inner().options().id},
          {"object", "chat.completion.chunk"},
          {"created", inner().options().created},
          {"model", inner().options().model}};
}

json ChatJob::LogprobsContent(int i, size_t from, size_t to) const {
  const CompletionJob::Choice& c = inner().choice(i);
  auto entry = [&](int32_t id, float logprob) {
    const std::string token = inner().tokenizer().Decode({id});
    std::vector<int> bytes;
    for (char b : token) bytes.push_back(static_cast<unsigned char>(b));
    return json{{"token", token}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
  };
  json content = json::array();
  for (size_t k = from; k < to && k < c.scores.size(); ++k) {
    json item = entry(c.token_ids[k], c.scores[k].logprob);
    json top = json::array();
    for (const TokenLogprob& alt : c.scores[k].top_logprobs) {
      top.push_back(entry(alt.token_id, alt.logprob));
    }
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return content;
}

std::string ChatJob::ChoiceChunk(int index, json delta, const json& finish, json logprobs) const {
  json choice = {{"index", index},
                 {"delta", std::move(delta)},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish}};
  if (!finish.is_null())
    choice["stop_reason"] = CompletionJob::StopReasonJson(inner().choice(index));
  json chunk = ChunkBase();
  chunk["choices"] = json::array({std::move(choice)});
  if (inner().options().include_usage) chunk["usage"] = nullptr;
  return SseEvent(chunk);
}

std::string ChatJob::OpeningChunks() {
  std::string chunks;
  for (int i = 0; i < num_choices_; ++i) {
    absl::StrAppend(&chunks, ChoiceChunk(i, {{"role", "assistant"}, {"content", echo_}}, nullptr));
  }
  return chunks;
}

bool ChatJob::Drain(absl::Duration timeout, std::string* chunks) {
  const bool got = DrainInner(timeout);
  if (chunks == nullptr) return got;
  for (int i = 0; i < num_choices_; ++i) {
    const CompletionJob::Choice& c = inner().choice(i);
    const bool new_tokens = logprobs_ && c.token_ids.size() > streamed_tokens_[i];
    // (auto: the parser may hold text back until the end.)
    const bool flush = tool_choice_.mode == ToolChoiceMode::kAuto && c.finish_reason.has_value() &&
                       !finish_sent_[i];
    if (c.text.size() > streamed_bytes_[i] || new_tokens || flush) {
      json logprobs = nullptr;
      if (logprobs_) {
        logprobs = {{"content", LogprobsContent(i, streamed_tokens_[i], c.token_ids.size())}};
        streamed_tokens_[i] = c.token_ids.size();
      }
      json delta = TextDelta(i, c.text.substr(streamed_bytes_[i]), c.finish_reason.has_value());
      streamed_bytes_[i] = c.text.size();
      // (A required-form call still open has nothing to send but its tokens' logprobs.)
      if (!delta.empty() || (logprobs_ && new_tokens)) {
        absl::StrAppend(chunks, ChoiceChunk(i, std::move(delta), nullptr, std::move(logprobs)));
      }
    }
    if (c.finish_reason.has_value() && !finish_sent_[i]) {
      absl::StrAppend(chunks, ChoiceChunk(i, json::object(), FinishReasonOf(i)));
      finish_sent_[i] = true;
    }
  }
  return got;
}

std::string ChatJob::ClosingChunks(const absl::Status& error) const {
  std::string chunks;
  if (!error.ok()) absl::StrAppend(&chunks, "data: ", inner().ErrorBody(error), "\n\n");
  if (inner().options().include_usage) {
    json chunk = ChunkBase();
    chunk["choices"] = json::array();
    chunk["usage"] = inner().UsageJson();
    absl::StrAppend(&chunks, SseEvent(chunk));
  }
  absl::StrAppend(&chunks, "data: [DONE]\n\n");
  return chunks;
}

std::string ChatJob::ResponseBody() const {
  json choices = json::array();
  for (int i = 0; i < num_choices_; ++i) {
    const CompletionJob::Choice& c = inner().choice(i);
    choices.push_back(
        {{"index", i},
         {"message", Message(i)},
         {"logprobs",
          logprobs_ ? json{{"content", LogprobsContent(i, 0, c.token_ids.size())}} : json(nullptr)},
         {"finish_reason", FinishReasonOf(i)},
         {"stop_reason", CompletionJob::StopReasonJson(c)}});
  }
  json body = {{"id", inner().options().id},           {"object", "chat.completion"},
               {"created", inner().options().created}, {"model", inner().options().model},
               {"choices", std::move(choices)},        {"usage", inner().UsageJson()}};
  return DumpJson(body);
}

}  // namespace mqa
