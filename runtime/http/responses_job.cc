#include "runtime/http/responses_job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

}  // namespace

ResponsesJob::ResponsesJob(std::shared_ptr<CompletionJob> inner, ResponsesJobOptions options)
    : CompletionJobView(std::move(inner)),
      options_(std::move(options)),
      item_id_(absl::StrCat("msg_", absl::StripPrefix(options_.id, "resp_"))) {
  MQA_CHECK(this->inner().num_prompts() == 1 && this->inner().num_choices() == 1);
}

void ResponsesJob::Store() {
  if (stored_ || options_.store == nullptr || !finished() || !error().ok()) return;
  stored_ = true;
  nlohmann::ordered_json conversation = options_.conversation;
  conversation.push_back({{"role", "assistant"}, {"content", inner().choice(0).text}});
  json items = options_.input_items;
  for (size_t i = 0; i < items.size(); ++i) {
    items[i]["id"] = absl::StrCat(item_id_, "_in", i);
    items[i]["status"] = "completed";
  }
  options_.store->Put(options_.id, {.response = Response(),
                                    .input_items = std::move(items),
                                    .conversation = std::move(conversation)});
}

json ResponsesJob::TextPart() const {
  return {{"type", "output_text"},
          {"text", inner().choice(0).text},
          {"annotations", json::array()},
          {"logprobs", json::array()}};
}

json ResponsesJob::Message() const {
  const CompletionJob::Choice& c = inner().choice(0);
  const char* status = !c.finish_reason.has_value()              ? "in_progress"
                       : *c.finish_reason == FinishReason::kStop ? "completed"
                                                                 : "incomplete";
  return {{"type", "message"},
          {"id", item_id_},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({TextPart()})}};
}

json ResponsesJob::Response(bool failed) const {
  const CompletionJob::Choice& c = inner().choice(0);
  std::string status = "in_progress";
  json incomplete = nullptr;
  if (failed) {
    status = "failed";
  } else if (c.finish_reason.has_value()) {
    status = *c.finish_reason == FinishReason::kStop ? "completed" : "incomplete";
    if (*c.finish_reason == FinishReason::kLength) {
      incomplete = {{"reason", "max_output_tokens"}};
    } else if (*c.finish_reason == FinishReason::kAbort) {
      incomplete = {{"reason", "aborted"}};
    }
  }
  json usage = nullptr;
  json output = json::array();
  if (status != "in_progress") {
    const json chat_usage = inner().UsageJson();
    const int64_t input = chat_usage["prompt_tokens"],
                  output_tokens = chat_usage["completion_tokens"];
    usage = {{"input_tokens", input},
             {"input_tokens_details", {{"cached_tokens", inner().cached_prompt_tokens(0)}}},
             {"output_tokens", output_tokens},
             {"output_tokens_details", {{"reasoning_tokens", 0}}},
             {"total_tokens", input + output_tokens}};
    if (!failed) output.push_back(Message());
  }
  return {
      {"id", options_.id},
      {"object", "response"},
      {"created_at", inner().options().created},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details", std::move(incomplete)},
      {"instructions",
       options_.instructions.has_value() ? json(*options_.instructions) : json(nullptr)},
      {"max_output_tokens",
       options_.max_output_tokens.has_value() ? json(*options_.max_output_tokens) : json(nullptr)},
      {"model", inner().options().model},
      {"output", std::move(output)},
      {"parallel_tool_calls", false},
      {"previous_response_id", options_.previous_response_id.has_value()
                                   ? json(*options_.previous_response_id)
                                   : json(nullptr)},
      {"reasoning", nullptr},
      {"store", options_.store != nullptr},
      {"temperature", options_.temperature},
      {"text", {{"format", options_.text_format}}},
      {"tool_choice", "none"},
      {"tools", json::array()},
      {"top_p", options_.top_p},
      {"truncation", "disabled"},
      {"usage", std::move(usage)},
      {"metadata", options_.metadata.is_null() ? json::object() : options_.metadata}};
}

std::string ResponsesJob::Event(const std::string& type, json data) const {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return absl::StrCat("event: ", type, "\n", SseEvent(data));
}

std::string ResponsesJob::OpeningChunks() {
  json part = TextPart();
  std::string chunks = Event("response.created", {{"response", Response()}});
  absl::StrAppend(&chunks, Event("response.in_progress", {{"response", Response()}}));
  json item = Message();
  item["status"] = "in_progress";
  item["content"] = json::array();
  absl::StrAppend(&chunks,
                  Event("response.output_item.added", {{"output_index", 0}, {"item", item}}));
  part["text"] = "";
  absl::StrAppend(&chunks, Event("response.content_part.added", {{"item_id", item_id_},
                                                                 {"output_index", 0},
                                                                 {"content_index", 0},
                                                                 {"part", std::move(part)}}));
  return chunks;
}

bool ResponsesJob::Drain(absl::Duration timeout, std::string* chunks) {
  const bool got = DrainInner(timeout);
  Store();
  if (chunks == nullptr) return got;
  const std::string& text = inner().choice(0).text;
  if (text.size() > streamed_bytes_) {
    absl::StrAppend(chunks,
                    Event("response.output_text.delta", {{"item_id", item_id_},
                                                         {"output_index", 0},
                                                         {"content_index", 0},
                                                         {"delta", text.substr(streamed_bytes_)},
                                                         {"logprobs", json::array()}}));
    streamed_bytes_ = text.size();
  }
  return got;
}

std::string ResponsesJob::ClosingChunks(const absl::Status& error) const {
  std::string chunks;
  if (!error.ok()) {
    const json body = json::parse(inner().ErrorBody(error), nullptr, false);
    json event = body.is_object() && body.contains("error") ? body["error"] : json::object();
    absl::StrAppend(&chunks, Event("error", std::move(event)));
    absl::StrAppend(&chunks, Event("response.failed", {{"response", Response(/*failed=*/true)}}));
    return chunks;
  }
  const json base = {{"item_id", item_id_}, {"output_index", 0}, {"content_index", 0}};
  json done = base;
  done["text"] = inner().choice(0).text;
  done["logprobs"] = json::array();
  absl::StrAppend(&chunks, Event("response.output_text.done", std::move(done)));
  json part = base;
  part["part"] = TextPart();
  absl::StrAppend(&chunks, Event("response.content_part.done", std::move(part)));
  absl::StrAppend(&chunks,
                  Event("response.output_item.done", {{"output_index", 0}, {"item", Message()}}));
  json response = Response();
  const std::string type =
      response["status"] == "completed" ? "response.completed" : "response.incomplete";
  absl::StrAppend(&chunks, Event(type, {{"response", std::move(response)}}));
  return chunks;
}

std::string ResponsesJob::ResponseBody() const { return DumpJson(Response()); }

}  // namespace mqa
